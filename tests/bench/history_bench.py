#!/usr/bin/env python3
"""History stays on disk (CONTRACT §11): the same agent on the same node, measured without history
and then with HISTORY ended reservations and AUDIT audit records in its state.db.

    python3 tests/bench/history_bench.py BUILD_DIR

Sets up a lab as the integration tests do (tests/integration/lab.py, the demo host), starts the
agent once to make state.db, and measures it (ROUNDS starts each):

  - start-up: exec to the first 200 from /healthz over TLS (polled every 2 ms);
  - VmRSS after start-up and 200 GET states;
  - GET state: its size, and p50 of 200 on one keep-alive connection;
  - GET units: p50 of 200, likewise;
  - a create: p50 of 40 (consecutive one-hour terms, synchronous=FULL commits).

Then the history is written straight into state.db with Python's sqlite3, as the agent would have
left it: HISTORY ended reservations (with their org rows) and AUDIT audit records, chained by the
agent's own hash (lab.audit_hash) from the head the agent left. The agent is measured again. The
anchor of each figure is the agent without history: CONTRACT §11 holds start-up within 200 ms,
RSS within 4 MiB, and GET state no larger or slower. Not a test (ctest never runs it); prints
SUMMARY rows for make bench's table. About two minutes at the full size.
"""
import http.client
import json
import os
import random
import sqlite3
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "tests", "integration"))

import lab as L  # noqa: E402
import summary  # noqa: E402

HISTORY = int(os.environ.get("HISTORY", 100_000))
AUDIT = int(os.environ.get("AUDIT", 1_000_000))
ROUNDS = int(os.environ.get("ROUNDS", 3))
UNIT = L.VFIO_UNITS[0]
ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def say(*a):
    print(*a, flush=True)


def new_id(prefix, ms):
    """An id as the agent makes them: PREFIX + 10 base32 digits of milliseconds + 16 random."""
    head = "".join(ALPHABET[(ms >> (5 * i)) & 31] for i in range(9, -1, -1))
    return prefix + head + "".join(random.choice(ALPHABET) for _ in range(16))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Bench:
    def __init__(self, lab):
        self.lab = lab
        self.token = lab.admin()
        self.term = 0  # consecutive terms for creates, across both phases

    def start(self):
        lab = self.lab
        lab.logf = open(os.path.join(lab.dir, "agent.log"), "ab")
        t0 = time.perf_counter()
        lab.proc = L.subprocess.Popen([lab.agent, "run", "--config", lab.cfg], stdout=lab.logf,
                                      stderr=L.subprocess.STDOUT, start_new_session=True)
        while time.perf_counter() - t0 < 30:
            if lab.proc.poll() is not None:
                raise RuntimeError(f"agent exited: {lab.tail()}")
            try:
                if lab.get("/healthz", timeout=2).status == 200:
                    return (time.perf_counter() - t0) * 1000
            except (OSError, http.client.HTTPException, L.ssl.SSLError):
                pass
            time.sleep(0.002)
        raise RuntimeError(f"no /healthz within 30 s: {lab.tail()}")

    def timed(self, method, path, n, body=None):
        """p50 in ms of n requests on one keep-alive connection, and the last body's size."""
        c = self.lab.conn()
        h = {"Authorization": "Bearer " + self.token}
        took, size = [], 0
        for _ in range(n):
            data = body() if callable(body) else None
            if data is not None:
                h["Content-Type"] = "application/json"
            t0 = time.perf_counter()
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            payload = r.read()
            took.append((time.perf_counter() - t0) * 1000)
            if r.status not in (200, 201):
                raise RuntimeError(f"{method} {path}: {r.status} {payload[:300]!r}")
            size = len(payload)
        c.close()
        return statistics.median(took), size

    def create_body(self):
        self.term += 1
        start = time.time() + 400 * 86400 + self.term * 3600
        return json.dumps({"unitIds": [UNIT], "audienceOrgIds": ["org-a"], "startsAt": L.rfc3339(start),
                           "endsAt": L.rfc3339(start + 1800)}).encode()

    def measure(self, label):
        rows = []
        for _ in range(ROUNDS):
            up = self.start()
            state_ms, state_bytes = self.timed("GET", self.lab.npath("/state"), 200)
            rss = rss_kib(self.lab.pid)
            units_ms, _ = self.timed("GET", self.lab.npath("/units"), 200)
            create_ms, _ = self.timed("POST", self.lab.npath("/reservations"), 40, body=self.create_body)
            # Ended again, so that every round's GET state shows the same live reservations.
            for x in self.lab.reservations_all(state="scheduled"):
                self.lab.call("POST", self.lab.npath(f"/reservations/{x['id']}/end"), unix=True)
            self.lab.stop()
            rows.append((up, rss, state_bytes, state_ms, units_ms, create_ms))
            say(f"  {label}: start-up {up:.0f} ms, VmRSS {rss / 1024:.1f} MiB, GET state {state_bytes} B "
                f"p50 {state_ms:.2f} ms, GET units p50 {units_ms:.2f} ms, create p50 {create_ms:.2f} ms")
        return [statistics.median(col) for col in zip(*rows)]


