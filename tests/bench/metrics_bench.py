#!/usr/bin/env python3
"""The reporting and polling bench: how fast a backlog drains to the central API, what it costs in
memory, and what a long poll that finds nothing new costs beside a full state answer.

    python3 tests/bench/metrics_bench.py BUILD_DIR

Sets up a lab the way the integration tests do (tests/integration/lab.py) and the fake central API
of the reporting tests (tests/central/fake_central.py: Python, real mTLS, every event checked and
stored), then:

  1. a backlog of BACKLOG (10,000) events: the agent is started once and makes a reservation
     (its reservation.created event, ~1 KiB, is the model), stopped, and the outbox table is
     filled with BACKLOG copies of that event (dense seqs, fresh ids) in one transaction: what an
     outage of the central API would have left. The agent starts again with the central API down;
     after SETTLE s its RSS is the idle figure. The API comes up; from the first events request to
     the last acknowledgement is the drain, events/s (target >= 5,000/s); RSS is sampled every
     5 ms meanwhile (target: peak - idle <= 4 MiB). /metrics over metrics.listen is read before and
     after (outbox depth, acked seq).
  2. GET /v1/nodes/{node}/state over TLS with keep-alive (tests/bench/api_bench, the C++ client):
     the full answer, and `?after=REV&wait=0s` at the current revision (304, no body): p50/p99 on
     one connection, requests/s from CONNS connections, and the agent's CPU time per request
     (utime+stime from /proc over the whole run). Target: a 304 costs <= 1/10 of a full answer.
     Done on the demo host as it is, and again after CREATES reservations.

Loopback only; bounded counts; about half a minute. Not a test: it asserts nothing beyond every
answer having the expected status, and is never run by ctest. Counts: BACKLOG, CREATES, REQUESTS,
CONNS, PER_CONN (environment).
"""
import json
import os
import sqlite3
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "tests", "integration"))
sys.path.insert(0, HERE)

import lab as labmod  # noqa: E402  (tests/integration/lab.py)
from api_bench import binaries, env_int, mib, proc_status, run_client, say  # noqa: E402  (the API bench's helpers)

BACKLOG = env_int("BACKLOG", 10000)
CREATES = env_int("CREATES", 300)
REQUESTS = env_int("REQUESTS", 2000)
CONNS = env_int("CONNS", 4)
PER_CONN = env_int("PER_CONN", 2000)
SETTLE = 2.0
UNIT = labmod.VFIO_UNITS[0]


def cpu_seconds(pid):
    """utime + stime of a process, in seconds (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port):
    """{name: value} of the unlabelled samples of /metrics on metrics.listen."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, v = line.partition(" ")
            out[name] = float(v)
    return out


def fill_outbox(state_dir, n):
    """Appends n copies of the newest reservation.created event to the outbox (dense seqs after the
    last, fresh ids), and moves the service's event counter with them. Returns (first, last, bytes)."""
    db = sqlite3.connect(os.path.join(state_dir, "state.db"))
    try:
        rows = db.execute("SELECT seq, event FROM outbox ORDER BY seq").fetchall()
        model = next(json.loads(e) for _, e in reversed(rows) if json.loads(e)["type"] == "reservation.created")
        (counter,) = db.execute("SELECT value FROM meta WHERE key = 'event_seq'").fetchone()
        first = int(counter) + 1
        batch, size = [], 0
        for seq in range(first, first + n):
            e = dict(model, seq=seq, id=f"evt_bench{seq:021d}")
            text = json.dumps(e, separators=(",", ":"))
            size += len(text)
            batch.append((seq, text))
        with db:
            db.executemany("INSERT INTO outbox (seq, event) VALUES (?, ?)", batch)
            db.execute("UPDATE meta SET value = ? WHERE key = 'event_seq'", (str(first + n - 1),))
        return first, first + n - 1, size
    finally:
        db.close()


