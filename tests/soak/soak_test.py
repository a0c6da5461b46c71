#!/usr/bin/env python3
"""The crash loop (issue 15, item 3): SIGKILL the real `gpunode-agent run` at random points, again and
again, while everything is in flight at once, and check after every restart that nothing it
acknowledged was lost and that its invariants hold.

    soak_test.py PATH/TO/gpunode-agent [--kills N] [--minutes M] [--seed S] [--full-every K]

In flight, each in its own thread, on the demo fixture host with libvirt's test driver holding the
spot VMs of tests/fixtures/libvirt/spot_node.xml and the fake central API (tests/central/) taking
the events:
  mutations    creates, amends and ends of reservations far in the future (units 24 and a1), half
               over HTTPS with an admin token and half over the admin socket
  terms        reservations on unit a1 that start a second or two from now and last one to three
               seconds, so that the clock activates and expires them (some are ended early)
  spot         on three active reservations (units 23, 43, 81) whose units carry spot VMs: release
               (sometimes of units already released: a no-op), terminate-spot with a grace of 0 to 2 s
               as the managing org or the owner, reclaim with and without terminateSpot
  long polls   two `GET .../state?after=REV&wait=2s` loops, one per transport
  delivery     the agent's reporter; now and then the fake central API fails a batch (500, 429, a
               dropped connection, a partial store) so that events are sent again
Every mutation carries an Idempotency-Key; one that gets no answer (the agent died) is sent again,
same key, same body, same transport, until it has an answer: so each one ends answered, and an
answered 2xx is an acknowledged change. The kills come at random times; some wait for a
termination to be in flight first (to kill inside a grace period or between a termination's two
audit records).

After every restart (the actors paused at an operation's boundary, so the model is exact):
  - every acknowledged change is present exactly as acknowledged: a reservation only the mutator
    touches equals its last acknowledged answer; a term's reservation equals its create's answer
    but for what the clock did (state, endedAt = endsAt, endReason, version, updatedAt); a spot
    reservation has the released units of its last answer, and of its reclaiming units only ones
    that answer listed (the agent empties reclaimingUnitIds as units are vacated); and nothing else
    exists (no change applied twice, none without an answer on record)
  - the audit chain recomputes from aud_1 (the new records every time, each whole `--full-every`
    restarts and at the end), ids contiguous
  - outbox seq dense: every seq up to the highest one known is in the outbox or at the central API
  - every termination written ahead (`pending`) gets exactly one outcome record before the next
    pending one of the same VM, and those the kill left pending are finished after the restart
    (counted: pending -> finished)
  - the central API got each seq with one content only; no event twice under two seqs (event id,
    a reservation's created/activated/expired/ended, an amend's version, a termination's audit id)
  - terms fired at most once (exactly once when due), never before startsAt/endsAt, and an expired
    term's endedAt is its endsAt
  - a few acknowledged requests sent again with their key answer exactly as the first time
  - the long polls never saw the revision go back (across restarts too)
At the end: SIGTERM, start, every delivered, and the whole check once more; then one line
`soak: kills=... acked=... losses=... chain_breaks=... dup_deliveries=...`.

Bulk reads (lists, audit pages) go over the admin socket without lab.py's check against
docs/openapi.yaml, which would dominate the loop's time; every mutation's answer is checked.
"""
import http.client
import json
import os
import random
import sqlite3
import ssl
import sys
import threading
import time
import uuid

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
import lab as L  # noqa: E402

XML = os.path.join(L.FIXTURES, "libvirt", "spot_node.xml")
U23, U24, U43, U81, UA1 = "u-0000-23-00-0", "u-0000-24-00-0", "u-0000-43-00-0", "u-0000-81-00-0", "u-0000-a1-00-0"
CONN_ERRORS = (OSError, http.client.HTTPException, ssl.SSLError)
MERGE = {"Content-Type": "application/merge-patch+json"}


def arg(name, default, cast=int):
    if name in sys.argv:
        return cast(sys.argv[sys.argv.index(name) + 1])
    return default


def strip_volatile(r):
    """A reservation as a list shows it (a create's answer adds spotWorkloads)."""
    return {k: v for k, v in r.items() if k != "spotWorkloads"}


