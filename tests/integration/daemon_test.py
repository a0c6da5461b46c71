#!/usr/bin/env python3
"""The daemon's life with systemd and the host: sd_notify (READY=1, WATCHDOG=1, STOPPING=1),
discovery in the daemon (a unit that disappears stays listed as absent and keeps its
reservation; the admin socket's rescan), and the outbox: every change is stored as an event, in
seq order from 1, in the same state file.

    daemon_test.py PATH/TO/gpunode-agent"""
import json
import os
import shutil
import socket
import sqlite3
import sys
import threading
import time

sys.dont_write_bytecode = True
import lab as L  # noqa: E402

GONE = "u-0000-24-00-0"  # an L40S of the demo host that we pull out of the tree


def notifications(sock, seconds):
    """Datagrams received on the notify socket within `seconds`."""
    got, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            got.append(sock.recv(4096).decode(errors="replace"))
        except socket.timeout:
            break
    return got


def events(state_dir):
    db = sqlite3.connect(f"file:{os.path.join(state_dir, 'state.db')}?mode=ro", uri=True)
    try:
        return [(seq, json.loads(e)) for seq, e in db.execute("SELECT seq, event FROM outbox ORDER BY seq")]
    finally:
        db.close()


def state_long_poll(c, lab):
    """GET .../state: the revision, ETag/304, and ?after=REV&wait= (CONTRACT §4, §7 Long-poll)."""
    admin = lab.admin()
    r = lab.get(lab.npath("/state"), admin)
    c.status("state as the admin", r, 200)
    body = r.json if isinstance(r.json, dict) else {}
    c.check("state: revision, units, reservations, workloads", isinstance(body.get("revision"), int) and
            all(isinstance(body.get(k), list) for k in ("units", "reservations", "workloads")), sorted(body))
    rev = body.get("revision")
    c.status("state: If-None-Match with its ETag", lab.get(lab.npath("/state"), admin, headers={"If-None-Match": r.h("etag")}), 304)
    c.status("state as the operator", lab.get(lab.npath("/state"), lab.token(org="org-platform", roles=["platform-operator"])), 200)
    c.status("state as the owner: 403", lab.get(lab.npath("/state"), lab.token(org=L.OWNER)), 403)
    c.status("state: wait over 120s is 400", lab.get(lab.npath("/state?wait=121s"), admin), 400, "invalid-request")
    c.status("state: after past the revision answers at once", lab.get(lab.npath(f"/state?after={rev - 1}"), admin), 200)
    t0 = time.monotonic()
    timed_out = lab.get(lab.npath(f"/state?after={rev}&wait=1s"), admin)
    took = time.monotonic() - t0
    c.check("state: nothing changes within the wait: 304 after it", timed_out.status == 304 and 0.9 <= took < 3,
            (timed_out.status, round(took, 2)))

    def later():
        time.sleep(0.5)
        lab.create(admin, unitIds=["u-0000-81-00-0"], audienceOrgIds=["org-x"], endsAt=L.rfc3339(time.time() + 3600))

    t = threading.Thread(target=later)
    t.start()
    t0 = time.monotonic()
    woken = lab.get(lab.npath(f"/state?after={rev}&wait=20s"), admin)
    took = time.monotonic() - t0
    t.join()
    c.check("state: a change wakes the long poll at once with the new revision",
            woken.status == 200 and woken.json.get("revision", 0) > rev and took < 3, (woken.status, round(took, 2)))