def drain(lab):
    metrics_port = labmod.free_port()
    # 1a. the model event, then the backlog
    lab.write_config(lab.config_text())
    lab.start()
    r = lab.create(lab.admin(), unitIds=[UNIT], audienceOrgIds=["org-bench"], endsAt=labmod.rfc3339(time.time() + 86400))
    if r.status != 201:
        raise RuntimeError(f"create failed: {r!r}")
    lab.stop()
    first, last, size = fill_outbox(lab.state, BACKLOG)
    say(f"outbox: {BACKLOG} events added (seq {first}..{last}, {size / BACKLOG:.0f} B each, {size / 1048576:.1f} MiB)")

    fc = lab.fake_central()
    try:
        fc.down()
        lab.write_config(lab.config_text(central=lab.central_text(fc.url, heartbeat="30s"),
                                         metrics_listen=f"127.0.0.1:{metrics_port}"))
        lab.start()
        pid = lab.pid
        time.sleep(SETTLE)
        idle = proc_status(pid)
        m0 = scrape(metrics_port)
        say(f"agent pid {pid}, central API down: outbox {m0['gpunode_outbox_events']:.0f} events, "
            f"idle VmRSS {mib(idle['VmRSS'])} (anon {mib(idle['RssAnon'])})")
        t_up = time.time()
        fc.up()
        peak, peak_anon, samples = idle["VmRSS"], idle["RssAnon"], 0
        deadline = time.time() + 300
        while fc.acked() < last and time.time() < deadline:
            s = proc_status(pid)
            peak, peak_anon, samples = max(peak, s["VmRSS"]), max(peak_anon, s["RssAnon"]), samples + 1
            time.sleep(0.005)
        if fc.acked() < last:
            raise RuntimeError(f"not drained within 300 s: acked {fc.acked()} of {last}")
        with fc.lock:
            t_first = min(t for t, _, _ in fc.attempts if t >= t_up)
            t_last = fc.batches[-1][0]
            batches = sum(1 for t, _, _ in fc.batches if t >= t_up)
            problems = list(fc.problems)
            duplicates = len(fc.arrivals) - len(set(fc.arrivals))
        took = t_last - t_first
        time.sleep(SETTLE)
        after = proc_status(pid)
        m1 = scrape(metrics_port)
        rate = (last - first + 1) / took
        say(f"drained {last - first + 1} events in {took:.3f} s ({batches} batches; the API came up {t_first - t_up:.2f} s "
            f"before the first request: the agent's backoff): {rate:,.0f} events/s")
        say(f"  RSS: idle {mib(idle['VmRSS'])} -> peak during the drain {mib(peak)} ({samples} samples) = "
            f"+{(peak - idle['VmRSS']) / 1024:.2f} MiB (anon +{(peak_anon - idle['RssAnon']) / 1024:.2f} MiB); "
            f"{mib(after['VmRSS'])} {SETTLE:.0f} s after")
        say(f"  /metrics: outbox {m0['gpunode_outbox_events']:.0f} -> {m1['gpunode_outbox_events']:.0f} events, "
            f"acked seq {m0['gpunode_central_acked_seq']:.0f} -> {m1['gpunode_central_acked_seq']:.0f}; "
            f"{duplicates} events seen twice; fake central problems: {problems[:3] or 'none'}")
        return {"rate": rate, "seconds": took, "idle": idle, "peak": peak, "peak_anon": peak_anon, "after": after,
                "events": last - first + 1, "bytes": size}
    finally:
        fc.close()


