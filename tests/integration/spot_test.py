#!/usr/bin/env python3
"""The spot market over HTTPS and the admin socket, with libvirt's test driver holding real domains
(tests/fixtures/libvirt/spot_node.xml on the demo host): unit-occupied and spotWorkloads on create,
capacity views for the audience, an outsider and the manager, admission answers, release, every
reach rule of terminate-spot, reclaim with and without terminateSpot, reclaiming until vacated, the
termination record in the domain, the audit chain (CONTRACT §4, §5, §7).

    spot_test.py PATH/TO/gpunode-agent"""
import os
import sqlite3
import json
import sys
import time

sys.dont_write_bytecode = True
import lab as L  # noqa: E402

XML = os.path.join(L.FIXTURES, "libvirt", "spot_node.xml")
U23, U24, U43, U81 = "u-0000-23-00-0", "u-0000-24-00-0", "u-0000-43-00-0", "u-0000-81-00-0"


def names(lst):
    return sorted(x.get("name") for x in lst)


def by_name(lst, name):
    return next((x for x in lst if x.get("name") == name), None)


def events(state_dir, typ):
    db = sqlite3.connect(f"file:{os.path.join(state_dir, 'state.db')}?mode=ro", uri=True)
    try:
        return [json.loads(e) for (e,) in db.execute("SELECT event FROM outbox ORDER BY seq")
                if json.loads(e)["type"] == typ]
    finally:
        db.close()