class Soak:
    def __init__(self, c, lab, fc, seed):
        self.c, self.lab, self.fc = c, lab, fc
        self.rng = random.Random(seed)
        self.seed = seed
        self.stop = False
        self.pause = threading.Event()      # set: actors stop at their next operation's boundary
        self.lock = threading.Lock()
        self.idle = {}                      # actor -> threading.Event (set while paused at a boundary)
        self.in_flight = {}                 # actor -> what it is sending now (for biased kills)
        # the model
        self.acked = 0
        self.acked_by = {}
        self.answers = []                   # (transport, method, path, body, key, status, body) of 2xx
        self.replayed = 0
        self.resend = 0                     # requests sent again with their key after no answer
        self.mut = {}                       # id -> last acknowledged reservation (mutator's)
        self.terms = {}                     # id -> {"ack": reservation as created, "ended_early": answer or None}
        self.spot = {}                      # id -> last acknowledged reservation (spot actor's)
        self.unexpected = []
        self.dirty = set()                  # ids the mutator and terms changed since the last check
        # what the checks found
        self.losses = 0
        self.loss_detail = []
        self.chain_breaks = 0
        self.dup_deliveries = 0
        self.dup_detail = []
        self.problems = []                  # other invariant breaks: (label, detail)
        # the audit, read as it grows
        self.audit_n = 0
        self.audit_last_hash = "0" * 64
        self.open_pending = {}              # vmId -> pending record id without an outcome yet
        self.pending_finished = 0           # outcomes "finished by the agent": pendings a kill left open
        self.pending_seen = 0
        self.terminations_ok = 0
        self.activations = {}               # reservation id -> [audit at]
        self.expirations = {}
        self.audit_counts = {}
        # deliveries
        self.ev_seen_seq = 0
        self.ev_ids = {}
        self.ev_keys = {}
        self.event_counts = {}
        # long polls
        self.max_revision = 0
        self.poll_answers = {"200": 0, "304": 0, "conn": 0}
        self.kills = 0
        self.biased_kills = 0
        self.restart_s = []

    # -- requests ----------------------------------------------------------------------------
    def token_of(self, org):
        """A fresh token (lab.py renews them every minute; they live ten): `org` None is the admin."""
        return self.lab.admin() if org is None else self.lab.token(org=org)

    def send(self, who, method, path, body, transport, org=None, headers=None):
        """One mutation with an Idempotency-Key, sent until it has an answer (by the same caller
        over the same transport: the key is the caller's). Returns the answer, or None when the
        run stops first."""
        key = f"{who}-{uuid.uuid4().hex}"
        h = dict(headers or {})
        h["Idempotency-Key"] = key
        unix = transport == "unix"
        tries = 0
        while not self.stop:
            tries += 1
            with self.lock:
                self.in_flight[who] = (method, path)
            try:
                tok = None if unix else self.token_of(org)
                r = self.lab.call(method, path, token=tok, body=body, headers=h, unix=unix, timeout=20)
            except CONN_ERRORS:
                with self.lock:
                    self.in_flight.pop(who, None)
                time.sleep(0.02)
                continue
            finally:
                with self.lock:
                    self.in_flight.pop(who, None)
            if r.status == 409 and r.code() == "idempotency-key-in-use":
                time.sleep(0.1)
                continue
            if tries > 1:
                with self.lock:
                    self.resend += 1
            if 200 <= r.status < 300:
                with self.lock:
                    self.acked += 1
                    self.acked_by[who] = self.acked_by.get(who, 0) + 1
                    self.answers.append((transport, org, method, path, body, h, r.status, r.body))
            return r
        return None

    def boundary(self, who):
        """Between two operations: wait here while the checker runs."""
        while self.pause.is_set() and not self.stop:
            self.idle[who].set()
            time.sleep(0.005)
        self.idle[who].clear()

    def actor(self, who, step):
        self.idle[who] = threading.Event()

        def run():
            rng = random.Random(self.rng.random())
            while not self.stop:
                self.boundary(who)
                if self.stop:
                    break
                try:
                    step(rng)
                except Exception as e:  # a bug of the test itself: loud
                    import traceback
                    traceback.print_exc()
                    self.problems.append((f"actor {who} crashed", repr(e)))
                    self.idle[who].set()
                    return
        t = threading.Thread(target=run, name=who, daemon=True)
        return t

    # -- the mutator -------------------------------------------------------------------------
    def mutator_setup(self):
        self.base = int(time.time()) + 200 * 86400
        self.slot = 0

    def mutator_step(self, rng):
        live = [x for x, v in self.mut.items() if v["state"] != "ended"]
        roll = rng.random()
        transport = "unix" if rng.random() < 0.5 else "https"
        if not live or roll < 0.5:
            self.slot += 1
            unit = [U24, UA1][self.slot % 2]
            start = self.base + self.slot * 3600
            body = {"unitIds": [unit], "audienceOrgIds": ["org-soak"], "managingOrgIds": [],
                    "startsAt": L.rfc3339(start), "endsAt": L.rfc3339(start + 1800), "note": f"create-{self.slot}"}
            r = self.send("mutator", "POST", self.lab.npath("/reservations"), body, transport)
            if r is None:
                return
            if r.status == 201:
                self.mut[r.json["id"]] = strip_volatile(r.json)
                self.dirty.add(r.json["id"])
            else:
                self.unexpected.append((f"create {body}", repr(r)))
            return
        rid = rng.choice(live)
        if roll < 0.85:
            body = {"note": f"amend-{uuid.uuid4().hex[:8]}"}
            if rng.random() < 0.3:
                cur = self.mut[rid]
                body["endsAt"] = L.rfc3339(L.parse_time(cur["startsAt"]) + rng.choice([900, 1800, 2700]))
            r = self.send("mutator", "PATCH", self.lab.npath(f"/reservations/{rid}"), body, transport, headers=MERGE)
            self.acked_change(rid, r, f"amend {rid} {body}")
            return
        r = self.send("mutator", "POST", self.lab.npath(f"/reservations/{rid}/end"), {"reason": "soak"}, transport)
        self.acked_change(rid, r, f"end {rid}")

    def acked_change(self, rid, r, what):
        """An amend's or an end's answer: a 200 is the reservation as acknowledged; no answer
        (None: refused after retries) changes nothing; anything else is unexpected."""
        if r is None:
            return
        if r.status == 200:
            self.mut[rid] = strip_volatile(r.json)
            self.dirty.add(rid)
        else:
            self.unexpected.append((what, repr(r)))

    # -- terms by the clock ------------------------------------------------------------------
    def terms_setup(self):
        self.term_end = time.time()

    def terms_step(self, rng):
        now = time.time()
        live = [x for x, t in self.terms.items() if t["ended_early"] is None and
                L.parse_time(t["ack"]["startsAt"]) + 0.2 < now < L.parse_time(t["ack"]["endsAt"]) - 0.5]
        if live and rng.random() < 0.15:
            rid = rng.choice(live)
            r = self.send("terms", "POST", self.lab.npath(f"/reservations/{rid}/end"), {"reason": "early"}, "unix")
            if r is None:
                return
            if r.status == 200:
                self.terms[rid]["ended_early"] = strip_volatile(r.json)
                self.dirty.add(rid)
            elif not (r.status == 409 and r.code() == "reservation-ended"):  # the clock came first
                self.unexpected.append((f"end term {rid}", repr(r)))
            return
        if self.term_end > now + 5:  # enough terms queued: wait a little
            time.sleep(0.1)
            return
        start = max(int(now) + 2, int(self.term_end))
        end = start + rng.choice([1, 2, 3])
        body = {"unitIds": [UA1], "audienceOrgIds": ["org-terms"], "managingOrgIds": [],
                "startsAt": L.rfc3339(start), "endsAt": L.rfc3339(end), "note": "term"}
        transport = "unix" if rng.random() < 0.5 else "https"
        r = self.send("terms", "POST", self.lab.npath("/reservations"), body, transport)
        if r is None:
            return
        if r.status == 201:
            self.terms[r.json["id"]] = {"ack": strip_volatile(r.json), "ended_early": None}
            self.dirty.add(r.json["id"])
            self.term_end = end
        elif r.status == 400 and time.time() >= start - 0.5:
            self.term_end = end  # the answer came (after a restart) once startsAt had passed: refused, fine
        else:
            self.unexpected.append((f"create term {body}", repr(r)))
        time.sleep(rng.random() * 0.2)

    # -- the spot market ---------------------------------------------------------------------
    def spot_setup(self):
        end = L.rfc3339(time.time() + 30 * 86400)
        for unit in (U23, U43, U81):
            r = self.send("setup", "POST", self.lab.npath("/reservations"),
                          {"unitIds": [unit], "audienceOrgIds": ["org-aud"], "managingOrgIds": ["org-mgr"], "endsAt": end},
                          "unix")
            assert r is not None and r.status == 201, r
            self.spot[r.json["id"]] = strip_volatile(r.json)

    def spot_step(self, rng):
        rid = rng.choice(sorted(self.spot))
        cur = self.spot[rid]
        unit = cur["unitIds"][0]
        roll = rng.random()
        who = rng.choice(["mgr", "admin"])
        transport = "unix" if who == "admin" else "https"
        org = "org-mgr" if who == "mgr" else None
        R = self.lab.npath(f"/reservations/{rid}")
        if roll < 0.35 or (not cur["releasedUnitIds"] and roll < 0.55):
            r = self.send("spot", "POST", R + "/release", {"unitIds": [unit]}, transport, org=org)
            if r is None:
                return
            if r.status == 200:
                self.spot[rid] = r.json["reservation"]
            else:
                self.unexpected.append((f"release {rid}", repr(r)))
        elif roll < 0.65:
            grace = rng.choice([0, 1, 2])
            if cur["releasedUnitIds"] or cur["reclaimingUnitIds"]:
                body, org2 = {"unitIds": [unit], "gracePeriodSeconds": grace, "reason": "soak"}, "org-mgr"
            else:
                body, org2 = {"unitIds": [unit], "gracePeriodSeconds": grace}, L.OWNER
            r = self.send("spot", "POST", self.lab.npath("/terminate-spot"), body, "https", org=org2)
            if r is None:
                return
            if r.status == 200:
                pass  # changes no reservation but reclaimingUnitIds (the agent's own, allowed)
            elif r.status == 403 and r.code() == "out-of-reach":
                pass  # the unit was reclaimed and vacated by the agent since the answer we know
            else:
                self.unexpected.append((f"terminate-spot {body}", repr(r)))
        else:
            term = rng.random() < 0.5
            r = self.send("spot", "POST", R + "/reclaim", {"unitIds": [unit], "terminateSpot": term}, transport, org=org)
            if r is None:
                return
            if r.status == 200:
                self.spot[rid] = r.json["reservation"]
            else:
                self.unexpected.append((f"reclaim {rid} terminateSpot={term}", repr(r)))
        time.sleep(rng.random() * 0.05)

    # -- long polls ----------------------------------------------------------------------------
    def poller(self, unix):
        def run():
            after = 0
            while not self.stop:
                before = self.max_revision
                tok = None if unix else self.lab.admin()
                try:
                    r = self.lab.call("GET", self.lab.npath(f"/state?after={after}&wait=2s"), token=tok, unix=unix, timeout=10)
                except CONN_ERRORS:
                    self.poll_answers["conn"] += 1
                    time.sleep(0.05)
                    continue
                if r.status == 304:
                    self.poll_answers["304"] += 1
                    continue
                if r.status != 200:
                    self.problems.append(("long poll answered 200 or 304", repr(r)))
                    continue
                self.poll_answers["200"] += 1
                rev = r.json["revision"]
                if rev < before or rev <= after:
                    self.problems.append(("the revision never goes back (also across restarts)",
                                          f"answered {rev} after {after}, {before} seen before the call"))
                with self.lock:
                    self.max_revision = max(self.max_revision, rev)
                after = rev
        return threading.Thread(target=run, name=f"poll-{'unix' if unix else 'https'}", daemon=True)

    def central_chaos(self):
        def run():
            rng = random.Random(self.seed + 7)
            while not self.stop:
                time.sleep(1 + rng.random() * 3)
                self.fc.fail(rng.choice(["500", "429", "drop", "partial:1"]), 1)
        return threading.Thread(target=run, name="central-chaos", daemon=True)

    # -- reading the agent (admin socket, raw) ------------------------------------------------
    def raw_get(self, path):
        conn = self.lab.conn(unix=True, timeout=30)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            body = r.read()
        finally:
            conn.close()
        if r.status != 200:
            raise RuntimeError(f"GET {path}: {r.status} {body[:300]!r}")
        return json.loads(body)

    def read_all(self, what, key, after=None):
        out, tok = [], None
        while True:
            q = "?limit=500" + (f"&after={after}" if after and not tok else "") + (f"&pageToken={tok}" if tok else "")
            j = self.raw_get(self.lab.npath(f"/{what}{q}"))
            out += j[key]
            tok = j.get("nextPageToken")
            if not tok:
                return out

    # -- the checks ----------------------------------------------------------------------------
    def lost(self, what, detail):
        self.losses += 1
        if len(self.loss_detail) < 20:
            self.loss_detail.append((what, detail))

    def check_reservations(self, full, label):
        """Every acknowledged reservation as acknowledged; with `full`, every one and nothing else
        exists; else those changed since the last check, the spot ones and the terms under way."""
        t_read = time.time()
        if full:
            have = {x["id"]: x for x in self.read_all("reservations", "reservations")}
            ids = set(have) | set(self.mut) | set(self.terms) | set(self.spot)
        else:
            ids = set(self.dirty) | set(self.spot) | {x for x, t in self.terms.items()
                                                      if t_read < L.parse_time(t["ack"]["endsAt"]) + 10}
            have = {}
            for x in ids:
                try:
                    have[x] = self.raw_get(self.lab.npath(f"/reservations/{x}"))
                except RuntimeError:
                    pass  # missing: a loss if it was acknowledged
        t_done = time.time()
        self.dirty.clear()
        for rid in ids:
            got = have.get(rid)
            if rid in self.mut:
                if got != self.mut[rid]:
                    self.lost(f"{label}: reservation {rid} as last acknowledged", (got, self.mut[rid]))
            elif rid in self.terms:
                self.check_term(rid, self.terms[rid], got, t_read, t_done, label)
            elif rid in self.spot:
                want = self.spot[rid]
                if got is None or got["releasedUnitIds"] != want["releasedUnitIds"] or \
                        not set(got["reclaimingUnitIds"]) <= set(want["reclaimingUnitIds"]) or \
                        got["version"] < want["version"] or got["state"] != "active":
                    self.lost(f"{label}: spot reservation {rid} as last acknowledged", (got, want))
            else:
                self.problems.append((f"{label}: no reservation exists without an acknowledged create", got))
        return len(have)

    def check_term(self, rid, t, got, t_read, t_done, label):
        ack = t["ack"]
        if got is None:
            self.lost(f"{label}: term {rid} exists", ack)
            return
        same = all(got[k] == ack[k] for k in ("id", "unitIds", "audienceOrgIds", "managingOrgIds", "startsAt",
                                              "endsAt", "note", "createdAt", "releasedUnitIds"))
        if not same:
            self.lost(f"{label}: term {rid} kept what was acknowledged", (got, ack))
            return
        if t["ended_early"] is not None:
            if got != t["ended_early"]:
                self.lost(f"{label}: term {rid} ended early as acknowledged", (got, t["ended_early"]))
            return
        s, e = L.parse_time(ack["startsAt"]), L.parse_time(ack["endsAt"])
        if t_done < s - 0.5 and got["state"] != "scheduled":
            self.problems.append((f"{label}: term {rid} not started before its startsAt", got))
        if got["state"] == "ended":
            if got["endReason"] != "term-expired" or got["endedAt"] != ack["endsAt"]:
                self.problems.append((f"{label}: term {rid} expired with endedAt = endsAt", got))
            if t_done < e - 0.5:
                self.problems.append((f"{label}: term {rid} did not expire before its endsAt", got))
        elif t_read > e + 3:
            self.problems.append((f"{label}: term {rid} expired within a second of endsAt (+slack)", (got, t_read)))

    def read_audit(self, label):
        """New audit records: chain continued from the last one verified; terminations, terms."""
        after = f"aud_{self.audit_n}" if self.audit_n else None
        recs = self.read_all("audit", "records", after=after)
        for r in recs:
            self.audit_n += 1
            want_id = f"aud_{self.audit_n}"
            h = L.audit_hash(r)
            if r.get("id") != want_id or r.get("prevHash") != self.audit_last_hash or r.get("hash") != h:
                self.chain_breaks += 1
                self.problems.append((f"{label}: audit chain at {want_id}", r))
            self.audit_last_hash = r.get("hash")
            a = r["action"]
            self.audit_counts[(a, r["result"])] = self.audit_counts.get((a, r["result"]), 0) + 1
            if a == "workload.terminate":
                vm = r["vmIds"][0] if r["vmIds"] else None
                if r["result"] == "pending":
                    self.pending_seen += 1
                    if vm in self.open_pending:
                        self.problems.append((f"{label}: VM {vm}: a second pending termination before the first's outcome",
                                              (self.open_pending[vm], r["id"])))
                    self.open_pending[vm] = r["id"]
                else:
                    if vm not in self.open_pending:
                        self.problems.append((f"{label}: VM {vm}: an outcome without its pending record", r))
                    self.open_pending.pop(vm, None)
                    if (r.get("detail") or "").startswith("finished by the agent"):
                        self.pending_finished += 1  # left pending by a kill, finished by the next run
                    if r["result"] == "ok":
                        self.terminations_ok += 1
            elif a == "reservation.activate":
                self.activations.setdefault(r["reservationId"], []).append(r["at"])
            elif a == "reservation.expire":
                self.expirations.setdefault(r["reservationId"], []).append(r["at"])
        return len(recs)

    def check_terms_fired(self, label, final=False):
        now = time.time()
        for rid, t in self.terms.items():
            ack = t["ack"]
            s, e = L.parse_time(ack["startsAt"]), L.parse_time(ack["endsAt"])
            acts, exps = self.activations.get(rid, []), self.expirations.get(rid, [])
            if len(acts) > 1 or len(exps) > 1:
                self.problems.append((f"{label}: term {rid} fired once", (acts, exps)))
            if any(L.parse_time(x) < s for x in acts) or any(L.parse_time(x) < e for x in exps):
                self.problems.append((f"{label}: term {rid} fired no earlier than its time", (ack, acts, exps)))
            if final and now > e + 1:
                want_exp = 0 if t["ended_early"] is not None else 1
                if len(acts) != 1 or len(exps) != want_exp:
                    self.problems.append((f"{label}: term {rid} activated once and expired {want_exp} times",
                                          (ack, acts, exps, t["ended_early"])))

    def check_outbox(self, label):
        """Every seq up to the highest known is in the outbox or stored at the central API."""
        with self.fc.lock:
            known = max(self.fc.events) if self.fc.events else 0
        db = sqlite3.connect(f"file:{os.path.join(self.lab.state, 'state.db')}?mode=ro", uri=True, timeout=10)
        try:
            rows = [s for (s,) in db.execute("SELECT seq FROM outbox ORDER BY seq")]
            (last,) = db.execute("SELECT value FROM meta WHERE key = 'event_seq'").fetchone()
        finally:
            db.close()
        with self.fc.lock:
            delivered = set(self.fc.events)
        top = max([known] + rows)
        have = delivered | set(rows)
        missing = [s for s in range(1, top + 1) if s not in have]
        if missing:
            self.problems.append((f"{label}: outbox seq dense up to {top}", missing[:10]))
        if rows and rows != list(range(rows[0], rows[-1] + 1)):
            self.problems.append((f"{label}: the outbox holds a contiguous run of seqs", rows[:20]))
        if int(last) < top:
            self.problems.append((f"{label}: the stored event_seq is the highest seq", (last, top)))
        return top, len(rows)

    def check_deliveries(self, label):
        with self.fc.lock:
            events = {s: e for s, e in self.fc.events.items() if s > self.ev_seen_seq}
            problems = list(self.fc.problems)
        for s in sorted(events):
            e = events[s]
            self.ev_seen_seq = max(self.ev_seen_seq, s)
            self.event_counts[e["type"]] = self.event_counts.get(e["type"], 0) + 1
            for k in self.event_keys(e):
                if k in self.ev_keys and self.ev_keys[k] != s:
                    self.dup_deliveries += 1
                    if len(self.dup_detail) < 10:
                        self.dup_detail.append((k, self.ev_keys[k], s))
                self.ev_keys.setdefault(k, s)
        if problems:
            self.problems.append((f"{label}: the fake central API found nothing wrong (a seq with two contents, a gap in a batch)",
                                  problems[:5]))
            with self.fc.lock:
                self.fc.problems.clear()

    @staticmethod
    def event_keys(e):
        d, t = e["data"], e["type"]
        keys = [("id", e["id"])]
        if t in ("reservation.created", "reservation.activated", "reservation.expired", "reservation.ended"):
            keys.append((t, d["reservation"]["id"]))
        elif t == "reservation.amended":
            keys.append((t, d["reservation"]["id"], d["reservation"]["version"]))
        elif t == "workload.terminated":
            keys.append((t, d["auditId"]))
        return keys

    def check_replays(self, label, n):
        """Acknowledged requests sent again with their key: the first answer, byte for byte."""
        with self.lock:
            picks = self.rng.sample(self.answers, min(n, len(self.answers)))
        for transport, org, method, path, body, h, status, rbody in picks:
            unix = transport == "unix"
            try:
                r = self.lab.call(method, path, token=None if unix else self.token_of(org), body=body, headers=h,
                                  unix=unix, timeout=20)
            except CONN_ERRORS as e:
                self.problems.append((f"{label}: replay of {method} {path}", repr(e)))
                continue
            self.replayed += 1
            if r.status != status or r.body != rbody or r.h("idempotent-replayed") != "true":
                self.problems.append((f"{label}: replay of {method} {path} {body} ({h['Idempotency-Key']}) answers as the first time",
                                      (status, rbody[:300], repr(r))))

    def wait_pending_finished(self, label, before, timeout=20):
        """The pendings a kill left open are finished by the agent after the restart."""
        deadline = time.monotonic() + timeout
        left = set(before)
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            self.read_audit(label)
            left = {vm for vm in left if self.open_pending.get(vm) == before[vm]}
        if left:
            self.problems.append((f"{label}: terminations left pending are finished after the restart",
                                  {vm: before[vm] for vm in left}))

    def wait_written_ahead(self, most):
        """Polls state.db (read-only) for a termination written ahead and not finished yet, for at
        most `most` seconds: the moment to kill for a `pending` the next run must finish."""
        deadline = time.monotonic() + most
        try:
            db = sqlite3.connect(f"file:{os.path.join(self.lab.state, 'state.db')}?mode=ro", uri=True, timeout=1)
        except sqlite3.Error:
            return False
        try:
            while time.monotonic() < deadline:
                try:
                    (n,) = db.execute("SELECT count(*) FROM terminations WHERE state = 'pending'").fetchone()
                except sqlite3.Error:
                    n = 0
                if n:
                    return True
                time.sleep(0.0003)
        finally:
            db.close()
        return False

    def pause_actors(self):
        self.pause.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(ev.is_set() for ev in self.idle.values()):
                return True
            time.sleep(0.005)
        self.problems.append(("the actors reach an operation's boundary within 60 s", {k: v.is_set() for k, v in self.idle.items()}))
        return False

    def check_all(self, label, full):
        self.read_audit(label)
        # What the kill left pending: the agent finishes it after the restart.
        before = dict(self.open_pending)
        if before:
            self.wait_pending_finished(label, before)
        n = self.check_reservations(full, label)
        if full:
            recs = self.read_all("audit", "records")
            probs = L.verify_chain(recs)
            if probs:
                self.chain_breaks += len(probs)
                self.problems.append((f"{label}: the whole audit chain recomputes from aud_1", probs[:5]))
            if len(recs) < self.audit_n:
                self.problems.append((f"{label}: no audit record is lost", (len(recs), self.audit_n)))
        self.check_terms_fired(label)
        top, depth = self.check_outbox(label)
        self.check_deliveries(label)
        return n, top, depth