def main(c, agent):
    with L.Lab(agent) as lab:
        notify_path = os.path.join(lab.dir, "notify.sock")
        ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        ns.bind(notify_path)
        try:
            lab.start(env={"NOTIFY_SOCKET": notify_path, "WATCHDOG_USEC": "400000"})
            got = notifications(ns, 1.0)
            c.check("sd_notify: READY=1 once serving", any("READY=1" in m for m in got), got)
            c.check("sd_notify: the watchdog is petted (WATCHDOG_USEC 0.4 s -> a pet every 0.2 s)",
                    sum("WATCHDOG=1" in m for m in got) >= 3, got)
            # `run` is parsed by the tools module, which the executable unloads before the daemon
            # module runs (agent/module_abi.hpp): a daemon running for months maps no parser.
            with open(f"/proc/{lab.pid}/maps") as f:
                mapped = {line.split()[-1].rsplit("/", 1)[-1] for line in f if "/" in line}
            c.check("the running daemon maps its module and not the tools module",
                    "gpunode-agent-daemon.so" in mapped and "gpunode-agent-tools.so" not in mapped,
                    sorted(m for m in mapped if m.startswith("gpunode")))

            admin = lab.admin()
            # The scheduler's long polls with the default wait (30 s) and the longest (120 s), for a
            # revision that never comes: 304 at their own deadline, never cut short by a generic
            # timeout, re-parked by every change the rest of this test makes (CONTRACT §7).
            polls = {}

            def long_poll(name, query):
                t0 = time.monotonic()
                try:
                    r = lab.get(lab.npath(f"/state?after=1000000000{query}"), admin, timeout=150)
                    polls[name] = (r.status, time.monotonic() - t0)
                except Exception as e:  # noqa: BLE001 - reported as the check's value
                    polls[name] = (repr(e), time.monotonic() - t0)
            pollers = [threading.Thread(target=long_poll, args=("default", "")),
                       threading.Thread(target=long_poll, args=("120s", "&wait=120s"))]
            for t in pollers:
                t.start()
            r = lab.create(admin, unitIds=[GONE], audienceOrgIds=["org-aud"], endsAt=L.rfc3339(time.time() + 86400))
            c.status("create a reservation on the unit that will disappear", r, 201)
            rid = r.json.get("id") if isinstance(r.json, dict) else None
            before = lab.call("GET", "/healthz", unix=True).json.get("revision")

            # the GPU leaves the host (as on a hot-unplug or a fallen-off-the-bus card)
            os.unlink(os.path.join(lab.root, "sys", "bus", "pci", "devices", "0000:24:00.0"))
            resc = lab.call("POST", "/v1/admin/rescan", unix=True)
            c.status("admin socket: POST /v1/admin/rescan", resc, 200)
            units = {u["id"]: u for u in lab.get(lab.npath("/units"), admin).json.get("units", [])}
            g = units.get(GONE, {})
            c.check("the unit stays listed", GONE in units, sorted(units))
            c.check("...with absent among its reasons, not reservable, not sellable",
                    "absent" in [x.get("code") for x in g.get("notReservableReasons", [])] and g.get("reservable") is False
                    and g.get("sellable") is False, g)
            c.eq("...and keeps its reservation", g.get("reservationIds"), [rid])
            after = lab.call("GET", "/healthz", unix=True).json.get("revision")
            c.check("the revision grew", isinstance(before, int) and isinstance(after, int) and after > before,
                    (before, after))
            recs = lab.audit_all(admin)
            absent = [x for x in recs if x.get("action") == "unit.absent"]
            c.check("unit.absent is audited by the agent itself", len(absent) == 1 and absent[0]["unitIds"] == [GONE]
                    and absent[0]["actor"] == {"sub": "gpunode-agent", "org": None, "roles": [], "via": "agent"}
                    and absent[0]["requestId"] is None, absent)
            c.check("the audit chain still recomputes", recs and not L.verify_chain(recs), L.verify_chain(recs))

            again = lab.call("POST", "/v1/admin/rescan", unix=True)
            c.status("a second rescan with nothing new", again, 200)
            c.eq("...changes nothing", lab.call("GET", "/healthz", unix=True).json.get("revision"), after)
            c.status("rescan over HTTPS is not a route", lab.call("POST", "/v1/admin/rescan", admin), 404)
            state_long_poll(c, lab)

            for t in pollers:
                t.join(160)
            st, took = polls.get("default", (None, 0))
            c.check("long poll, default wait: 304 after 30 s", st == 304 and 29.5 <= took < 33, (st, round(took, 2)))
            st, took = polls.get("120s", (None, 0))
            c.check("long poll, wait=120s: 304 after 120 s", st == 304 and 119.5 <= took < 123, (st, round(took, 2)))

            ns.settimeout(0.1)
            while True:  # drain
                try:
                    ns.recv(4096)
                except socket.timeout:
                    break
            rc, took = lab.stop()
            c.eq("SIGTERM: exit 0", rc, 0)
            got = notifications(ns, 0.3)
            c.check("sd_notify: STOPPING=1 on SIGTERM", any("STOPPING=1" in m for m in got), got)
        finally:
            ns.close()

        ev = events(lab.state)
        seqs = [s for s, _ in ev]
        c.eq("outbox: seq from 1, growing by exactly 1", seqs, list(range(1, len(seqs) + 1)))
        c.check("outbox: every event's seq is its row's", all(e.get("seq") == s for s, e in ev), ev[:2])
        types = [e.get("type") for _, e in ev]
        c.eq("outbox: first start, the reservation, the unit going absent, the long poll's reservation, and the "
             "stop's signed checkpoint (CONTRACT §12)",
             types, ["inventory.changed", "reservation.created", "inventory.changed", "reservation.created",
                     "audit.checkpoint"])
        inv = ev[2][1]["data"].get("units", []) if len(ev) > 2 else []
        gone = [u for u in inv if u.get("id") == GONE]
        c.check("inventory.changed lists every unit as an admin sees it, the absent one with its reservation",
                len(inv) == 7 and gone and gone[0]["reservationIds"] == [rid], gone)
        c.check("events carry id, type, at and data", all(set(e) >= {"seq", "id", "type", "at", "data"} for _, e in ev))

        # a restart on the same state dir with the unit still gone: no new inventory event
        lab.start()
        lab.stop()
        c.eq("a restart with the same answer sends no inventory.changed", len(events(lab.state)), len(ev))
        # the card comes back
        shutil.rmtree(os.path.join(lab.dir, "host"))
        L.sh([sys.executable, os.path.join(L.FIXTURES, "mkhost.py"), L.DEMO_HOST, lab.root])
        lab.start()
        units = {u["id"]: u for u in lab.get(lab.npath("/units"), lab.admin()).json.get("units", [])}
        c.check("a unit that comes back is reservable again, still holding its reservation",
                units.get(GONE, {}).get("reservable") is True and units[GONE]["reservationIds"] == [rid], units.get(GONE))
        lab.stop()
        c.eq("...and that is one more inventory.changed", [e["type"] for _, e in events(lab.state)][len(ev):],
             ["inventory.changed"])


if __name__ == "__main__":
    sys.exit(L.run_main("daemon", main))
