#!/usr/bin/env python3
"""An outage of the central API (CONTRACT §6: the outbox keeps every event until acknowledged).

The fake central API (tests/central/fake_central.py) is down while hundreds of changes happen on
the spot_node libvirt test driver: reservations created, amended and ended, terms started and
expired by the clock, units released and reclaimed, spot VMs terminated; the agent is restarted
twice meanwhile, once by SIGKILL. Then the API comes back: every event arrives, seq dense from 1
and in order, each `data` shaped per §6, each exactly once after dedup by seq, the outbox table
empty after the last ack and the heartbeat saying outboxDepth 0; the log tells the operator.

    outage_test.py PATH/TO/gpunode-agent"""
import collections
import json
import os
import sqlite3
import sys
import time

sys.dont_write_bytecode = True
import lab as L  # noqa: E402

XML = os.path.join(L.FIXTURES, "libvirt", "spot_node.xml")
U23, U43, U81, UA1 = "u-0000-23-00-0", "u-0000-43-00-0", "u-0000-81-00-0", "u-0000-a1-00-0"

RESERVATION_KEYS = {"id", "nodeId", "unitIds", "audienceOrgIds", "managingOrgIds", "startsAt", "endsAt", "state", "endedAt",
                    "endReason", "releasedUnitIds", "reclaimingUnitIds", "note", "createdAt", "updatedAt", "version"}
DATA_KEYS = {
    "inventory.changed": {"units"},
    "units.released": {"reservationId", "unitIds"},
    "units.reclaimed": {"reservationId", "unitIds"},
    "workload.terminated": {"vmId", "domainUuid", "unitIds", "reservationId", "by", "auditId", "reason"},
    "workload.unentitled": {"name", "domainUuid", "vmId", "org", "tier", "unitIds", "reasons"},
    "workload.terminating": {"vmId", "domainUuid", "unitIds", "reservationId", "by", "auditId", "deadline"},
    "audit.checkpoint": {"seq", "hash", "at", "keyId", "signature"},
}


def shape_problem(e):
    t, d = e.get("type"), e.get("data")
    if not isinstance(d, dict):
        return "data is not an object"
    if t.startswith("reservation."):
        if t.split(".", 1)[1] not in ("created", "amended", "ended", "activated", "expired"):
            return f"unknown type {t}"
        if set(d) != {"reservation"} or not RESERVATION_KEYS <= set(d["reservation"]):
            return f"reservation keys {sorted(d)} {sorted(d.get('reservation', {}))}"
        return None
    want = DATA_KEYS.get(t)
    if want is None:
        return f"unknown type {t}"
    if not want <= set(d):
        return f"keys {sorted(d)}, want {sorted(want)}"
    if t == "workload.terminated" and d.get("reason") != "capacity-reclaim":
        return f"reason {d.get('reason')}"
    if t == "inventory.changed" and not all(isinstance(u, dict) and "id" in u for u in d["units"]):
        return "units"
    return None


def outbox_types(lab):
    db = sqlite3.connect(f"file:{os.path.join(lab.state, 'state.db')}?mode=ro", uri=True)
    try:
        return collections.Counter(json.loads(e)["type"] for (e,) in db.execute("SELECT event FROM outbox"))
    finally:
        db.close()


def outbox_rows(lab):
    db = sqlite3.connect(f"file:{os.path.join(lab.state, 'state.db')}?mode=ro", uri=True)
    try:
        return db.execute("SELECT count(*) FROM outbox").fetchone()[0], \
            int(db.execute("SELECT value FROM meta WHERE key = 'event_seq'").fetchone()[0])
    finally:
        db.close()


