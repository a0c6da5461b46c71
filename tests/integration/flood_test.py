#!/usr/bin/env python3
"""A flooded port (CONTRACT §10), bounded to seconds for `make test`; `make bench` runs the full
size (FLOOD_IDLE=10000 FLOOD_HANDSHAKES=1000).

One client address (127.0.0.1) holds FLOOD_IDLE idle TCP connections (no TLS) and FLOOD_HANDSHAKES
stalled TLS handshakes (a record header and nothing more) to the HTTPS port, with the default caps
(4096 in all, 256 per client address). Meanwhile, each timed:
- the libvirt hook asks about an allowed GPU start (§9's speed: within 5 ms of /bin/true at the
  median and 20 ms at p99, measured side by side; quiet first, then flooded);
- `gpunodectl status` answers over the admin socket (served apart, its own budget and thread);
- a scheduler from another address (127.0.0.2) gets `GET units` within 1 s;
- the agent logs its refusals at most once a minute, with a count; after the flood it serves on.

Usage: flood_test.py PATH/TO/gpunode-agent [PATH/TO/gpunodectl]
"""
import http.client
import os
import resource
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import lab as L  # noqa: E402
import hook_test as H  # noqa: E402

IDLE = int(os.environ.get("FLOOD_IDLE", "1500"))
HANDSHAKES = int(os.environ.get("FLOOD_HANDSHAKES", "300"))
RUNS = int(os.environ.get("FLOOD_HOOK_RUNS", "60"))
# Sanitizer builds (tests/integration/CMakeLists.txt) run several tests at a time at a fraction of
# the speed: there the timings are printed, not held to their bounds (release builds hold them).
STRICT_TIMING = os.environ.get("GPUNODE_FLOOD_TIMING") != "report"


def timely(cond):
    return cond or not STRICT_TIMING
# A TLS record header announcing a ClientHello that never comes: the server waits in its handshake.
STALLED_HELLO = bytes([0x16, 0x03, 0x01, 0x02, 0x00])


def percentile(xs, p):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def timed(cmd, stdin=None, env=None):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=30, env=env)
    return (time.perf_counter() - t0) * 1000, p


