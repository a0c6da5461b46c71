#!/usr/bin/env python3
"""Whole-process figures of gpunode-agent, each beside its anchor in the same run:

    python3 tests/bench/process_bench.py BUILD_DIR HOST_ROOT

  1. `gpunode-agent version` beside /bin/true: process start (the dynamic loader, static
     initialisers), RUNS each, median;
  2. `gpunode-agent discover --json --host-root HOST_ROOT` beside
     `lspci -nnk -D -A linux-sysfs -O sysfs.path=HOST_ROOT/sys/bus/pci` on the same tree;
  3. an idle agent (the lab's config on the demo host's 8 GPUs: rescan_interval 30 s and unit health
     on, health.interval 30 s, both the defaults) over IDLE_SECONDS: CPU time
     per second and wake-ups per second, summed over its threads from /proc (schedstat in ns,
     context switches), beside prometheus-node-exporter unscraped, measured the same way.

Prints each figure, then SUMMARY lines (tests/bench/summary.py). Not a test: it asserts nothing.
RUNS (default 50) and IDLE_SECONDS (default 60) from the environment.
"""
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "tests", "integration"))

import lab as labmod  # noqa: E402  (tests/integration/lab.py)
import summary  # noqa: E402  (tests/bench/summary.py)

RUNS = int(os.environ.get("RUNS", "50"))
IDLE_SECONDS = float(os.environ.get("IDLE_SECONDS", "60"))  # two health polls and two rescans


def say(*a):
    print(*a, flush=True)


def median_ms(argv, runs=RUNS):
    """Median wall time of `argv` as a whole process, in ms, after one warm-up run."""
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def cpu_and_switches(pid):
    """(CPU ns, context switches) of every thread of `pid` so far."""
    ns = switches = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns += int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                        switches += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return ns, switches


def idle(pid, seconds):
    """(CPU ms per s, wake-ups per s) of `pid` over `seconds`."""
    ns0, sw0 = cpu_and_switches(pid)
    time.sleep(seconds)
    ns1, sw1 = cpu_and_switches(pid)
    return (ns1 - ns0) / 1e6 / seconds, (sw1 - sw0) / seconds


def node_exporter_idle(seconds):
    """prometheus-node-exporter's idle figures, unscraped; or (None, why)."""
    exe = shutil.which("prometheus-node-exporter")
    if not exe:
        return None, "prometheus-node-exporter is not installed (make bench installs it)"
    port = labmod.free_port()
    p = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(2)
        if p.poll() is not None:
            return None, f"prometheus-node-exporter exited ({p.returncode})"
        return idle(p.pid, seconds), None
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGTERM)
            p.wait(10)


def main(argv):
    if len(argv) != 3:
        print(f"usage: {argv[0]} BUILD_DIR HOST_ROOT", file=sys.stderr)
        return 2
    build, root = argv[1], argv[2]
    agent = os.path.join(build, "gpunode-agent")
    say(f"== process bench: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, {RUNS} runs each ==")

    v = median_ms([agent, "version"])
    t = median_ms(["/bin/true"])
    say(f"gpunode-agent version: median {v:.2f} ms; /bin/true: {t:.2f} ms")
    summary.row("`gpunode-agent version`", f"{v:.1f} ms", f"/bin/true: {t:.1f} ms", v / t, "≤ 6 ms", v <= 6)

    d = median_ms([agent, "discover", "--host-root", root, "--json"])
    lspci = shutil.which("lspci") or "/usr/bin/lspci"
    lp = median_ms([lspci, "-nnk", "-D", "-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci"])
    functions = len(os.listdir(os.path.join(root, "sys/bus/pci/devices")))
    say(f"gpunode-agent discover --json ({functions} functions): median {d:.2f} ms; lspci -nnk -D: {lp:.2f} ms")
    summary.row(f"`gpunode-agent discover --json`, {functions} functions", f"{d:.1f} ms",
                f"lspci -nnk -D -A linux-sysfs: {lp:.1f} ms", d / lp, "≤ 0.2", d / lp <= 0.2)

    lab = labmod.Lab(agent)
    try:
        lab.start()
        time.sleep(3)  # start-up's own work (the first scan, the first listing) is not idle
        cpu, wakes = idle(lab.pid, IDLE_SECONDS)
    finally:
        lab.close()
    say(f"idle agent (health on, 8 GPUs) over {IDLE_SECONDS:.0f} s: {cpu:.3f} ms CPU per s, {wakes:.2f} wake-ups per s")
    ne, why = node_exporter_idle(IDLE_SECONDS)
    if ne:
        say(f"prometheus-node-exporter, unscraped, over {IDLE_SECONDS:.0f} s: {ne[0]:.3f} ms CPU per s, {ne[1]:.2f} wake-ups per s")
        anchor = f"prometheus-node-exporter unscraped: {ne[0]:.3f} ms/s, {ne[1]:.2f} wake-ups/s"
    else:
        say(why)
        anchor = why
    summary.row(f"idle CPU, rescan 30 s, health on 30 s, 8 GPUs ({IDLE_SECONDS:.0f} s)", f"{cpu:.3f} ms/s, {wakes:.2f} wake-ups/s", anchor, None,
                "≤ 0.05 ms/s", cpu <= 0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