def body(c, lab, fc):
    fc.down()
    lab.write_config(lab.config_text(central=lab.central_text(fc.url)).replace("uri: test:///default", f"uri: test://{XML}"))
    lab.start()
    admin = lab.admin()
    counts = collections.Counter()
    day, now = 86400, time.time()

    def post(path, payload):
        return lab.call("POST", lab.npath(path), body=payload, unix=True)

    def future_batch(k, offset):
        """k reservations in the future on the device-request units, each amended; every other one ended."""
        for i in range(k):
            starts = now + day * (30 + offset + i)
            r = lab.create(None, unitIds=[U81 if i % 2 else UA1], audienceOrgIds=["org-a"], managingOrgIds=["org-m"],
                           startsAt=L.rfc3339(starts), endsAt=L.rfc3339(starts + 3600), note=f"outage {offset + i}")
            assert r.status == 201, r
            counts["reservation.created"] += 1
            rid = r.json["id"]
            r = lab.call("PATCH", lab.npath(f"/reservations/{rid}"), body={"endsAt": L.rfc3339(starts + 7200)}, unix=True)
            assert r.status == 200, r
            counts["reservation.amended"] += 1
            if i % 2 == 0:
                r = post(f"/reservations/{rid}/end", {"reason": "outage test"})
                assert r.status == 200, r
                counts["reservation.ended"] += 1

    def terminate_all(grace=0):
        r = post("/terminate-spot", {"gracePeriodSeconds": grace})
        assert r.status == 200, r
        counts["workload.terminated"] += len(r.json["terminated"])
        if grace:  # CONTRACT §12: each is announced first
            counts["workload.terminating"] += len(r.json["terminated"])

    # terms by the clock: two short terms on UA1 that start and expire within seconds
    for k in range(2):
        t = time.time() + 1.5 + k * 1.5
        r = lab.create(None, unitIds=[UA1], audienceOrgIds=["org-a"], startsAt=L.rfc3339(t), endsAt=L.rfc3339(t + 1))
        assert r.status == 201, r
        counts["reservation.created"] += 1
        counts["reservation.activated"] += 1
        counts["reservation.expired"] += 1
    # an active reservation on the spot units: release and reclaim them, terminating spot VMs
    r = lab.create(admin, unitIds=[U23, U43], audienceOrgIds=["org-aud"], managingOrgIds=["org-mgr"],
                   endsAt=L.rfc3339(now + 20 * day))
    assert r.status == 201, r
    counts["reservation.created"] += 1
    rid = r.json["id"]
    r = post(f"/reservations/{rid}/release", {"unitIds": [U43]})
    assert r.status == 200, r
    counts["units.released"] += 1
    r = post(f"/reservations/{rid}/reclaim", {"unitIds": [U43], "terminateSpot": True})
    assert r.status == 200, r
    counts["units.reclaimed"] += 1
    counts["workload.terminated"] += len(r.json["terminated"])
    for _ in range(20):  # nothing runs on U43 now: each reclaim is immediate
        assert post(f"/reservations/{rid}/release", {"unitIds": [U43]}).status == 200
        counts["units.released"] += 1
        assert post(f"/reservations/{rid}/reclaim", {"unitIds": [U43]}).status == 200
        counts["units.reclaimed"] += 1
    future_batch(140, 0)
    terminate_all(grace=1)
    time.sleep(max(0, now + 6 - time.time()))  # both short terms have started and expired
    ended = [x for x in lab.reservations_all(state="ended") if x.get("endReason") == "term-expired"]
    c.eq("the two short terms expired by the clock", len(ended), 2)

    rc, _ = lab.stop()
    c.eq("a clean stop while the central API is down", rc, 0)
    counts["audit.checkpoint"] += 1  # CONTRACT §12: the chain grew, so the stop signs its head
    lab.start()
    future_batch(30, 300)
    terminate_all()  # test:/// starts from its XML again: the spot VMs run again
    lab.kill()
    depth, written = outbox_rows(lab)
    c.check(f"after SIGKILL every event is still in the outbox ({depth})", depth == written and depth >= 200, (depth, written))
    lab.start()
    future_batch(10, 400)
    terminate_all()
    # ... and the first start's inventory.changed, and what the agent found by itself: the demo's spot
    # VMs run on units no reservation releases while the test's reservations come and go (CONTRACT
    # §9, workload.unentitled: one event each time one is newly found so).
    counts["workload.unentitled"] = outbox_types(lab).get("workload.unentitled", 0)
    if not counts["workload.unentitled"]:
        del counts["workload.unentitled"]
    # Checkpoints: the stop's (counted above), the one the start after SIGKILL makes of the head the
    # killed agent left unsigned, and any an agent made of its first records within 30 s of a start
    # (CONTRACT §12); what the outbox holds, at least the first two.
    signed = outbox_types(lab).get("audit.checkpoint", 0)
    c.check(f"checkpoints: the stop's and the one after SIGKILL at least ({signed})", signed >= 2, signed)
    counts["audit.checkpoint"] = signed
    total = sum(counts.values()) + 1
    c.check("nothing reached the central API while it was down", fc.acked() == 0 and not fc.events, fc.acked())
    beats_down = len(fc.heartbeats)

    # --- the API comes back ---
    t_up = time.monotonic()
    fc.up()
    ok = fc.wait_for(lambda: fc.acked() >= total, 60)
    c.check(f"every event delivered once the API is back ({fc.acked()} of {total}, {time.monotonic() - t_up:.1f}s)", ok, fc.acked())
    seqs = sorted(fc.events)
    c.eq("seq dense from 1", seqs, list(range(1, total + 1)))
    firsts = list(dict.fromkeys(fc.arrivals))
    c.eq("delivered in seq order", firsts, sorted(firsts))
    dupes = len(fc.arrivals) - len(firsts)
    c.check(f"each event exactly once after dedup by seq ({dupes} resent)", len(firsts) == len(fc.events) == total, dupes)
    c.eq("the fake found nothing wrong in any request", fc.problems, [])
    got = collections.Counter(e["type"] for e in fc.events.values())
    want = dict(counts, **{"inventory.changed": 1})
    c.eq("the events are the changes made, by type", dict(got), want)
    bad = [(s, shape_problem(e)) for s, e in sorted(fc.events.items()) if shape_problem(e)]
    c.eq("each event's data is shaped per CONTRACT §6", bad[:5], [])
    c.eq("seq 1 is the first start's inventory", fc.events[1]["type"], "inventory.changed")
    # CONTRACT §12: each graceful termination's notice reached the central API before its outcome,
    # naming the same write-ahead record, with the deadline its grace gives.
    notices = {e["data"]["auditId"]: e for e in fc.events.values() if e["type"] == "workload.terminating"}
    outcomes = {e["data"]["auditId"]: e for e in fc.events.values() if e["type"] == "workload.terminated"}
    c.check(f"workload.terminating ({len(notices)}) each before its workload.terminated, deadline = at + 1 s",
            notices and all(a in outcomes and e["seq"] < outcomes[a]["seq"]
                            and L.parse_time(e["data"]["deadline"]) == L.parse_time(e["at"]) + 1
                            for a, e in notices.items()), list(notices.values())[:2])
    c.check("ids are unique", len({e["id"] for e in fc.events.values()}) == total, total)
    sizes = [len(b) for _, b, _ in fc.batches]
    c.check(f"batches of at most 500 events ({sizes})", len(sizes) >= 2 and max(sizes) == 500, sizes)

    empty = fc.wait_for(lambda: outbox_rows(lab)[0] == 0, 5)
    c.check("the outbox table is empty after the last ack", empty, outbox_rows(lab))
    hb = fc.wait_for(lambda: [b for b in fc.heartbeats[beats_down:] if b["body"]["outboxDepth"] == 0
                              and b["body"]["oldestUndeliveredAt"] is None], 5)
    c.check("a heartbeat says outboxDepth 0", hb, [b["body"]["outboxDepth"] for b in fc.heartbeats[-3:]])
    log = fc.wait_for(lambda: "heartbeats are answered again" in lab.log() and lab.log(), 3) or lab.log()
    c.check("log: the failures while down", "event delivery failed (transport)" in log, lab.tail(400))
    line = next((x for x in log.splitlines() if "after an outage of" in x), "")
    c.check(f"log: {line[line.find('central:'):]!r}", line.endswith("s") and float(line.rsplit(" ", 1)[1][:-1]) >= 5
            and f"delivered {total} events" in line, line)
    c.check("log: heartbeats failed while down, then answered again",
            "central: heartbeat failed" in log and "heartbeats are answered again" in log, lab.tail(400))
    lab.stop()


if __name__ == "__main__":
    sys.exit(L.run_with_central("outage", body))
