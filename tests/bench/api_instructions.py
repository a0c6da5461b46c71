#!/usr/bin/env python3
"""Instructions per GET units request: the agent beside nginx, counted by Valgrind's callgrind.

    python3 tests/bench/api_instructions.py BUILD_DIR

Requests per second on a shared 2-core machine move with everything else on it (nginx alone moves
by a factor of two between runs: docs/benchmarks.md), so api_bench.py's ratio needs many bracketed
runs to say anything. The instructions a server executes per request do not move: this counts
them, for the agent and for nginx serving the same bytes, with the same client, certificate, cipher
and load, so that a change to the request path can be judged by one run.

For each server: start it under `valgrind --tool=callgrind --instr-atstart=no`, warm it up (a
handful of connections and requests), switch counting on (`callgrind_control -i on`), run
tests/bench/api_bench's GET (CONNS connections of PER_CONN keep-alive requests, and 200 on one
more connection), switch counting off and dump. Instructions per request are the dump's total over
the requests; the TLS handshakes of those connections are in both servers' counts alike.

The agent runs on the demo host with its default threads (lab.py's setup, as api_bench.py); nginx
runs one process (`master_process off`), as api_bench.py's one worker. Instructions are not time:
system calls and the kernel's TCP stack are not counted (nginx makes more of them per request:
it opens the file each time). Not a test; never run by ctest. Counts: CONNS (8), PER_CONN (100).
"""
import glob
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "integration"))

import api_bench as ab  # noqa: E402  (the client's arguments, nginx's configuration)
import lab as labmod  # noqa: E402
import summary  # noqa: E402

CONNS = ab.env_int("CONNS", 8)
PER_CONN = ab.env_int("PER_CONN", 100)


def callgrind(out_dir, tag, argv):
    """argv run under callgrind, counting nothing until switched on; its dumps go to out_dir/tag.*."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={out_dir}/{tag}.%p", *argv]


def total_instructions(out_dir, tag, pid):
    """The instructions in the dump taken after the measured run (the file ending .1): its `totals:`
    line (its `summary:` line, at the top, counts only what ran with counting on at its start)."""
    for path in glob.glob(f"{out_dir}/{tag}.{pid}.1"):
        with open(path) as f:
            for line in f:
                if line.startswith("totals:"):
                    return int(line.split()[1])
    raise RuntimeError(f"no callgrind dump with totals for {tag} (pid {pid}) in {out_dir}")


def count(client, pid, args):
    """(requests, instructions) of one measured GET run against the process `pid`."""
    ab.run_client(client, "get", *args(requests=20, conns=2, per_conn=10), timeout=600)  # warm up
    subprocess.run(["callgrind_control", "-i", "on", str(pid)], check=True, capture_output=True)
    r = ab.run_client(client, "get", *args(requests=200, conns=CONNS, per_conn=PER_CONN), timeout=900)
    subprocess.run(["callgrind_control", "-i", "off", str(pid)], check=True, capture_output=True)
    subprocess.run(["callgrind_control", "-d", "measured", str(pid)], check=True, capture_output=True)
    return r["conns"] * r["per_conn"] + r["one_conn"]["n"], r["body_bytes"]


def wait_dump(out_dir, tag, pid, wait=30):
    deadline = time.time() + wait
    while time.time() < deadline:
        if glob.glob(f"{out_dir}/{tag}.{pid}.1"):
            time.sleep(0.5)  # written whole
            return
        time.sleep(0.2)


def main():
    found = ab.binaries(sys.argv)
    if isinstance(found, int):
        return found
    _build, agent, client = found
    for tool in ("valgrind", "callgrind_control"):
        if not shutil.which(tool):
            print(f"api_instructions: {tool} is not installed (apt-get install valgrind)", file=sys.stderr)
            return 1
    lab = labmod.Lab(agent)
    try:
        out = os.path.join(lab.dir, "callgrind")
        os.makedirs(out)
        wrapper = os.path.join(lab.dir, "agent-under-callgrind")
        with open(wrapper, "w") as f:  # lab.py starts `AGENT run --config ...`
            f.write("#!/bin/sh\nexec " + " ".join(callgrind(out, "agent", [agent])) + ' "$@"\n')
        os.chmod(wrapper, 0o755)
        lab.agent = wrapper
        lab.write_config(lab.config_text())
        lab.start(wait=180)
        token = os.path.join(lab.dir, "admin.token")
        with open(token, "w") as f:
            f.write(lab.admin())
        ca, units = f"{lab.dir}/tls.crt", lab.npath("/units")
        body_file = os.path.join(lab.dir, "units.json")
        ab.run_client(client, "get", *ab.get_args(lab.port, ca, units, token, requests=1, conns=1, per_conn=1),
                      "--save-body", body_file, timeout=600)

        def agent_args(**kw):
            return ab.get_args(lab.port, ca, units, token, **kw)

        n, body = count(client, lab.pid, agent_args)
        wait_dump(out, "agent", lab.pid)
        agent_ir = total_instructions(out, "agent", lab.pid) / n
        print(f"gpunode-agent GET units ({body} B): {n} requests, {agent_ir:,.0f} instructions per request",
              flush=True)

        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not os.access(nginx, os.X_OK):
            summary.row("GET units: instructions per request (callgrind)", f"{agent_ir:,.0f}",
                        "nginx: not installed (apt-get install nginx-light)")
            return 0
        d = os.path.join(lab.dir, "nginx")
        os.makedirs(os.path.join(d, "www"))
        os.makedirs(os.path.join(d, "tmp"))
        shutil.copyfile(body_file, os.path.join(d, "www", "units.json"))
        port = labmod.free_port()
        conf = ab.nginx_conf(d, port, f"{lab.dir}/tls.crt", f"{lab.dir}/tls.key")
        with open(os.path.join(d, "nginx.conf"), "w") as f:
            f.write(conf.replace("daemon off;", "daemon off;\nmaster_process off;"))
        ng = subprocess.Popen(callgrind(out, "nginx", [nginx, "-p", d, "-c", os.path.join(d, "nginx.conf")]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            if not ab.wait_port(port, ng, 120):
                raise RuntimeError("nginx under callgrind did not start")

            def nginx_args(**kw):
                return ab.get_args(port, ca, "/units.json", **kw)

            n, _ = count(client, ng.pid, nginx_args)
            wait_dump(out, "nginx", ng.pid)
            nginx_ir = total_instructions(out, "nginx", ng.pid) / n
        finally:
            ng.terminate()
            ng.wait(30)
        version = subprocess.run([nginx, "-v"], capture_output=True, text=True).stderr.strip().split("/")[-1]
        print(f"nginx {version} /units.json, the same bytes: {n} requests, {nginx_ir:,.0f} instructions per request",
              flush=True)
        summary.row(f"GET units ({body} B), keep-alive TLS: instructions per request (callgrind; lower is better)",
                    f"{agent_ir:,.0f}", f"nginx {version}, same bytes: {nginx_ir:,.0f}", agent_ir / nginx_ir,
                    "context")
    finally:
        lab.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
