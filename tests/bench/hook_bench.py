#!/usr/bin/env python3
"""The libvirt hook's cost per domain start beside /bin/true (CONTRACT §9 "Speed": its whole run,
process start included, at most 5 ms over /bin/true at the median and 20 ms at the 99th percentile).

    python3 tests/bench/hook_bench.py BUILD_DIR

Starts the agent on the demo host the way the integration tests do (tests/integration/lab.py),
then runs each hook RUNS times (default 200) the way libvirt does (a new process with the domain
name, operation, sub-operation and `-` as arguments, the domain XML on stdin) and times it from
spawn to exit:

  1. `/bin/true`: a bare hook, the floor of spawning a process here (the anchor);
  2. `gpunode-agent libvirt-hook -- NAME started begin -`: a call that never asks (every event of
     a domain's life but its start): answered by the executable before any module loads;
  3. `... prepare begin -` with a domain without hostdevs: never asks either (the tag scan);
  4. the same with an on-demand domain on a free GPU unit, against the running agent: an allowed
     start (the hook's module, its settings from the cache, the admin socket, the agent parsing the
     XML and deciding). The settings cache (agent/hook_settings.hpp) is filled by the warm-up runs,
     as it is from the second GPU start after a boot; the first run after a change of agent.yaml
     loads the config reader.

The four run round robin, so that load from elsewhere on a shared machine falls on all alike.
Prints min, median, p99 and max of each, the shared libraries the binary maps, §9's bounds against
this run's /bin/true and the load average, and a SUMMARY line (tests/bench/summary.py). Not a
test: it asserts nothing, and is never run by ctest. RUNS from the environment. The same hook
beside /bin/true while the HTTPS port is flooded is tests/integration/flood_test.py's (make bench
runs it at full size).
"""
import os
import statistics
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "tests", "integration"))
sys.dont_write_bytecode = True

import lab as labmod  # noqa: E402  (tests/integration/lab.py)
import summary  # noqa: E402  (tests/bench/summary.py)
from hook_test import domain_xml  # noqa: E402  (a domain as libvirt hands it to a hook)

RUNS = int(os.environ.get("RUNS", "200"))
MEDIAN_OVER_TRUE_MS, P99_OVER_TRUE_MS = 5.0, 20.0  # CONTRACT §9
ENV = {"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}  # what libvirt passes


def run_once(argv, xml):
    t0 = time.perf_counter()
    p = subprocess.run(argv, input=xml.encode(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    ms = (time.perf_counter() - t0) * 1000
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.decode()[-400:]}")
    return ms


def percentile(ms, q):
    s = sorted(ms)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def libraries(binary):
    p = subprocess.run(["ldd", binary], capture_output=True, text=True)
    libs = [l.split()[0] for l in p.stdout.splitlines() if "=>" in l]
    return len(libs), any(l.startswith("libvirt.so") for l in libs)


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    agent = os.path.abspath(os.path.join(sys.argv[1], "gpunode-agent"))
    n, linked = libraries(agent)
    print(f"hook bench: {RUNS} runs each; {agent} maps {n} shared libraries "
          f"(libvirt {'linked' if linked else 'not linked'})", flush=True)
    with labmod.Lab(agent) as lab:
        lab.write_config(lab.config_text() + "enforcement:\n  mode: enforce\n  when_agent_down: deny\n")
        lab.start()
        hook = [agent, "libvirt-hook", "--config", lab.cfg, "--"]
        plain = domain_xml("bench-plain", ("org-x", "on-demand"))
        gpu = domain_xml("bench-gpu", ("org-x", "on-demand"), ["0000:24:00.0"], uid=str(uuid.uuid4()))
        cases = (("/bin/true (a bare hook)", ["/bin/true", "bench", "prepare", "begin", "-"], plain),
                 ("libvirt-hook, started begin (never asks)", hook + ["bench-gpu", "started", "begin", "-"], gpu),
                 ("libvirt-hook, no hostdev (never asks)", hook + ["bench-plain", "prepare", "begin", "-"], plain),
                 ("libvirt-hook, allowed GPU start (asks the agent)", hook + ["bench-gpu", "prepare", "begin", "-"], gpu))
        for _, argv, xml in cases:  # warm the page cache and the settings cache
            for _ in range(5):
                run_once(argv, xml)
        # Round robin: a burst of load on a shared machine falls on all alike.
        times = [[] for _ in cases]
        for _ in range(RUNS):
            for i, (_, argv, xml) in enumerate(cases):
                times[i].append(run_once(argv, xml))
        lab.stop()
    print(f"\n| hook ({RUNS} runs each, interleaved) | min ms | median ms | p99 ms | max ms | median over /bin/true |\n"
          "| --- | --- | --- | --- | --- | --- |")
    floor_med, floor_p99 = statistics.median(times[0]), percentile(times[0], 99)
    for (label, _, _), ms in zip(cases, times):
        med = statistics.median(ms)
        print(f"| {label} | {min(ms):.2f} | {med:.2f} | {percentile(ms, 99):.2f} | {max(ms):.2f} | {med - floor_med:+.2f} |")
    allowed = times[-1]
    over_med, over_p99 = statistics.median(allowed) - floor_med, percentile(allowed, 99) - floor_p99
    met = over_med <= MEDIAN_OVER_TRUE_MS and over_p99 <= P99_OVER_TRUE_MS
    print(f"\nallowed start: median {statistics.median(allowed):.2f} ms ({over_med:+.2f} ms over /bin/true, "
          f"bound +{MEDIAN_OVER_TRUE_MS:.0f}), p99 {percentile(allowed, 99):.2f} ms ({over_p99:+.2f} ms over /bin/true's p99, "
          f"bound +{P99_OVER_TRUE_MS:.0f}): {'met' if met else 'NOT met'}; load average now {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs", flush=True)
    summary.row("libvirt hook, allowed GPU start (median)", f"{statistics.median(allowed):.2f} ms",
                f"/bin/true {floor_med:.2f} ms", round(statistics.median(allowed) / floor_med, 2),
                f"≤ /bin/true + {MEDIAN_OVER_TRUE_MS:.0f} ms (p99 + {P99_OVER_TRUE_MS:.0f} ms)", met)
    return 0


if __name__ == "__main__":
    sys.exit(main())
