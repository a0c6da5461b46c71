#!/usr/bin/env python3
"""The packaged libvirt hook in a real libvirtd (CONTRACT §9): the private QEMU/KVM daemon of
libvirtd_test.py (its own mount and PID namespaces, nothing global touched) with
packaging/libvirt/50-gpunode in its hooks directory (<etc>/hooks/qemu.d/50-gpunode, the shipped
script with the build's binary and `--socket`/`--config` of a test agent on the demo host), in
place before libvirtd starts, as libvirt wants.

What libvirt checks before the hook: nothing about a PCI hostdev's host device. libvirt runs
`prepare begin` from qemuProcessInit() (src/qemu/qemu_process.c), before qemuProcessPrepareDomain()
and qemuProcessPrepareHost(), whose qemuHostdevPrepareDomainDevices() is where the device is first
looked up in sysfs. So a domain naming a GPU of the agent's fixture host (absent on this machine)
reaches the hook here:

  - refused: on-demand on 43:00.0, a unit of an active reservation: `virsh start` fails with the
    hook's line (`gpunode: domain NAME refused: UNIT: unit-reserved: ...`), the domain stays shut
    off, and the agent has a workload.refused event for it (it was asked);
  - allowed: on-demand on 24:00.0, a free unit: the hook lets it through; the start then fails in
    libvirt's own host-device preparation (no such device here), not in the hook, and the agent
    holds the domain on its unit (a create on 24 is 409 unit-occupied naming it): it was asked and
    said yes;
  - a domain without hostdevs starts and runs (the hook exits 0 without asking), also with the
    agent stopped; with the agent stopped (when_agent_down: deny) the GPU domain is refused with
    `gpunode: agent unreachable at SOCKET: ...`.

Skips (exit 77) exactly when libvirtd_test.py does: not root, libvirtd/virsh/QEMU/the QEMU driver
missing, or the private daemon cannot be started; never for want of KVM (TCG then).

    python3 tests/integration/libvirtd_hook_test.py build/release/gpunode-agent
"""
import json
import os
import signal
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab as L  # noqa: E402
import libvirtd_test as V  # noqa: E402
from hook_test import refused_events  # noqa: E402

SKIP = 77
HOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "packaging", "libvirt", "50-gpunode")
U24, U43 = "u-0000-24-00-0", "u-0000-43-00-0"
REFUSED, ALLOWED, PLAIN = "gpunode-hook-refused", "gpunode-hook-allowed", "gpunode-hook-plain"


def gpu_domain(name, kind, bus):
    """V.domain_xml's tiny guest with one managed PCI hostdev at 0000:BUS:00.0 and an on-demand
    label of org-x."""
    x = V.domain_xml(name, f"vm-{name}", "on-demand", kind).replace(f'org="{V.TENANT}"', 'org="org-x"')
    dev = (f"<hostdev mode='subsystem' type='pci' managed='yes'><source>"
           f"<address domain='0x0000' bus='0x{bus}' slot='0x00' function='0x0'/></source></hostdev>\n    ")
    return x.replace("<memballoon model='none'/>", dev + "<memballoon model='none'/>")


def install_hook(daemon, agent, lab):
    """The shipped hook, naming the build's binary and the test agent's socket and config."""
    with open(HOOK) as f:
        text = f.read()
    assert "exec /usr/bin/gpunode-agent libvirt-hook -- \"$@\"" in text, "the shipped hook changed its exec line"
    text = (text.replace("/usr/bin/gpunode-agent libvirt-hook --", f"{agent} libvirt-hook --socket {lab.sock} --config {lab.cfg} --")
            .replace("/usr/bin/gpunode-agent", agent))
    d = os.path.join(daemon.dir, "etc", "hooks", "qemu.d")
    os.makedirs(d)
    path = os.path.join(d, "50-gpunode")
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def refused_names(lab):
    return [(e.get("data") or {}).get("name") for e in refused_events(lab)]


def define(daemon, name, xml):
    path = os.path.join(daemon.dir, f"{name}.xml")
    with open(path, "w") as f:
        f.write(xml)
    daemon.virsh("define", path)


def start(daemon, name):
    t0 = time.monotonic()
    r = daemon.virsh("start", name, check=False)
    return r.returncode, r.stderr.strip(), time.monotonic() - t0


