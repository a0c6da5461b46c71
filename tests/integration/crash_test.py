#!/usr/bin/env python3
"""Crash safety: SIGKILL the agent in the middle of a stream of mutations, restart it on the same
state dir, and check that nothing it acknowledged was lost and that its invariants hold.

Usage: crash_test.py PATH/TO/gpunode-agent [--seed N] [--ops N] [--kills N]

A thread fires creates (rotating over the reservable units, short terms far in the future that
never overlap one another), amends (a new note) and ends, half over HTTPS with an admin token and
half over the admin socket, recording every answer it received as 2xx. The main thread kills the
agent with SIGKILL at random points of the stream and starts it again. At the end: every
acknowledged create exists as acknowledged, amends are there (version and note at least as
acknowledged), acknowledged ends are ended, no two non-ended reservations hold one unit at
overlapping times, and the audit chain recomputes from aud_1 with contiguous ids.
"""
import http.client
import os
import random
import ssl
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab as L  # noqa: E402


def arg(name, default):
    if name in sys.argv:
        return int(sys.argv[sys.argv.index(name) + 1])
    return default


class Stream:
    """The mutator: what was sent and what was acknowledged."""

    def __init__(self, lab, ops, rng):
        self.lab, self.ops, self.rng = lab, ops, rng
        self.admin = lab.admin()
        self.done = 0           # operations that got any HTTP answer or gave up
        self.acked = 0
        self.conn_errors = 0
        self.created = {}       # id -> acknowledged create body (unitIds, startsAt, endsAt)
        self.versions = {}      # id -> highest acknowledged version
        self.notes = {}         # id -> (acked note, [notes sent after it without an answer])
        self.ended = set()      # acknowledged ends
        self.maybe_ended = set()  # ends sent (maybe applied without an answer, before a kill)
        self.unexpected = []    # 4xx/5xx answers that should not happen
        self.stop = False
        self.base = int(time.time()) + 200 * 86400
        self.slot = 0

    def call(self, method, path, body, headers=None):
        unix = self.rng.random() < 0.5
        tok = None if unix else self.admin
        return self.lab.call(method, path, token=tok, body=body, headers=headers, unix=unix, timeout=5)

    def one(self, i):
        live = [x for x in self.created if x not in self.ended]
        roll = self.rng.random()
        if not live or roll < 0.5:
            self.slot += 1
            unit = L.RESERVABLE[self.slot % len(L.RESERVABLE)]
            start = self.base + self.slot * 3600
            body = {"unitIds": [unit], "audienceOrgIds": ["org-crash"], "managingOrgIds": [],
                    "startsAt": L.rfc3339(start), "endsAt": L.rfc3339(start + 1800), "note": f"create-{i}"}
            r = self.call("POST", self.lab.npath("/reservations"), body)
            if r.status == 201:
                j = r.json
                self.created[j["id"]] = body
                self.versions[j["id"]] = j["version"]
                self.notes[j["id"]] = (body["note"], [])
                return True
            self.unexpected.append((f"create {body}", repr(r)))
            return False
        rid = self.rng.choice(live)
        if roll < 0.85:
            note = f"amend-{i}"
            self.notes[rid][1].append(note)  # sent; maybe applied even without an answer
            r = self.call("PATCH", self.lab.npath(f"/reservations/{rid}"), {"note": note},
                          {"Content-Type": "application/merge-patch+json"})
            if r.status == 200:
                self.versions[rid] = max(self.versions[rid], r.json["version"])
                self.notes[rid] = (note, [])
                return True
            if r.status == 409 and r.code() == "reservation-ended" and rid in self.maybe_ended:
                self.ended.add(rid)  # an earlier end, cut off by a kill before its answer, was applied
                return False
            self.unexpected.append((f"amend {rid}", repr(r)))
            return False
        self.maybe_ended.add(rid)
        r = self.call("POST", self.lab.npath(f"/reservations/{rid}/end"), {"reason": "crash test"})
        if r.status == 200:
            self.ended.add(rid)
            self.versions[rid] = max(self.versions[rid], r.json["version"])
            return True
        if r.status == 409 and r.code() == "reservation-ended":
            self.ended.add(rid)  # an earlier unanswered end was applied
            return False
        self.unexpected.append((f"end {rid}", repr(r)))
        return False

    def run(self):
        i = 0
        while i < self.ops and not self.stop:
            i += 1
            try:
                if self.one(i):
                    self.acked += 1
            except (OSError, http.client.HTTPException, ssl.SSLError):
                self.conn_errors += 1
                # The agent is down: keep trying new operations, but not faster than a restart takes,
                # so that a slow restart (a sanitizer build's is about 1 s) costs a few operations, not
                # half the stream (a refused connect returns at once).
                time.sleep(0.1)
            self.done = i