def state_costs(lab, client, label):
    """(full, not_modified) GET state results with the agent's CPU per request."""
    token_file = os.path.join(lab.dir, "admin.token")
    with open(token_file, "w") as f:
        f.write(lab.admin())
    ca = f"{lab.dir}/tls.crt"
    path = lab.npath("/state")
    rev = lab.get(path, lab.admin()).json["revision"]
    out = []
    for p, status in ((path, 200), (f"{path}?after={rev}&wait=0s", 304)):
        c0 = cpu_seconds(lab.pid)
        r = run_client(client, "get", "--port", lab.port, "--ca", ca, "--path", p, "--token-file", token_file,
                       "--requests", REQUESTS, "--conns", CONNS, "--per-conn", PER_CONN, "--status", status)
        n = 200 + REQUESTS + CONNS * (20 + PER_CONN)  # warm-up, one connection, the loaded run
        r["cpu_us"] = (cpu_seconds(lab.pid) - c0) / n * 1e6
        o, lo = r["one_conn"], r["loaded"]
        say(f"{label}: GET {p.replace(lab.npath(''), '.../' + labmod.NODE)} -> {status}, {r['body_bytes']} B body: "
            f"p50 {o['p50_us']:.0f} µs  p99 {o['p99_us']:.0f} µs; {CONNS} conns {r['rps']:,.0f} req/s "
            f"(p50 {lo['p50_us']:.0f} µs); agent CPU {r['cpu_us']:.1f} µs/request")
        out.append(r)
    return out


def main():
    found = binaries(sys.argv)
    if isinstance(found, int):
        return found
    _, agent, client = found
    t_start = time.time()
    say(f"== Reporting and polling bench: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} ==")
    lab = labmod.Lab(agent)
    try:
        d = drain(lab)
        small = state_costs(lab, client, "demo host")
        token_file = os.path.join(lab.dir, "admin.token")
        p = run_client(client, "post", "--port", lab.port, "--ca", f"{lab.dir}/tls.crt", "--path", lab.npath("/reservations"),
                       "--token-file", token_file, "--unit", labmod.VFIO_UNITS[1], "--requests", CREATES)
        say(f"{p['create']['n']} reservations created")
        big = state_costs(lab, client, f"+{CREATES} reservations")
        lab.stop()
    finally:
        lab.close()

    rows = [
        (f"drain of {d['events']:,} events (~{d['bytes'] / d['events']:.0f} B each)", f"{d['rate']:,.0f} events/s",
         f"{d['seconds']:.3f} s; target >= 5,000 events/s: {'met' if d['rate'] >= 5000 else 'NOT met'}"),
        ("agent RSS: idle with the backlog / peak while draining", f"{mib(d['idle']['VmRSS'])} / {mib(d['peak'])}",
         f"+{(d['peak'] - d['idle']['VmRSS']) / 1024:.2f} MiB (anon +{(d['peak_anon'] - d['idle']['RssAnon']) / 1024:.2f} MiB); "
         f"target <= +4 MiB: {'met' if d['peak'] - d['idle']['VmRSS'] <= 4096 else 'NOT met'}"),
    ]
    for label, (full, nm) in (("demo host", small), (f"+{CREATES} reservations", big)):
        lat = nm["one_conn"]["p50_us"] / full["one_conn"]["p50_us"]
        cpu = nm["cpu_us"] / full["cpu_us"] if full["cpu_us"] else float("nan")
        rows.append((f"GET state ({label}): full / 304, p50", f"{full['one_conn']['p50_us']:.0f} / {nm['one_conn']['p50_us']:.0f} µs",
                     f"304 = {lat:.3f}x a full answer ({full['body_bytes']:,} B body)"))
        rows.append((f"GET state ({label}): full / 304, agent CPU", f"{full['cpu_us']:.1f} / {nm['cpu_us']:.1f} µs/request",
                     f"304 = {cpu:.3f}x; target <= 0.1: {'met' if cpu <= 0.1 else 'NOT met'}"))
        rows.append((f"GET state ({label}): full / 304, {CONNS} conns", f"{full['rps']:,.0f} / {nm['rps']:,.0f} req/s",
                     f"{nm['rps'] / full['rps']:.1f}x the requests per second"))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    say("")
    for a, b, r in rows:
        say(f"{a:<{w0}}  {b:<{w1}}  {r}")
    say(f"({time.time() - t_start:.0f} s in all; load average {os.getloadavg()[0]:.2f} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