def main(c, agent):
    kills = arg("--kills", int(os.environ.get("SOAK_KILLS", "50")))
    minutes = arg("--minutes", float(os.environ.get("SOAK_MINUTES", "0") or 0), float)
    seed = arg("--seed", random.randrange(1 << 30))
    full_every = arg("--full-every", 1 if kills <= 60 else 25)
    print(f"# seed {seed}, {kills} kills" + (f", at most {minutes} minutes" if minutes else ""), flush=True)
    t0 = time.monotonic()
    env = {}
    supp = os.path.join(HERE, "tsan_libvirt.supp")
    if os.environ.get("TSAN_OPTIONS") is not None:
        env["TSAN_OPTIONS"] = os.environ["TSAN_OPTIONS"] + f":suppressions={supp}"
    with L.Lab(agent) as lab:
        fc = lab.fake_central()
        try:
            text = lab.config_text(central=lab.central_text(fc.url)).replace("uri: test:///default", f"uri: test://{XML}")
            text = text.replace("shutdown_grace: 0s", "shutdown_grace: 1s")
            lab.write_config(text)
            lab.start(wait=60, env=env)
            s = Soak(c, lab, fc, seed)
            s.spot_setup()
            s.mutator_setup()
            s.terms_setup()
            threads = [s.actor("mutator", s.mutator_step), s.actor("terms", s.terms_step), s.actor("spot", s.spot_step),
                       s.poller(True), s.poller(False), s.central_chaos()]
            for t in threads:
                t.start()
            rng = random.Random(seed + 3)
            try:
                for k in range(1, kills + 1):
                    if minutes and time.monotonic() - t0 > minutes * 60:
                        print(f"# the {minutes}-minute bound came after {k - 1} kills", flush=True)
                        break
                    up = 0.15 + rng.random() * 0.9
                    deadline = time.monotonic() + up
                    biased = rng.random() < 0.3
                    while time.monotonic() < deadline:
                        if not lab.running():
                            break
                        if biased and time.monotonic() > deadline - up / 2:
                            with s.lock:
                                spot = s.in_flight.get("spot")
                            if spot and ("/terminate-spot" in spot[1] or spot[1].endswith("/reclaim")) and \
                                    s.wait_written_ahead(0.1):
                                s.biased_kills += 1
                                break
                        time.sleep(0.002)
                    if not lab.running():
                        c.check(f"kill {k}: the agent was still running before the kill", False, lab.tail(3000))
                        break
                    lab.kill()
                    s.kills += 1
                    time.sleep(rng.random() * 0.1)
                    t1 = time.monotonic()
                    try:
                        lab.start(wait=60, env=env)
                    except RuntimeError as e:
                        c.check(f"restart {k} after SIGKILL serves again", False, str(e))
                        break
                    s.restart_s.append(time.monotonic() - t1)
                    label = f"after kill {k}"
                    s.pause_actors()
                    try:
                        full = k % full_every == 0
                        n, top, depth = s.check_all(label, full)
                        if k % 5 == 0:
                            s.check_replays(label, 3)
                    except CONN_ERRORS + (RuntimeError,) as e:  # the agent died by itself (a sanitizer's report?)
                        c.check(f"{label}: the agent serves while it is checked", False, f"{e!r}; the log: {lab.tail(6000)}")
                        break
                    finally:
                        s.pause.clear()
                    if s.problems or s.losses or s.chain_breaks or s.dup_deliveries:
                        c.check(f"{label}: everything acknowledged there, invariants hold", False,
                                (s.problems[:5], s.loss_detail[:5], s.dup_detail[:5]))
                        break
                    print(f"# kill {k}: restart {s.restart_s[-1]:.2f}s, {s.acked} acked, {n} reservations read"
                          f"{' (all)' if full else ''}, audit {s.audit_n}, seq {top} ({depth} in the outbox),"
                          f" {s.pending_finished} pending->finished", flush=True)
            finally:
                if lab.running():  # the actors end at a boundary: their last requests answered
                    s.pause_actors()
                s.stop = True
                for t in threads:
                    t.join(30)
            wall_loop = time.monotonic() - t0
            c.check(f"{s.kills} kills (of {kills}), every one restarted and checked", s.kills > 0 and not s.problems, s.problems[:5])
            c.check("no mutation was refused unexpectedly", not s.unexpected, s.unexpected[:5])

            # The end: a clean stop and start, everything delivered, the whole check once more.
            rc, took = lab.stop(timeout=60)
            c.check(f"SIGTERM after the loop exits 0 ({took:.1f}s)", rc == 0, (rc, lab.tail()))
            lab.start(wait=60, env=env)
            fc.set_mode("ok")
            label = "at the end"
            last_term = max([L.parse_time(t["ack"]["endsAt"]) for t in s.terms.values()] + [time.time()])
            while time.time() < last_term + 1.5:
                time.sleep(0.1)
            s.read_audit(label)
            before = dict(s.open_pending)
            if before:
                s.wait_pending_finished(label, before)
            delivered = fc.wait_for(lambda: s.check_outbox(label)[1] == 0 and fc.acked() == s.check_outbox(label)[0], 60, 0.2)
            c.check("every event is delivered: the outbox empties, the central API acknowledged every seq", delivered,
                    s.check_outbox(label))
            n, top, depth = s.check_all(label, True)
            s.check_terms_fired(label, final=True)
            s.check_replays(label, 20)
            c.check(f"every acknowledged change is there as acknowledged ({s.acked} acked, {n} reservations)", s.losses == 0,
                    s.loss_detail[:5])
            c.check(f"the audit chain of {s.audit_n} records recomputes from aud_1", s.chain_breaks == 0,
                    [p for p in s.problems if "audit" in p[0]][:5])
            c.check(f"outbox seq dense 1..{top}, every one at the central API exactly", fc.acked() == top and depth == 0,
                    (fc.acked(), top, depth))
            c.check("nothing delivered twice except by seq", s.dup_deliveries == 0, s.dup_detail[:5])
            c.check(f"every termination has one outcome ({s.pending_seen} written ahead, {s.terminations_ok} ok,"
                    f" {s.pending_finished} pending -> finished after a restart)", not s.open_pending, s.open_pending)
            pairs = [("reservation.create", "reservation.created"), ("reservation.amend", "reservation.amended"),
                     ("reservation.end", "reservation.ended"), ("reservation.activate", "reservation.activated"),
                     ("reservation.expire", "reservation.expired"), ("units.release", "units.released")]
            counts = {a: sum(v for (x, _), v in s.audit_counts.items() if x == a) for a, _ in pairs}
            counts["workload.terminate"] = s.audit_counts.get(("workload.terminate", "ok"), 0)
            pairs.append(("workload.terminate", "workload.terminated"))
            bad = [(a, counts[a], t, s.event_counts.get(t, 0)) for a, t in pairs if counts[a] != s.event_counts.get(t, 0)]
            c.check("one event per audited change, as many of each (audit ok records vs events at the central API)", not bad, bad)
            due = [x for x, t in s.terms.items() if L.parse_time(t["ack"]["endsAt"]) < time.time()]
            c.check(f"terms by the clock fired exactly once ({len(due)} due, {sum(len(v) for v in s.activations.values())}"
                    f" activations, {sum(len(v) for v in s.expirations.values())} expiries)",
                    not [p for p in s.problems if "term" in p[0]], [p for p in s.problems if "term" in p[0]][:5])
            c.check(f"long polls: the revision never went back ({s.poll_answers})", s.poll_answers["200"] > 0 and
                    not [p for p in s.problems if "revision" in p[0]], s.poll_answers)
            c.check(f"idempotent replays answered as the first time ({s.replayed})", s.replayed > 0 and
                    not [p for p in s.problems if "replay" in p[0]], [p for p in s.problems if "replay" in p[0]][:3])
            c.check("no invariant broke", not s.problems, s.problems[:5])
            rc, took = lab.stop(timeout=60)
            c.check(f"SIGTERM at the end exits 0 ({took:.1f}s)", rc == 0, rc)
            log = lab.log()
            for marker in ("WARNING: ThreadSanitizer", "ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer"):
                c.check(f"no sanitizer report in the agent's log ({marker!r})", marker not in log,
                        log[max(0, log.find(marker) - 200):log.find(marker) + 3000])
            wall = time.monotonic() - t0
            restart = sorted(s.restart_s)
            print(f"# restarts: median {restart[len(restart) // 2]:.2f}s, max {restart[-1]:.2f}s; {s.biased_kills} kills"
                  f" came while a termination was written ahead and not finished; {s.resend} requests sent again after no answer;"
                  f" acked by actor {s.acked_by}; audit {dict(sorted((f'{a}/{r}', n) for (a, r), n in s.audit_counts.items()))};"
                  f" {len(fc.arrivals) - len(fc.events)} redeliveries by seq", flush=True)
            print(f"soak: kills={s.kills} acked={s.acked} losses={s.losses} chain_breaks={s.chain_breaks}"
                  f" dup_deliveries={s.dup_deliveries} pending_finished={s.pending_finished} terminations_ok={s.terminations_ok}"
                  f" events={top} terms={len(due)} wall_s={wall:.0f} loop_s={wall_loop:.0f} seed={seed}", flush=True)
        finally:
            fc.close()


if __name__ == "__main__":
    sys.exit(L.run_main("soak", main))
