#!/usr/bin/env python3
"""The gpunode-agent command line as an operator meets it: exit codes, stdout and stderr.

    cli_test.py AGENT MKHOST HOSTFILE

Prints one line per check and ends with `N passed, M failed`; exit 1 if anything failed."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True   # keep the source tree clean
from checks import Checks  # noqa: E402

AGENT, MKHOST, HOSTFILE = sys.argv[1:4]
check = Checks()


def run(*args):
    p = subprocess.run([AGENT, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


VALID = """node:
  id: node-7f3a
  owner_org: org-acme
  unsellable_units: []
discovery:
  host_root: {root}
  rescan_interval: 30s
api:
  listen: "127.0.0.1:8443"
  tls: {{cert: /etc/gpunode/tls.crt, key: /etc/gpunode/tls.key}}
auth:
  issuer: https://central.example
  audience: gpunode
  keys: [/etc/gpunode/issuer.pub]
state:
  dir: /var/lib/gpunode
"""

with tempfile.TemporaryDirectory(prefix="gpunode-cli-") as tmp:
    root = os.path.join(tmp, "host")
    subprocess.run([sys.executable, MKHOST, HOSTFILE, root], check=True, capture_output=True)

    def write(name, text):
        path = os.path.join(tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    rc, out, err = run("version")
    check("version", rc == 0 and out.startswith("gpunode-agent "), (rc, out, err))

    rc, out, err = run("no-such-command")
    check("an unknown command is a usage error (exit 2)", rc == 2 and err, (rc, out, err))
    rc, out, err = run("check-config")
    check("check-config without --config is a usage error (exit 2)", rc == 2 and "--config" in err, (rc, err))

    good = write("good.yaml", VALID.format(root=root))
    rc, out, err = run("check-config", "--config", good)
    check("check-config on a valid file: exit 0, nothing on stderr", rc == 0 and err == "", (rc, out, err))

    bad = write("bad.yaml", VALID.format(root=root).replace("  rescan_interval: 30s", "  rescan_interval: 30\n  colour: red"))
    rc, out, err = run("check-config", "--config", bad)
    lines = err.strip().splitlines()
    check("check-config reports every problem as FILE:LINE:COLUMN (value column, key column)",
          rc == 1 and len(lines) == 2 and lines[0].startswith(f"{bad}:7:20: ") and lines[1].startswith(f"{bad}:8:3: "),
          (rc, err))

    discover_only = write("discover.yaml", f"discovery:\n  host_root: {root}\n")
    rc, out, err = run("check-config", "--config", discover_only)
    check("check-config validates for run: node.id and node.owner_org are required",
          rc == 1 and f'{discover_only}:1:1: missing required key "node.id"' in err and
          f'{discover_only}:1:1: missing required key "node.owner_org"' in err, (rc, err))

    rc, out, err = run("discover", "--config", discover_only, "--json")
    body = json.loads(out) if rc == 0 else {}
    check("discover takes host_root from the config and needs no node section", rc == 0 and len(body.get("units", [])) > 0,
          (rc, err[-300:]))
    check("discover without node.id reports the host name as nodeId", body.get("nodeId") == os.uname().nodename,
          body.get("nodeId"))

    rc, out, err = run("discover", "--config", bad, "--json")
    check("discover refuses an invalid config with its problems (exit 1)", rc == 1 and f"{bad}:7:20:" in err and out == "",
          (rc, out[:100], err))

    # CONTRACT §7 "The host root": a mistyped root must never look like a host whose GPUs all
    # went away; a PCI bus without a GPU is a host.
    nowhere = os.path.join(tmp, "nowhere")
    hint = "does not exist: is discovery.host_root (or --host-root) the host's root?"
    rc, out, err = run("discover", "--config", good, "--host-root", nowhere, "--json")
    check("--host-root overrides the config; a root without sys/bus/pci: exit 1, the path named, nothing on stdout",
          rc == 1 and out == "" and f"{nowhere}/sys/bus/pci {hint}" in err, (rc, out, err))
    rc, out, err = run("discover", "--host-root", nowhere)
    check("the table refuses a wrong root the same way", rc == 1 and out == "" and f"{nowhere}/sys/bus/pci {hint}" in err,
          (rc, out, err))
    no_bus = os.path.join(tmp, "no-bus")
    os.makedirs(os.path.join(no_bus, "sys", "kernel", "iommu_groups"))
    os.makedirs(os.path.join(no_bus, "proc"))
    wrong_root = write("wrong-root.yaml", f"discovery:\n  host_root: {no_bus}\n")
    rc, out, err = run("discover", "--config", wrong_root, "--json")
    check("discovery.host_root from the config without sys/bus/pci: exit 1, the path named",
          rc == 1 and out == "" and f"{no_bus}/sys/bus/pci {hint}" in err, (rc, out, err))
    bus_only = os.path.join(tmp, "bus-only")
    os.makedirs(os.path.join(bus_only, "sys", "bus", "pci", "devices"))
    rc, out, err = run("discover", "--config", good, "--host-root", bus_only, "--json")
    check("a PCI bus without a GPU is a host with no units (exit 0)",
          rc == 0 and json.loads(out) == {"nodeId": "node-7f3a", "units": []}, (rc, out, err))

    rc, out, err = run("discover", "--host-root", root)
    check("the table names the units and says how many are reservable", rc == 0 and "u-0000-" in out and
          "reservable" in out, (rc, out[:200]))

check.finish()
