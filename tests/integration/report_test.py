#!/usr/bin/env python3
"""Reporting to the central API (CONTRACT §6, §7 TLS, Inventory and heartbeat) against the fake
central API of tests/central/fake_central.py, over real mTLS:
  - the first start delivers inventory.changed as seq 1 and a heartbeat arrives; a new event is
    delivered well under a second after its change;
  - a stalled heartbeat never delays events;
  - each fault of the central API (500, 429 with Retry-After, 400, a connection dropped in the
    middle of the body, partial acknowledgements) ends in full delivery, each event once after
    dedup by seq, with the log lines an operator sees;
  - a stalled events request times out (30 s) while heartbeats keep arriving, their revision never
    going back and catching up with the API's;
  - the fake refuses a client without the right certificate (mTLS is real), and SIGHUP with a new
    client certificate takes effect (a bad file is refused and the old one kept).

    report_test.py PATH/TO/gpunode-agent"""
import os
import signal
import sqlite3
import sys
import time

sys.dont_write_bytecode = True
import lab as L  # noqa: E402

U81, UA1 = "u-0000-81-00-0", "u-0000-a1-00-0"


def body(c, lab, fc):
    day = 86400
    n = [0]

    def change():
        """One reservation in the future on a device-request unit: one event. Returns the outbox's last
        seq after it: its event's, or an audit.checkpoint's stored since (the agent signs the first
        record after start within 30 s, CONTRACT §12), which is delivered after it."""
        n[0] += 1
        starts = time.time() + day * (10 + n[0])
        r = lab.create(None, unitIds=[U81 if n[0] % 2 else UA1], audienceOrgIds=["org-a"],
                       startsAt=L.rfc3339(starts), endsAt=L.rfc3339(starts + 3600))
        assert r.status == 201, r
        db = sqlite3.connect(f"file:{os.path.join(lab.state, 'state.db')}?mode=ro", uri=True)
        try:
            return int(db.execute("SELECT value FROM meta WHERE key = 'event_seq'").fetchone()[0])
        finally:
            db.close()

    def delivered(seq, timeout):
        return fc.wait_for(lambda: fc.acked() >= seq, timeout)

    def revision():
        r = lab.get(lab.npath("/state"), unix=True)
        return r.json["revision"]

    # --- (a) first start: inventory.changed as seq 1, a heartbeat ---
    lab.write_config(lab.config_text(central=lab.central_text(fc.url)))
    lab.start()
    c.check("first start: seq 1 delivered within 5 s", delivered(1, 5), fc.acked())
    e1 = fc.events.get(1) or {}
    c.eq("seq 1 is inventory.changed", e1.get("type"), "inventory.changed")
    units = (e1.get("data") or {}).get("units") or []
    c.eq("inventory.changed lists every unit", sorted(u.get("id") for u in units), L.ALL_UNITS)
    c.check("inventory.changed units carry reservationIds", all("reservationIds" in u for u in units), units[:1])
    hb = fc.wait_for(lambda: list(fc.heartbeats), 5)
    c.check("a heartbeat arrives at start", hb, fc.heartbeats)
    h = hb[0]["body"] if hb else {}
    c.check("the heartbeat's keys and values",
            h.get("nodeId") == L.NODE and isinstance(h.get("version"), str) and isinstance(h.get("revision"), int)
            and h.get("libvirt") in ("connected", "disconnected") and isinstance(h.get("outboxDepth"), int)
            and "oldestUndeliveredAt" in h and L.parse_time(h.get("at")) is not None, h)
    c.eq("the client certificate the agent presents", hb[0]["cn"] if hb else None, "central")
    t0 = time.monotonic()
    s = change()
    ok = delivered(s, 5)
    took = time.monotonic() - t0
    c.check(f"a new event is delivered well under a second after its change ({took:.3f}s)", ok and took < 1.0, took)
    c.check("log: reporting on, first delivery", "central: reporting to https://127.0.0.1" in lab.log()
            and "central: first delivery" in lab.log(), lab.tail())

    # --- a stalled heartbeat never delays events ---
    fc.set_hb_mode("stall")
    time.sleep(1.2)  # a heartbeat is stalled now
    t0 = time.monotonic()
    s = change()
    ok = delivered(s, 5)
    took = time.monotonic() - t0
    c.check(f"events flow while heartbeats stall ({took:.3f}s)", ok and took < 1.0, took)
    fc.set_hb_mode("ok")

    # --- (c) each fault, ending in full delivery ---
    def fault(mode, times, label, logline, min_gap=0.0):
        before = len(fc.attempts)
        fc.fail(mode, times)
        s = change()
        ok = delivered(s, 20)
        c.check(f"{label}: every event delivered in the end", ok, (fc.acked(), s, fc.attempts[before:]))
        modes = [m for _, m, _ in fc.attempts[before:]]
        c.eq(f"{label}: the fault was met {times} time(s), then it succeeded", (modes.count(mode), modes[-1] if modes else None),
             (times, "ok"))
        if min_gap:
            ts = [t for t, _, _ in fc.attempts[before:]]
            gaps = [b - a for a, b in zip(ts, ts[1:])]
            c.check(f"{label}: Retry-After honoured (each retry {min_gap}s or more later)", gaps and min(gaps) >= min_gap - 0.05, gaps)
        if logline:
            c.check(f"{label}: logged as {logline!r}", logline in lab.log(), lab.tail(600))

    fault("500", 2, "500", "event delivery failed (5xx): HTTP 500")
    fault("429", 2, "429 with Retry-After: 1", "event delivery failed (429): HTTP 429", min_gap=1.0)
    t_before = len([x for x in lab.log().splitlines() if "refused (4xx)" in x])
    fault("400", 2, "400 (held, retried after Retry-After)", "refused (4xx): HTTP 400", min_gap=1.0)
    lines_400 = [x for x in lab.log().splitlines() if "refused (4xx)" in x]
    c.check("400: an error line for each refusal", len(lines_400) - t_before == 2 and all(" error " in x for x in lines_400), lines_400)
    fault("drop", 2, "connection dropped in the middle of the body", None)
    c.check("recovery is logged", "central: delivered" in lab.log() and "after an outage of" in lab.log(), lab.tail(600))

    # partial acknowledgements: several events in one batch, one stored per request
    fc.set_mode("500")
    first = fc.acked() + 1
    last = first
    for _ in range(4):
        last = change()
    time.sleep(0.3)
    fc.set_mode("partial:1")
    fc.wait_for(lambda: fc.acked() >= last, 30)
    fc.set_mode("ok")
    c.check("partial acks: every event delivered in the end", delivered(last, 20), (fc.acked(), last))
    resent = [b for _, b, _ in fc.batches if b and b[0] <= last and b[-1] >= first and len(b) > 1]
    c.check("partial acks: the unacknowledged rest was sent again, from the first unacknowledged seq",
            len(resent) >= 2 and all(b2[0] == b1[0] + 1 for b1, b2 in zip(resent, resent[1:])), resent)
    c.check("log: partial acknowledgement", "partial acknowledgement" in lab.log(), lab.tail(600))

    # --- (d) a stalled events request: heartbeats go on, revisions never go back ---
    hb_before = len(fc.heartbeats)
    timeouts_before = lab.log().count("timed out")  # earlier retries may have logged one already
    fc.set_mode("stall")
    t0 = time.monotonic()
    s1 = change()
    time.sleep(2)
    s2 = change()
    rev = revision()
    timed_out = fc.wait_for(lambda: lab.log().count("timed out") > timeouts_before, 40, step=0.2)
    c.check("a stalled request times out after about 30 s", timed_out and 28 <= time.monotonic() - t0 <= 40, time.monotonic() - t0)
    fc.set_mode("ok")
    c.check("after the stall: every event delivered", delivered(s2, 15), (fc.acked(), s2))
    beats = fc.heartbeats[hb_before:]
    revs = [b["body"]["revision"] for b in beats]
    c.check(f"heartbeats keep arriving while events are retried ({len(beats)} in {time.monotonic() - t0:.0f}s)", len(beats) >= 20, len(beats))
    c.check("heartbeat revisions never go back", all(b >= a for a, b in zip(revs, revs[1:])), revs)
    c.check("heartbeats carry the revision of the latest change", revs and max(revs) >= rev, (revs[-3:], rev))
    c.check("heartbeats show the waiting events", any(b["body"]["outboxDepth"] >= 2 and b["body"]["oldestUndeliveredAt"] for b in beats),
            [b["body"]["outboxDepth"] for b in beats][:10])
    c.check("seqs of the stalled events came once each after dedup", s1 in fc.events and s2 in fc.events, (s1, s2))

    # --- (e) mTLS is real: a client without the right certificate is refused ---
    import ssl
    import http.client
    for label, cert in (("no client certificate", None), ("a certificate of another CA", "rogue")):
        ctx = ssl.create_default_context(cafile=f"{lab.dir}/tls.crt")
        if cert:
            lab.make_ca("rogueca", "rogue CA")
            lab.make_client_cert("rogue", L.NODE, ca="rogueca")
            ctx.load_cert_chain(f"{lab.dir}/rogue.crt", f"{lab.dir}/rogue.key")
        conn = http.client.HTTPSConnection("127.0.0.1", fc.port, context=ctx, timeout=5)
        got = None
        try:
            conn.request("POST", f"/v1/nodes/{L.NODE}/events", body=b'{"nodeId":"x","events":[]}',
                         headers={"Content-Type": "application/json"})
            got = conn.getresponse().status
        except (ssl.SSLError, OSError) as e:
            got = type(e).__name__
        finally:
            conn.close()
        c.check(f"the fake refuses {label} (no HTTP answer)", not isinstance(got, int), got)

    # --- (f) SIGHUP: a bad file is refused, a new certificate takes effect ---
    def reload(text):
        mark = lab.log().count("reload")
        lab.write_config(text)
        lab.signal(signal.SIGHUP)
        fc.wait_for(lambda: lab.log().count("reload") > mark, 5)

    reload(lab.config_text(central=lab.central_text(fc.url).replace(f"{lab.dir}/client.key", f"{lab.dir}/missing.key")))
    c.check("SIGHUP with a missing client key: refused, logged at central.client_key's position",
            f"reload refused: {lab.cfg}:" in lab.log() and f"{lab.dir}/missing.key: missing" in lab.log(), lab.tail(400))
    s = change()
    c.check("... and the old certificate is still used", delivered(s, 5) and fc.batches[-1][2] == "central", fc.batches[-1:])

    lab.make_client_cert("rotated", "central-rotated")
    reload(lab.config_text(central=lab.central_text(fc.url, client="rotated")))
    s = change()
    c.check("SIGHUP with a new client certificate: the next request presents it",
            delivered(s, 5) and fc.batches[-1][2] == "central-rotated", fc.batches[-1:])
    fc.wait_for(lambda: fc.heartbeats[-1]["cn"] == "central-rotated", 3)
    c.eq("heartbeats present it too", fc.heartbeats[-1]["cn"], "central-rotated")

    hs_before = len(fc.handshake_failures)
    reload(lab.config_text(central=lab.central_text(fc.url, client="rogue")))
    s = change()
    time.sleep(2)
    c.check("SIGHUP to a certificate the central API does not trust: nothing is delivered, the handshakes fail",
            fc.acked() < s and len(fc.handshake_failures) > hs_before, (fc.acked(), s, fc.handshake_failures[hs_before:][:2]))
    c.check("log: a transport failure", "event delivery failed (transport)" in lab.log(), lab.tail(400))
    reload(lab.config_text(central=lab.central_text(fc.url, client="rotated")))
    c.check("back to a trusted certificate: delivered", delivered(s, 70), (fc.acked(), s))

    # --- the end: nothing wrong on the wire, an orderly stop ---
    seqs = sorted(fc.events)
    c.eq("seqs dense from 1", seqs, list(range(1, len(seqs) + 1)))
    firsts = list(dict.fromkeys(fc.arrivals))
    c.eq("first arrivals in seq order", firsts, sorted(firsts))
    c.eq("the fake found nothing wrong in any request", fc.problems, [])
    fc.set_mode("stall")
    change()
    time.sleep(0.3)
    rc, took = lab.stop()
    c.check(f"SIGTERM with a stalled central API: stops promptly ({took:.2f}s)", rc == 0 and took < 5, (rc, took))


if __name__ == "__main__":
    sys.exit(L.run_with_central("report", body))