def body(c, agent, daemon, lab):
    admin = lab.admin()
    r = lab.create(admin, unitIds=[U43], audienceOrgIds=["org-aud"], endsAt=L.rfc3339(time.time() + 86400))
    c.status("a reservation of 43 for org-aud (HTTPS)", r, 201)

    # KVM if a guest can start here, else TCG (as libvirtd_test.py does); TCG at once without /dev/kvm.
    kind = V.guest_kinds()[0]
    define(daemon, PLAIN, V.domain_xml(PLAIN, "vm-plain", "on-demand", kind))
    rc, err, took = start(daemon, PLAIN)
    if rc != 0 and "gpunode" not in err and kind == "kvm":
        print(f"# KVM guests cannot start here ({err}); falling back to TCG (type='qemu')", flush=True)
        kind = "qemu"
        daemon.virsh("undefine", PLAIN, check=False)
        define(daemon, PLAIN, V.domain_xml(PLAIN, "vm-plain", "on-demand", kind))
        rc, err, took = start(daemon, PLAIN)
    c.eq(f"a domain without hostdevs starts through the hook ({took:.2f}s)", (rc, err), (0, ""))
    c.eq("... and runs", V.domstate(daemon, PLAIN), "running")
    daemon.virsh("destroy", PLAIN)

    define(daemon, REFUSED, gpu_domain(REFUSED, kind, "43"))
    define(daemon, ALLOWED, gpu_domain(ALLOWED, kind, "24"))

    # Refused: virsh start shows the hook's line; the domain does not start; the agent was asked.
    rc, err, took = start(daemon, REFUSED)
    print(f"# virsh start {REFUSED} ({took:.2f}s), exit {rc}, stderr:\n" + "\n".join("#   " + l for l in err.splitlines()),
          flush=True)
    line = f"gpunode: domain {REFUSED} refused: {U43}: unit-reserved: "
    c.check("refused: virsh start fails with the hook's line", rc != 0 and line in err, err)
    c.check("refused: libvirt says it was the hook (prepare begin)",
            "Hook script execution failed" in err and "50-gpunode" in err and "prepare begin" in err, err)
    c.eq("refused: the domain is shut off", V.domstate(daemon, REFUSED), "shut off")
    c.check("refused: the agent has a workload.refused event for it", REFUSED in refused_names(lab), refused_names(lab))

    # Allowed: past the hook; libvirt's own device preparation is what fails on this machine.
    rc, err, took = start(daemon, ALLOWED)
    print(f"# virsh start {ALLOWED} ({took:.2f}s), exit {rc}, stderr:\n" + "\n".join("#   " + l for l in err.splitlines()),
          flush=True)
    c.check("allowed: not refused by the hook (no gpunode line, no hook failure)",
            "gpunode:" not in err and "Hook script" not in err, err)
    present = os.path.exists("/sys/bus/pci/devices/0000:24:00.0")
    if not present:
        c.check("allowed: the start fails later, in libvirt's host-device preparation (no 0000:24:00.0 here)",
                rc != 0 and V.domstate(daemon, ALLOWED) == "shut off", (rc, err))
    r = lab.create(admin, unitIds=[U24], audienceOrgIds=["org-aud"], endsAt=L.rfc3339(time.time() + 86400))
    c.problem("allowed: the agent said yes and holds it on 24 (a create on 24: 409 unit-occupied)", r, 409, "unit-occupied")
    c.check("... naming the domain libvirt started", ALLOWED in json.dumps(r.json), r)
    c.check("allowed: no workload.refused event for it", ALLOWED not in refused_names(lab), refused_names(lab))

    # The agent stopped, when_agent_down: deny.
    rc_stop, _ = lab.stop()
    c.eq("the agent stops", rc_stop, 0)
    rc, err, _ = start(daemon, ALLOWED)
    print(f"# virsh start {ALLOWED}, agent stopped, exit {rc}: {err.splitlines()[-1] if err else ''}", flush=True)
    c.check("agent down (deny): virsh start fails with `gpunode: agent unreachable at SOCKET: why`",
            rc != 0 and f"gpunode: agent unreachable at {lab.sock}: " in err, err)
    rc, err, _ = start(daemon, PLAIN)
    c.eq("agent down: a domain without hostdevs still starts (never asks)", (rc, err), (0, ""))
    daemon.virsh("destroy", PLAIN, check=False)


def main():
    if len(sys.argv) < 2:
        print(f"usage: {sys.argv[0]} PATH/TO/gpunode-agent", file=sys.stderr)
        return 2
    agent = os.path.abspath(sys.argv[1])
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    c = L.Checks("libvirtd-hook")
    daemon = None
    try:
        with L.Lab(agent) as lab:
            lab.write_config(lab.config_text() + "enforcement:\n  mode: enforce\n  when_agent_down: deny\n")
            try:
                daemon = V.Libvirtd(V.preflight())
                install_hook(daemon, agent, lab)  # before libvirtd starts: it looks for hooks then
                daemon.start()
            except V.Skip as e:
                print(f"SKIP: {e}", flush=True)
                return SKIP
            lab.start()
            try:
                body(c, agent, daemon, lab)
            except Exception as e:  # a crash of the test itself is one failed check
                import traceback
                traceback.print_exc()
                c.check("libvirtd hook test ran to the end", False, f"{type(e).__name__}: {e}")
                print("# libvirtd log tail:\n" + daemon.tail(), flush=True)
    finally:
        if daemon is not None:
            daemon.close()
    if daemon is not None:
        c.check("no process of the private libvirtd is left", not daemon.leftovers(), daemon.leftovers())
    print(f"# {time.monotonic() - t0:.1f}s", flush=True)
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())