def body(c, lab):
    lab.write_config(lab.config_text().replace("uri: test:///default", f"uri: test://{XML}"))
    lab.start()
    admin, oper, owner = lab.admin(), lab.token(org="org-platform", roles=["platform-operator"]), lab.token(org=L.OWNER)
    mgr, aud, outsider = lab.token(org="org-mgr"), lab.token(org="org-aud"), lab.token(org="org-x")
    N = lab.npath
    ts = N("/terminate-spot")

    def post(path, token, payload, **kw):
        return lab.call("POST", path, token=token, body=payload, unix=token is None, **kw)

    # --- workloads as libvirt has them ---
    w = lab.get(N("/workloads"), owner)
    c.status("workloads as the owner", w, 200)
    ws = w.json["workloads"] if w.status == 200 else []
    c.eq("workloads: every domain, shut-off ones too", names(ws), sorted(
        ["spot-b-23", "spot-b-two", "spot-c-pair", "spot-d-free", "od-acme-24", "rsv-aud-43", "legacy-24", "malformed-24", "off-spot-23"]))
    two = by_name(ws, "spot-b-two") or {}
    c.eq("workloads: a VM with hostdevs of two units", two.get("unitIds"), [U23, U24])
    c.eq("workloads: the paired unit's VM", (by_name(ws, "spot-c-pair") or {}).get("unitIds"), [U43])
    bad = by_name(ws, "malformed-24") or {}
    c.eq("workloads: malformed metadata is unlabelled", (bad.get("vmId"), bad.get("org"), bad.get("tier")), (None, None, None))
    c.eq("workloads: the shut-off VM", (by_name(ws, "off-spot-23") or {}).get("state"), "shutoff")

    # --- create: unit-occupied, spotWorkloads ---
    end = L.rfc3339(time.time() + 86400)
    r = lab.create(admin, unitIds=[U24], audienceOrgIds=["org-aud"], endsAt=end)
    c.problem("create on 24: unit-occupied", r, 409, "unit-occupied")
    c.eq("unit-occupied names the on-demand VM of an outsider, the unlabelled and the malformed VM",
         names((r.json or {}).get("workloads", [])), ["legacy-24", "malformed-24", "od-acme-24"])
    r = lab.create(admin, unitIds=[U23, U43], audienceOrgIds=["org-aud"], managingOrgIds=["org-mgr"], endsAt=end)
    c.status("create on 23 and 43 (spot VMs and the audience's own reserved VM only)", r, 201)
    rid = (r.json or {}).get("id", "")
    c.eq("create: spotWorkloads", names((r.json or {}).get("spotWorkloads", [])), ["spot-b-23", "spot-b-two", "spot-c-pair"])
    R = N(f"/reservations/{rid}")

    # --- capacity ---
    def cap(org):
        r = lab.get(N(f"/capacity?org={org}"), oper)
        return {e["unitId"]: (e["tier"], e["reservationId"]) for e in (r.json or {}).get("units", [])} if r.status == 200 else None
    ca = cap("org-aud")
    c.check("capacity for the audience: its reserved units with the reservation", ca and ca.get(U23) == ("reserved", rid) and ca.get(U43) == ("reserved", rid), ca)
    c.check("capacity for the audience: unreserved units on demand", ca and ca.get(U24) == ("on-demand", None), ca)
    for who in ("org-x", "org-mgr"):
        co = cap(who)
        c.check(f"capacity for {who}: nothing of the reservation, not even its units", co is not None and U23 not in co and U43 not in co, co)
    c.status("capacity as the owner: 403", lab.get(N("/capacity?org=org-aud"), owner), 403, "forbidden")

    # --- who may terminate, before anything is released ---
    c.status("terminate-spot as the operator: 403", post(ts, oper, {}), 403, "forbidden")
    c.status("terminate-spot as the audience: 403", post(ts, aud, {}), 403, "forbidden")
    c.status("terminate-spot as an outsider: 404", post(ts, outsider, {}), 404, "not-found")
    c.status("terminate-spot without a token: 401", post(ts, "", {}), 401)
    r = post(ts, mgr, {})
    c.check("terminate-spot as the manager with nothing released: nothing in reach",
            r.status == 200 and r.json == {"terminated": [], "leftRunning": []}, r)
    c.status("terminate-spot: a held, unreleased unit is out of the manager's reach", post(ts, mgr, {"unitIds": [U23]}), 403, "out-of-reach")
    c.status("terminate-spot: gracePeriodSeconds 301", post(ts, admin, {"gracePeriodSeconds": 301}), 400, "invalid-request")
    c.status("terminate-spot: an unknown unit", post(ts, admin, {"unitIds": ["u-0000-99-00-0"]}), 422, "unknown-unit")

    # --- release; admission ---
    r = post(R + "/release", mgr, {"unitIds": [U23]})
    c.check("release 23 as the manager", r.status == 200 and r.json["reservation"]["releasedUnitIds"] == [U23], r)
    co = cap("org-x")
    c.eq("capacity for an outsider: the released unit as spot, no reservation named", (co or {}).get(U23), ("spot", None))
    def admit(org, tier, units):
        r = post(N("/admission"), oper, {"orgId": org, "tier": tier, "unitIds": units})
        return (r.json["allowed"], [(x["code"], x["unitId"]) for x in r.json["reasons"]]) if r.status == 200 else r
    c.eq("admission: spot on the released unit", admit("org-x", "spot", [U23]), (True, []))
    c.eq("admission: on-demand on a reserved unit", admit("org-x", "on-demand", [U23, U24]), (False, [("unit-reserved", U23)]))
    c.eq("admission: reserved tier on a released unit", admit("org-aud", "reserved", [U23, U43]), (False, [("unit-released", U23)]))
    c.eq("admission: spot on a held unit", admit("org-x", "spot", [U43]), (False, [("not-released", U43)]))

    # --- the manager's reach: the released unit only ---
    c.status("terminate-spot: 43 is still out of the manager's reach", post(ts, mgr, {"unitIds": [U43]}), 403, "out-of-reach")
    r = post(ts, mgr, {"reason": "capacity back"})
    c.status("terminate-spot as the manager", r, 200)
    j = r.json or {}
    c.eq("manager: terminated the spot VM wholly on 23", names(j.get("terminated", [])), ["spot-b-23"])
    left = {x["name"]: (x["vmId"], x["unitIds"], x["tier"], x["reason"]) for x in j.get("leftRunning", [])}
    c.eq("manager: the VM on 23 and 24 is out of reach, listed with the reached unit only",
         left, {"spot-b-two": ("vm-b-two", [U23], "spot", "out-of-reach")})
    t = (j.get("terminated") or [{}])[0]
    c.check("terminated entry keys", set(t) == {"vmId", "domainUuid", "name", "unitIds"}, t)
    ws = {x["name"]: x for x in lab.get(N("/workloads"), admin).json["workloads"]}
    c.eq("spot-b-23 is down with capacity-reclaim", (ws["spot-b-23"]["state"], ws["spot-b-23"]["terminationReason"]), ("shutoff", "capacity-reclaim"))
    c.eq("spot-b-two still runs", ws["spot-b-two"]["state"], "running")
    recs = [x for x in lab.audit_all() if x["action"] == "workload.terminate" and x["vmIds"] == ["vm-b-23"]]
    c.check("the termination is audited ahead and on its outcome, by the manager",
            len(recs) == 2 and all(x["actor"]["org"] == "org-mgr" and x["reservationId"] == rid for x in recs) and
            "capacity back" in recs[0]["detail"], recs)
    ev = events(lab.state, "workload.terminated")
    c.check("workload.terminated event: by, auditId, reason, reservationId",
            len(ev) == 1 and ev[0]["data"]["by"] == "org-mgr" and ev[0]["data"]["auditId"] == (recs[0]["id"] if recs else None)
            and ev[0]["data"]["reason"] == "capacity-reclaim" and ev[0]["data"]["reservationId"] == rid, ev)

    # --- reclaim without terminateSpot: reclaiming until vacated ---
    r = post(R + "/reclaim", mgr, {"unitIds": [U23], "terminateSpot": False})
    c.check("reclaim 23 without terminateSpot: reclaiming while spot-b-two runs",
            r.status == 200 and r.json["reservation"]["reclaimingUnitIds"] == [U23] and r.json["reservation"]["releasedUnitIds"] == []
            and r.json["terminated"] == [] and r.json["leftRunning"] == [], r)
    c.check("capacity: a reclaiming unit is not spot any more", U23 not in (cap("org-x") or {}), cap("org-x"))
    c.status("a reclaiming unit stays in the manager's reach", post(ts, mgr, {"unitIds": [U24]}), 403, "out-of-reach")
    r = post(ts, owner, {"unitIds": [U23]})
    c.check("the owner terminates on 23: spot-b-two goes (the owner reaches 24 too)",
            r.status == 200 and names(r.json["terminated"]) == ["spot-b-two"], r)
    got = lab.get(R, admin).json.get("reclaimingUnitIds")
    c.eq("reclaimingUnitIds empties at once after the agent's own termination", got, [])

    # --- reclaim with terminateSpot on the paired unit ---
    c.status("release 43 as the manager", post(R + "/release", mgr, {"unitIds": [U43]}), 200)
    r = post(R + "/reclaim", mgr, {"unitIds": [U43], "terminateSpot": True})
    j = r.json or {}
    c.check("reclaim 43 with terminateSpot: the spot VM on the pair goes, the audience's reserved VM stays",
            r.status == 200 and names(j.get("terminated", [])) == ["spot-c-pair"] and
            [(x["name"], x["reason"]) for x in j.get("leftRunning", [])] == [("rsv-aud-43", "not-spot")] and
            j["reservation"]["reclaimingUnitIds"] == [] and j["reservation"]["releasedUnitIds"] == [], r)
    c.status("reclaim on a unit that is not released: a no-op", post(R + "/reclaim", mgr, {"unitIds": [U43]}), 200)
    c.status("reclaim as the audience: 403", post(R + "/reclaim", aud, {"unitIds": [U43]}), 403, "forbidden")
    c.status("reclaim of a unit not in the reservation: 422", post(R + "/reclaim", mgr, {"unitIds": [U24]}), 422, "unknown-unit")

    # --- the admin socket over the whole node ---
    r = post(ts, None, {"gracePeriodSeconds": 0})
    j = r.json or {}
    c.check("terminate-spot on the admin socket: the spot VM on the unreserved unit goes", r.status == 200 and
            names(j.get("terminated", [])) == ["spot-d-free"], r)
    left = {x["name"]: (x["vmId"], x["tier"], x["reason"]) for x in j.get("leftRunning", [])}
    c.eq("admin socket: every other running VM is left, unlabelled ones with vmId and tier null", left, {
        "od-acme-24": ("vm-acme-24", "on-demand", "not-spot"), "rsv-aud-43": ("vm-aud-43", "reserved", "not-spot"),
        "legacy-24": (None, None, "not-spot"), "malformed-24": (None, None, "not-spot")})
    ev = events(lab.state, "workload.terminated")
    c.eq("the admin socket's terminations are by local:UID", ev[-1]["data"]["by"] if ev else None, f"local:{os.getuid()}")
    c.eq("four workload.terminated events", len(ev), 4)
    ws = {x["name"]: x for x in lab.get(N("/workloads"), admin).json["workloads"]}
    c.eq("non-spot VMs are untouched", sorted(n for n, x in ws.items() if x["state"] == "running"),
         ["legacy-24", "malformed-24", "od-acme-24", "rsv-aud-43"])
    c.check("no termination record on a VM that is not spot", all(ws[n]["terminationReason"] is None for n in
            ("legacy-24", "malformed-24", "od-acme-24", "rsv-aud-43", "off-spot-23")), ws)
    problems = L.verify_chain(lab.audit_all())
    c.check("the audit chain is intact", not problems, problems[:3])
    lab.stop()


if __name__ == "__main__":
    def main(c, agent):
        with L.Lab(agent) as lab:
            body(c, lab)
    sys.exit(L.run_main("spot", main))