def main(c, agent):
    seed = arg("--seed", random.randrange(1 << 30))
    ops, kills = arg("--ops", 200), arg("--kills", 3)
    print(f"# seed {seed}, {ops} operations, {kills} kills", flush=True)
    rng = random.Random(seed)
    with L.Lab(agent) as lab:
        lab.start()
        s = Stream(lab, ops, random.Random(seed + 1))
        th = threading.Thread(target=s.run, daemon=True)
        th.start()
        points = sorted(rng.sample(range(15, ops - 10), kills))
        try:
            for k, at in enumerate(points, 1):
                while s.done < at and th.is_alive():
                    time.sleep(0.001)
                time.sleep(rng.random() * 0.02)  # somewhere inside the next request
                print(f"# kill {k} after operation {s.done} ({s.acked} acknowledged)", flush=True)
                lab.kill()
                time.sleep(rng.random() * 0.2)
                t0 = time.monotonic()
                lab.start()
                c.check(f"restart {k} after SIGKILL serves again ({time.monotonic() - t0:.2f}s)", lab.running(), lab.tail())
            th.join(60)
        finally:
            s.stop = True
            th.join(10)
        c.check(f"stream finished: {s.done} operations, {s.acked} acknowledged, {s.conn_errors} without answer",
                s.done == ops and s.acked > ops // 2, (s.done, s.acked))
        c.check("no operation was refused unexpectedly", not s.unexpected, s.unexpected[:5])

        # one more clean restart on top, then read everything over the socket
        rc, took = lab.stop()
        c.check(f"final SIGTERM exits 0 ({took:.1f}s)", rc == 0 and took < 10, rc)
        lab.start()
        rs = {x["id"]: x for x in lab.reservations_all()}

        missing = [x for x in s.created if x not in rs]
        c.check(f"every acknowledged create is there ({len(s.created)})", not missing, missing[:5])
        wrong = [(x, rs[x]) for x, b in s.created.items() if x in rs and (
            rs[x]["unitIds"] != b["unitIds"] or rs[x]["startsAt"] != b["startsAt"] or rs[x]["endsAt"] != b["endsAt"])]
        c.check("acknowledged creates kept their units and term", not wrong, wrong[:3])
        low = [(x, rs[x]["version"], v) for x, v in s.versions.items() if x in rs and rs[x]["version"] < v]
        c.check("every version is at least the acknowledged one", not low, low[:5])
        badnote = [(x, rs[x]["note"], n) for x, n in s.notes.items()
                   if x in rs and rs[x]["note"] not in [n[0]] + n[1]]
        c.check("every note is the last acknowledged one (or a later one sent without an answer)", not badnote,
                badnote[:5])
        notended = [x for x in s.ended if x in rs and rs[x]["state"] != "ended"]
        c.check(f"every acknowledged end is ended ({len(s.ended)})", not notended, notended[:5])

        live = [x for x in rs.values() if x["state"] != "ended"]
        clashes = []
        for i, a in enumerate(live):
            for b in live[i + 1:]:
                if set(a["unitIds"]) & set(b["unitIds"]) and \
                        L.parse_time(a["startsAt"]) < L.parse_time(b["endsAt"]) and \
                        L.parse_time(b["startsAt"]) < L.parse_time(a["endsAt"]):
                    clashes.append((a["id"], b["id"]))
        c.check(f"no two non-ended reservations hold one unit at overlapping times ({len(live)} live)", not clashes,
                clashes[:5])

        recs = lab.audit_all()
        probs = L.verify_chain(recs)
        c.check(f"audit chain of {len(recs)} records recomputes from aud_1, ids contiguous", not probs, probs[:5])
        creates = {x["reservationId"] for x in recs if x.get("action") == "reservation.create"}
        c.check("every acknowledged create has its reservation.create record", set(s.created) <= creates,
                sorted(set(s.created) - creates)[:5])
        c.check("every reservation.create record has its reservation (same transaction)",
                creates == set(rs), (sorted(creates - set(rs))[:5], sorted(set(rs) - creates)[:5]))
        ends = {x["reservationId"] for x in recs if x.get("action") == "reservation.end"}
        c.check("every ended reservation has its reservation.end record and vice versa",
                ends == {x for x, v in rs.items() if v["state"] == "ended"}, ends ^ {x for x, v in rs.items()
                                                                                   if v["state"] == "ended"})
        amends = {}
        for x in recs:
            if x.get("action") == "reservation.amend":
                amends[x["reservationId"]] = amends.get(x["reservationId"], 0) + 1
        badv = [(x, v["version"], amends.get(x, 0)) for x, v in rs.items()
                if v["version"] - 1 - amends.get(x, 0) not in ((0, 1) if v["state"] == "ended" else (0,))]
        c.check("each version = 1 + its amend records (+ the end): audit written with the change", not badv,
                badv[:5])
        # CONTRACT §12: the crash loop's history exported and verified with the node's key, and live;
        # the final SIGTERM above signed its head.
        pub = os.path.join(lab.dir, "node.pub")
        subprocess.run(["openssl", "pkey", "-in", os.path.join(lab.state, "audit-signing.key"), "-pubout",
                        "-out", pub], check=True)
        gctl = [os.path.join(os.path.dirname(lab.agent), "gpunodectl"), "--socket", lab.sock, "audit"]
        out = os.path.join(lab.dir, "export.jsonl")
        e = subprocess.run(gctl + ["export", "--output", out], capture_output=True, text=True)
        v = subprocess.run(gctl + ["verify", "--file", out, "--key", pub], capture_output=True, text=True)
        signed = sum('"signature"' in x for x in open(out)) if e.returncode == 0 else 0
        c.check(f"gpunodectl audit verify over the crash loop's history ({signed} checkpoints): {v.stdout.strip()}",
                e.returncode == 0 and v.returncode == 0 and signed >= 1, (e.stderr, v.stdout, v.stderr))
        lv = subprocess.run(gctl + ["verify"], capture_output=True, text=True)
        c.check("gpunodectl audit verify (live) after the crash loop", lv.returncode == 0, (lv.stdout, lv.stderr))
        rc, took = lab.stop()
        c.check(f"SIGTERM at the end exits 0 ({took:.1f}s)", rc == 0, rc)


if __name__ == "__main__":
    sys.exit(L.run_main("crash", main))
