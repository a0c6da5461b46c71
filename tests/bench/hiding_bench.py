#!/usr/bin/env python3
"""Hiding includes time (CONTRACT §10): a hidden resource and a missing one take the same work.

    python3 tests/bench/hiding_bench.py BUILD_DIR

Sets up a lab as the integration tests do (the demo host, TLS, a token issuer), with RESERVATIONS
(default 400) scheduled reservations on the node, a live and an ended reservation of org-hidden,
and one live reservation of org-seer (which sees the node through it). Then, with
BUILD_DIR/tests/bench/api_bench's `pairs` mode (one keep-alive TLS connection, the two requests of
each pair in a random order, PAIRS pairs, default 2000, after 200 pairs of warm-up):

  1. an outsider (org-outsider) asks GET /v1/nodes/THIS-NODE/units and GET /v1/nodes/NOT-A-NODE/units;
  2. org-seer asks GET .../reservations/{the live one of org-hidden} and .../reservations/{an id
     that does not exist};
  3. org-seer asks GET .../reservations/{the ended one of org-hidden} and the same missing id.

All answers are 404, byte for byte the same. For each pair it prints both medians, the median of
the paired differences and how often the first was the slower, and a SUMMARY row against the
contract's 5 µs. Not a test: nothing is asserted but the statuses, and ctest never runs it.
"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "tests", "integration"))

import lab as labmod  # noqa: E402  (tests/integration/lab.py)
import summary  # noqa: E402  (tests/bench/summary.py)

RESERVATIONS = int(os.environ.get("RESERVATIONS", "400"))
PAIRS = int(os.environ.get("PAIRS", "2000"))
BOUND_US = 5.0
MISSING = "rsv_0000000000000000000000000000"


def say(text):
    print(text, flush=True)


def populate(lab):
    """RESERVATIONS scheduled terms, two days apart per unit; org-hidden's live and ended ones; org-seer's."""
    units = labmod.RESERVABLE
    base = time.time() + 86400 * 30
    for i in range(RESERVATIONS):
        unit, slot = units[i % len(units)], i // len(units)
        start = base + slot * 2 * 86400
        r = lab.create(None, unitIds=[unit], audienceOrgIds=[f"org-a{i % 37}"], managingOrgIds=[f"org-m{i % 11}"],
                       startsAt=labmod.rfc3339(start), endsAt=labmod.rfc3339(start + 3600))
        if r.status != 201:
            raise RuntimeError(f"create {i}: {r!r}")
    now = time.time()
    live = lab.create(None, unitIds=[units[0]], audienceOrgIds=["org-hidden"], startsAt=labmod.rfc3339(now),
                      endsAt=labmod.rfc3339(now + 86400 * 20)).json["id"]
    ended = lab.create(None, unitIds=[units[1]], audienceOrgIds=["org-hidden"], startsAt=labmod.rfc3339(now),
                       endsAt=labmod.rfc3339(now + 86400 * 20)).json["id"]
    r = lab.call("POST", lab.npath(f"/reservations/{ended}/end"), body={"reason": "bench"}, unix=True)
    if r.status != 200:
        raise RuntimeError(f"end: {r!r}")
    lab.create(None, unitIds=[units[2]], audienceOrgIds=["org-seer"], startsAt=labmod.rfc3339(now),
               endsAt=labmod.rfc3339(now + 86400 * 20))
    return live, ended


def pairs(client, lab, org, path_a, path_b):
    token_file = os.path.join(lab.dir, f"{org}.token")
    with open(token_file, "w") as f:
        f.write(lab.token(org))
    p = subprocess.run([client, "pairs", "--port", str(lab.port), "--ca", f"{lab.dir}/tls.crt", "--token-file",
                        token_file, "--path-a", path_a, "--path-b", path_b, "--pairs", str(PAIRS)],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"api_bench pairs: {p.stderr.strip()}")
    return json.loads(p.stdout)


def report(figure, what_a, what_b, r):
    a, b, d = r["a"]["p50_us"], r["b"]["p50_us"], r["diff_p50_us"]
    say(f"{figure}: {r['pairs']} pairs on one connection")
    say(f"  {what_a}: p50 {a:.1f} µs  p99 {r['a']['p99_us']:.1f} µs")
    say(f"  {what_b}: p50 {b:.1f} µs  p99 {r['b']['p99_us']:.1f} µs")
    say(f"  medians differ by {a - b:+.1f} µs; median paired difference {d:+.1f} µs; the first slower in "
        f"{100 * r['a_slower']:.0f}% of pairs (the bound: {BOUND_US:.0f} µs)")
    summary.row(figure, f"{what_a} p50 {a:.1f} µs", f"{what_b} p50 {b:.1f} µs", None,
                f"|Δ medians| < {BOUND_US:.0f} µs", abs(a - b) < BOUND_US)


def main(argv):
    if len(argv) != 2:
        print(f"usage: {argv[0]} BUILD_DIR", file=sys.stderr)
        return 2
    build = os.path.abspath(argv[1])
    agent, client = os.path.join(build, "gpunode-agent"), os.path.join(build, "tests", "bench", "api_bench")
    say(f"== hiding bench: {RESERVATIONS} scheduled reservations on the node, {PAIRS} pairs per case ==")
    lab = labmod.Lab(agent)
    try:
        lab.write_config(lab.config_text(log_level="warning"))
        lab.start()
        live, ended = populate(lab)
        units = lab.npath("/units")
        report("outsider GET units: this node vs a made-up node id", "this node", "made-up node id",
               pairs(client, lab, "org-outsider", units, lab.npath("/units", node="node-made-up-0")))
        report("hidden live reservation vs a missing id", "hidden live", "missing",
               pairs(client, lab, "org-seer", lab.npath(f"/reservations/{live}"), lab.npath(f"/reservations/{MISSING}")))
        report("hidden ended reservation vs a missing id", "hidden ended", "missing",
               pairs(client, lab, "org-seer", lab.npath(f"/reservations/{ended}"), lab.npath(f"/reservations/{MISSING}")))
        lab.stop()
    finally:
        lab.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