def write_history(db_path, node):
    db = sqlite3.connect(db_path)
    db.execute("PRAGMA journal_mode=WAL")
    (last_seq, last_rec), = db.execute("SELECT seq, record FROM audit ORDER BY seq DESC LIMIT 1").fetchall()
    template = json.loads(last_rec)
    now_ms = int(time.time() * 1000)
    t0 = time.perf_counter()
    with db:
        rows, orgs = [], []
        for i in range(HISTORY):
            ms = now_ms - (HISTORY - i) * 60_000 - 86_400_000
            rid = new_id("rsv_", ms)
            starts = L.rfc3339(ms / 1000)
            ends = L.rfc3339(ms / 1000 + 3600)
            aud, mgr = f"org-h{i % 500}", f"org-m{i % 50}"
            doc = {"id": rid, "nodeId": node, "unitIds": [UNIT], "audienceOrgIds": [aud], "managingOrgIds": [mgr],
                   "startsAt": starts, "endsAt": ends, "state": "ended", "endedAt": ends, "endReason": "term-expired",
                   "releasedUnitIds": [], "reclaimingUnitIds": [], "note": "history", "createdAt": starts,
                   "updatedAt": ends, "version": 3}
            rows.append((rid, json.dumps(doc, separators=(",", ":"))))
            orgs += [(aud, rid), (mgr, rid)]
        db.executemany("INSERT INTO reservations (id, doc) VALUES (?, ?)", rows)
        db.executemany("INSERT OR IGNORE INTO reservation_orgs (org, id) VALUES (?, ?)", orgs)
        db.execute("UPDATE meta SET value = CAST(CAST(value AS INTEGER) + ? AS TEXT) WHERE key = 'ended_reservations'",
                   (HISTORY,))
    say(f"  wrote {HISTORY} ended reservations in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    prev = template["hash"]
    with db:
        batch = []
        for seq in range(last_seq + 1, last_seq + 1 + AUDIT):
            rec = dict(template, id=f"aud_{seq}", prevHash=prev)
            rec.pop("hash", None)
            rec["hash"] = prev = L.audit_hash(rec)
            batch.append((seq, json.dumps(rec, separators=(",", ":"), ensure_ascii=False)))
            if len(batch) == 50_000:
                db.executemany("INSERT INTO audit (seq, record) VALUES (?, ?)", batch)
                batch = []
        db.executemany("INSERT INTO audit (seq, record) VALUES (?, ?)", batch)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    say(f"  wrote {AUDIT} audit records, chained, in {time.perf_counter() - t0:.1f} s; state.db "
        f"{os.path.getsize(db_path) / 2**20:.0f} MiB")


def main(argv):
    if len(argv) < 2:
        print(f"usage: {argv[0]} BUILD_DIR", file=sys.stderr)
        return 2
    with L.Lab(os.path.join(argv[1], "gpunode-agent")) as lab:
        b = Bench(lab)
        say(f"== history: the agent without history, then with {HISTORY} ended reservations and {AUDIT} audit records")
        b.start()
        # One reservation made and ended: the audit chain has a head to go on from.
        r = lab.call("POST", lab.npath("/reservations"), token=b.token,
                     body={"unitIds": [UNIT], "audienceOrgIds": ["org-a"], "endsAt": L.rfc3339(time.time() + 3600)})
        lab.call("POST", lab.npath(f"/reservations/{r.json['id']}/end"), token=b.token)
        lab.stop()
        empty = b.measure("without history")
        write_history(os.path.join(lab.state, "state.db"), L.NODE)
        full = b.measure("with history")
        names = ("start-up (ms)", "VmRSS (MiB)", "GET state (bytes)", "GET state p50 (ms)", "GET units p50 (ms)",
                 "create p50 (ms)")
        say(f"\n{'median of ' + str(ROUNDS) + ' starts':<26}{'without':>12}{'with history':>14}{'ratio':>8}")
        for name, a, w in zip(names, empty, full):
            if "MiB" in name:
                a, w = a / 1024, w / 1024
            say(f"{name:<26}{a:>12.2f}{w:>14.2f}{w / a if a else 0:>8.2f}")
        up, rss = full[0], (full[1] - empty[1]) / 1024
        summary.row("start-up with 100k ended reservations, 1M audit records", f"{up:.0f} ms",
                    f"{empty[0]:.0f} ms without", ratio=full[0] / empty[0], target="≤ 200 ms", met=up <= 200)
        summary.row("RSS with that history", f"{full[1] / 1024:.1f} MiB", f"{empty[1] / 1024:.1f} MiB without",
                    ratio=full[1] / empty[1], target="≤ +4 MiB", met=rss <= 4)
        summary.row("GET state with that history", f"{full[2]} B, p50 {full[3]:.2f} ms",
                    f"{empty[2]} B, p50 {empty[3]:.2f} ms without", ratio=full[3] / empty[3],
                    target="same size (but the revision's digits), ≤ 1.2x",
                    met=full[2] <= empty[2] + 2 and full[3] <= 1.2 * empty[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