def hook_vs_true(agent, lab, xml, runs):
    """Round robin: /bin/true, the hook on an allowed GPU start. Returns (true_ms, hook_ms, failures)."""
    env = {"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    hook = [agent, "libvirt-hook", "--config", lab.cfg, "--", "flood-vm", "prepare", "begin", "-"]
    true_ms, hook_ms, failures = [], [], []
    for _ in range(runs):
        ms, _ = timed(["/bin/true", "flood-vm", "prepare", "begin", "-"], xml, env)
        true_ms.append(ms)
        ms, p = timed(hook, xml, env)
        hook_ms.append(ms)
        if p.returncode != 0:
            failures.append(p.stderr.strip())
    return true_ms, hook_ms, failures


def flood(port):
    """IDLE idle connections and HANDSHAKES stalled handshakes from 127.0.0.1; returns (sockets, refused)."""
    held, refused = [], 0
    for i in range(IDLE + HANDSHAKES):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(True)
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
            if i >= IDLE:
                s.send(STALLED_HELLO)
        except OSError:
            refused += 1
            s.close()
            continue
        held.append(s)
    return held, refused


def closed_by_agent(sockets):
    """How many of the flood's sockets the agent has closed (a read sees EOF or a reset)."""
    n = 0
    for s in sockets:
        s.setblocking(False)
        try:
            if s.recv(1) == b"":
                n += 1
        except BlockingIOError:
            pass
        except OSError:
            n += 1
    return n


def scheduler_get(lab, path, token):
    c = http.client.HTTPSConnection("127.0.0.1", lab.port, context=lab.ctx, timeout=10, source_address=("127.0.0.2", 0))
    t0 = time.perf_counter()
    try:
        c.request("GET", path, headers={"Authorization": "Bearer " + token})
        r = c.getresponse()
        r.read()
        return r.status, (time.perf_counter() - t0) * 1000
    finally:
        c.close()


def body(c, agent):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = IDLE + HANDSHAKES + 512
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, want), hard))
    ctl = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(agent)), "gpunodectl")
    with L.Lab(agent) as lab:
        lab.write_config(H.config_text(lab))
        lab.start()
        admin = lab.admin()
        xml = H.domain_xml("flood-vm", (H.OUTSIDER, "on-demand"), H.GPU[H.U24])
        # The hook's first call reads agent.yaml with the config reader and caches its settings
        # (agent/hook_settings.hpp): time the hook as a node runs it, with its cache filled.
        hook_vs_true(agent, lab, xml, 3)

        quiet_true, quiet_hook, fails = hook_vs_true(agent, lab, xml, RUNS)
        c.eq("quiet: every hook run allowed the start", fails, [])

        t0 = time.monotonic()
        held, refused_connects = flood(lab.port)
        took = time.monotonic() - t0
        # The agent accepts the kernel's queue at its own pace and closes what is past the cap at
        # once: wait (up to 20 s, for a loaded machine) until no more than the cap stays open.
        closed, deadline = 0, time.monotonic() + 20
        while time.monotonic() < deadline:
            closed = closed_by_agent(held)
            if len(held) - closed <= 256:
                break
            time.sleep(0.2)
        print(f"# flood: {len(held)} connections made from 127.0.0.1 in {took:.1f} s ({IDLE} idle, {HANDSHAKES} stalled "
              f"handshakes; {refused_connects} connects failed); {closed} closed at once by the agent", flush=True)
        c.check(f"the per-client cap holds: at most 256 of the flood's connections stay open ({len(held) - closed} do)",
                len(held) - closed <= 256, (len(held), closed))

        flood_true, flood_hook, fails = hook_vs_true(agent, lab, xml, RUNS)
        c.eq("flooded: every hook run allowed the start", fails, [])
        ms, p = timed([ctl, "--socket", lab.sock, "status"])
        c.check(f"flooded: gpunodectl status answers ({ms:.0f} ms)", p.returncode == 0 and L.NODE in p.stdout, p.stderr)
        status, ms = scheduler_get(lab, lab.npath("/units"), admin)
        c.check(f"flooded: a scheduler from 127.0.0.2 gets GET units within 1 s ({ms:.0f} ms)", status == 200 and timely(ms < 1000), status)

        for label, t, h in (("quiet", quiet_true, quiet_hook), ("flooded", flood_true, flood_hook)):
            med = statistics.median(h) - statistics.median(t)
            p99 = percentile(h, 99) - percentile(t, 99)
            print(f"# hook {label}: median {statistics.median(h):.1f} ms (/bin/true {statistics.median(t):.1f} ms), "
                  f"p99 {percentile(h, 99):.1f} ms (/bin/true {percentile(t, 99):.1f} ms), {len(h)} runs each", flush=True)
            # The bound of §9 is checked by `make bench` (tests/bench/hook_bench.py) on a quiet machine; here, where
            # the other tests run alongside, only that the flood adds nothing near the hook's own cost.
            c.check(f"{label}: the hook asks and answers (median over /bin/true {med:.1f} ms, p99 {p99:.1f} ms)",
                    timely(statistics.median(h) < 1000), h[:5])
        c.check("flooding does not slow the hook by more than 20 ms at the median",
                timely(statistics.median(flood_hook) - statistics.median(quiet_hook) < 20), (quiet_hook[:5], flood_hook[:5]))

        lines = [l for l in lab.log().splitlines() if "connections refused:" in l]
        c.check(f"the refusals are logged once (a minute's window), with a count: {lines[:1]}",
                len(lines) == 1 and "api.max_connections_per_client" in lines[0], lines)

        for s in held:
            s.close()
        status, ms = scheduler_get(lab, lab.npath("/units"), admin)
        c.check(f"after the flood: GET units from 127.0.0.2 ({ms:.0f} ms)", status == 200, status)
        r = lab.get(lab.npath("/units"), admin)
        c.status("after the flood: GET units from 127.0.0.1 again", r, 200)
        rc, _ = lab.stop()
        c.eq("SIGTERM after the flood: exit 0", rc, 0)


if __name__ == "__main__":
    sys.exit(L.run_main("flood", body))
