#!/usr/bin/env python3
"""The HTTPS API and the admin socket of a running gpunode-agent, against CONTRACT §4 and §7.

Usage: api_test.py PATH/TO/gpunode-agent

Parts: the access matrix (every route x every relation, plus every kind of bad token), the
admin socket, the reservation rules end to end, terms applied by the clock while nobody calls,
the audit hash chain, and request limits / slow clients. One line per check, then
`N passed, M failed`; exit 1 on any failure.
"""
import json
import os
import socket
import ssl
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab as L  # noqa: E402

DAY = 86400
AGENT_ACTOR = {"sub": "gpunode-agent", "org": None, "roles": [], "via": "agent"}

# the callers; each relation is a token (None: no token)
ORG_MGR, ORG_AUD, ORG_AUD2, ORG_MGR2, ORG_OTHER = "org-mgr", "org-aud", "org-aud2", "org-mgr2", "org-other"


def rbody(units, aud, mgr=(), start=None, end=None, note=None):
    b = {"unitIds": list(units), "audienceOrgIds": list(aud), "managingOrgIds": list(mgr)}
    if start is not None:
        b["startsAt"] = L.rfc3339(start)
    if end is not None:
        b["endsAt"] = L.rfc3339(end)
    if note is not None:
        b["note"] = note
    return b


class Ids:
    def __init__(self):
        self.n = 0
        self.sent = []  # (request id, response)

    def next(self):
        self.n += 1
        return f"integ-req-{self.n}"


def access_matrix(c, lab, rid):
    now = time.time()
    # R1: active, audience org-aud, managed by org-mgr; R2: active, another audience and manager;
    # R3: a far-future one the admin ends; all made over the admin socket.
    r1 = lab.create(**rbody([L.VFIO_UNITS[0]], [ORG_AUD], [ORG_MGR], end=now + 3600, note="r1"))
    r2 = lab.create(**rbody([L.VFIO_UNITS[1]], [ORG_AUD2], [ORG_MGR2], end=now + 3600, note="r2"))
    c.status("setup: R1 created over the admin socket", r1, 201)
    c.status("setup: R2 created over the admin socket", r2, 201)
    R1, R2 = r1.json["id"], r2.json["id"]
    c.eq("setup: R1 is active (startsAt defaults to now)", r1.json.get("state"), "active")

    toks = {
        "admin": lab.admin(),
        "operator": lab.token(org="org-ops", roles=["platform-operator"]),
        "owner": lab.token(org=L.OWNER),
        "manager": lab.token(org=ORG_MGR),
        "audience": lab.token(org=ORG_AUD),
        "unrelated": lab.token(org=ORG_OTHER),
    }
    future = now + 400 * DAY

    def create_body(i):
        return rbody([L.DR_UNITS[0]], ["org-throwaway"], start=future + i * DAY, end=future + i * DAY + 3600)

    # per relation, what each route answers (CONTRACT §4 table)
    expect = {
        "units":    {"admin": 200, "operator": 200, "owner": 200, "manager": 200, "audience": 404, "unrelated": 404},
        "list":     {"admin": 200, "operator": 200, "owner": 200, "manager": 200, "audience": 200, "unrelated": 404},
        "get":      {"admin": 200, "operator": 200, "owner": 200, "manager": 200, "audience": 200, "unrelated": 404},
        "create":   {"admin": 201, "operator": 403, "owner": 403, "manager": 403, "audience": 403, "unrelated": 404},
        "amend":    {"admin": 200, "operator": 403, "owner": 403, "manager": 403, "audience": 403, "unrelated": 404},
        "end":      {"admin": 200, "operator": 403, "owner": 403, "manager": 403, "audience": 403, "unrelated": 404},
        "audit":    {"admin": 200, "operator": 200, "owner": 200, "manager": 403, "audience": 403, "unrelated": 404},
        "capacity": {"admin": 200, "operator": 200, "owner": 404, "manager": 404, "audience": 200, "unrelated": 404},
    }
    counter = [0]

    def request(route, token, rel=None):
        """(method, path, body, headers) for a route; creates/ends use fresh reservations for the admin."""
        counter[0] += 1
        if route == "units":
            return "GET", lab.npath("/units"), None, {}
        if route == "list":
            return "GET", lab.npath("/reservations"), None, {}
        if route == "get":
            return "GET", lab.npath(f"/reservations/{R1}"), None, {}
        if route == "create":
            return "POST", lab.npath("/reservations"), create_body(counter[0]), {}
        if route == "amend":
            return "PATCH", lab.npath(f"/reservations/{R1}"), {"note": f"amended by {rel}"}, \
                {"Content-Type": "application/merge-patch+json"}
        if route == "end":
            target = R1
            if rel == "admin":  # the admin really ends one: a throwaway far-future reservation
                x = lab.create(**create_body(counter[0] + 1000))
                target = x.json["id"]
            return "POST", lab.npath(f"/reservations/{target}/end"), {"reason": "test"}, {}
        if route == "audit":
            return "GET", lab.npath("/audit"), None, {}
        if route == "capacity":
            return "GET", f"/v1/orgs/{ORG_AUD}/reserved-capacity", None, {}
        raise KeyError(route)

    def call(route, token, rel=None, unix=False):
        m, p, b, h = request(route, token, rel)
        i = rid.next()
        h = dict(h, **{"X-Request-Id": i})
        r = lab.call(m, p, token=token, body=b, headers=h, unix=unix)
        rid.sent.append((i, r))
        return r

    not_found_bodies = {}
    for route, per_rel in expect.items():
        for rel, want in per_rel.items():
            r = call(route, toks[rel], rel)
            label = f"https {route} as {rel} -> {want}"
            if want >= 400:
                code = {403: "forbidden", 404: "not-found"}[want]
                c.problem(label, r, want, code)
                if want == 404 and route != "capacity":
                    not_found_bodies[f"{route}/{rel}"] = r.body
            else:
                c.status(label, r, want)
            # content checks for the 2xx answers that filter
            if route == "list" and r.status == 200:
                ids = {x["id"] for x in r.json.get("reservations", [])}
                if rel in ("admin", "operator", "owner"):
                    c.check(f"https list as {rel} holds R1 and R2", {R1, R2} <= ids, sorted(ids))
                else:
                    c.check(f"https list as {rel} holds R1 only (not R2, not others')", ids == {R1}, sorted(ids))
            if route == "units" and r.status == 200:
                units = r.json.get("units", [])
                c.eq(f"https units as {rel}: every unit, sorted by id", [u.get("id") for u in units], L.ALL_UNITS)
                u23 = next((u for u in units if u.get("id") == L.VFIO_UNITS[0]), {})
                u24 = next((u for u in units if u.get("id") == L.VFIO_UNITS[1]), {})
                if rel == "manager":
                    c.check("https units as manager: reservationIds only its own reservations",
                            u23.get("reservationIds") == [R1] and u24.get("reservationIds") == [],
                            f"{u23.get('reservationIds')} / {u24.get('reservationIds')}")
                elif rel == "admin":
                    c.check("https units as admin: reservationIds of R1 and R2",
                            u23.get("reservationIds") == [R1] and u24.get("reservationIds") == [R2],
                            f"{u23.get('reservationIds')} / {u24.get('reservationIds')}")
            if route == "capacity" and r.status == 200:
                j = r.json
                ok = (j.get("orgId") == ORG_AUD and j.get("nodeId") == L.NODE
                      and [x.get("reservationId") for x in j.get("reservations", [])] == [R1]
                      and j.get("totals") == {"units": 1, "gpus": 1})
                c.check(f"https reserved-capacity of {ORG_AUD} as {rel}: R1 only, totals 1/1", ok, r)

    # the manager of R1 sees the node but not R2: 404 for R2, 403 for acting on R2
    r = lab.get(lab.npath(f"/reservations/{R2}"), toks["manager"])
    c.problem("https get another org's reservation as R1's manager -> 404", r, 404, "not-found")
    r = lab.get(lab.npath(f"/reservations/{R2}"), toks["audience"])
    c.problem("https get another org's reservation as R1's audience -> 404", r, 404, "not-found")
    r = lab.get(lab.npath("/reservations/rsv_does_not_exist"), toks["admin"])
    c.problem("https get unknown reservation as admin -> 404", r, 404, "not-found")

    # 404 for an unseen node is byte-identical to the 404 for a node id that is not this node
    unknown = lab.get("/v1/nodes/node-that-is-not-here/units", toks["admin"])
    c.problem("https units of an unknown node id as admin -> 404", unknown, 404, "not-found")
    other = lab.get("/v1/nodes/node-elsewhere-42/reservations?limit=1", toks["owner"])
    c.check("two unknown node ids give byte-identical 404 bodies", other.body == unknown.body,
            f"{other.body!r} vs {unknown.body!r}")
    for k, b in sorted(not_found_bodies.items()):
        c.check(f"404 for unrelated caller on {k} is byte-identical to the unknown-node 404", b == unknown.body,
                f"{b!r} vs {unknown.body!r}")

    # no token and every bad token: 401 + WWW-Authenticate: Bearer on every route
    bad = {"no-token": None, **lab.bad_tokens()}
    for kind, tok in bad.items():
        for route in expect:
            r = call(route, tok)
            ok = c.problem(f"https {route} with {kind} -> 401 unauthenticated", r, 401, "unauthenticated")
            if ok:
                c.check(f"https {route} with {kind}: WWW-Authenticate: Bearer",
                        (r.h("www-authenticate") or "").startswith("Bearer"), r.h("www-authenticate"))

    # nothing was changed by the refused requests: R1's note is the admin's
    r = lab.get(lab.npath(f"/reservations/{R1}"), toks["admin"])
    c.eq("only the admin's amend took effect on R1", r.json.get("note"), "amended by admin")

    # X-Request-Id
    bad_echo = [(i, r.h("x-request-id")) for i, r in rid.sent if r.h("x-request-id") != i]
    c.check(f"X-Request-Id echoed on all {len(rid.sent)} answers", not bad_echo, bad_echo[:5])
    r = lab.get("/healthz")
    c.check("X-Request-Id present when the request sent none", bool(r.h("x-request-id")), r.headers)
    c.eq("HTTPS /healthz (no auth) names no node and no version", r.json, {"status": "ok"})
    r = lab.call("GET", "/healthz", unix=True)
    c.check("admin-socket /healthz has the node id, version and revision",
            isinstance(r.json, dict) and r.json.get("nodeId") == L.NODE and "version" in r.json and "revision" in r.json, r.json)
    r = lab.get(lab.npath("/units"), None, headers={"X-Request-Id": "integ-401"})
    c.eq("X-Request-Id echoed on a 401", r.h("x-request-id"), "integ-401")

    # the admin socket: every route with no token, acting as platform-admin
    for route in expect:
        want = {"create": 201}.get(route, 200)
        r = call(route, None, "admin", unix=True)
        c.status(f"admin socket {route} -> {want}", r, want)
        if route == "list" and r.status == 200:
            ids = {x["id"] for x in r.json["reservations"]}
            c.check("admin socket list holds R1 and R2", {R1, R2} <= ids, sorted(ids))
    r = lab.call("GET", "/v1/nodes/node-that-is-not-here/units", unix=True)
    c.check("admin socket unknown node 404 is byte-identical to the HTTPS one",
            r.status == 404 and r.body == unknown.body, r)
    bad_echo = [(i, r.h("x-request-id")) for i, r in rid.sent if r.h("x-request-id") != i]
    c.check("X-Request-Id echoed on the admin socket too", not bad_echo, bad_echo[:5])

    # audit actors
    recs = lab.audit_all()
    first = next((x for x in recs if x.get("reservationId") == R1 and x.get("action") == "reservation.create"), None)
    c.eq("audit actor of an admin-socket create",
         first and first.get("actor"),
         {"sub": f"local:{os.getuid()}", "org": None, "roles": ["platform-admin"], "via": "admin-socket"})
    am = [x for x in recs if x.get("reservationId") == R1 and x.get("action") == "reservation.amend"]
    https_am = [x for x in am if x.get("actor", {}).get("via") == "https"]
    c.check("audit actor of an HTTPS amend: sub, org, roles, via https",
            len(https_am) == 1 and https_am[0]["actor"] == {"sub": "user@org-platform", "org": "org-platform",
                                                           "roles": ["platform-admin"], "via": "https"}, am)
    c.check("audit requestId of an HTTPS amend is the request's X-Request-Id",
            len(https_am) == 1 and str(https_am[0].get("requestId", "")).startswith("integ-req-"), https_am)
    c.check("refused requests wrote no audit record (one amend by https, one by the socket)",
            len(am) == 2, [x.get("actor") for x in am])
    return R1, R2


def reservation_rules(c, lab):
    admin = lab.admin()
    now = time.time()
    base = now + 30 * DAY
    U = L.DR_UNITS[1]

    def post(body, **kw):
        return lab.call("POST", lab.npath("/reservations"), token=admin, body=body, **kw)

    def patch(rid, body, etag=None, **kw):
        h = {"Content-Type": "application/merge-patch+json"}
        if etag:
            h["If-Match"] = etag
        return lab.call("PATCH", lab.npath(f"/reservations/{rid}"), token=admin, body=body, headers=h, **kw)

    def get(rid, **kw):
        return lab.get(lab.npath(f"/reservations/{rid}"), admin, **kw)

    a = post(rbody([U], [ORG_AUD], [ORG_MGR], start=base, end=base + DAY, note="A"))
    c.status("create A (scheduled) -> 201", a, 201)
    A = a.json["id"]
    c.check("create: Location names the reservation", a.h("location") == lab.npath(f"/reservations/{A}"), a.headers)
    c.check("create: ETag is the version", a.h("etag") == f'"{a.json.get("version")}"', (a.h("etag"), a.json))
    keys = {"id", "nodeId", "unitIds", "audienceOrgIds", "managingOrgIds", "startsAt", "endsAt", "state", "endedAt",
            "endReason", "releasedUnitIds", "reclaimingUnitIds", "note", "createdAt", "updatedAt", "version"}
    c.check("reservation JSON has every contract key", keys <= set(a.json), sorted(keys - set(a.json)))
    c.check("create: id rsv_..., state scheduled, version 1",
            A.startswith("rsv_") and a.json["state"] == "scheduled" and a.json["version"] == 1, a)

    r = post(rbody([U], [ORG_AUD], start=base + DAY / 2, end=base + 2 * DAY))
    c.problem("overlapping term -> 409 reservation-overlap", r, 409, "reservation-overlap")
    c.check("overlap problem names the blocking reservation", A in r.body.decode(errors="replace"), r)
    r = post(rbody([U, L.DR_UNITS[0]], [ORG_AUD], start=base - DAY, end=base + 1))
    c.problem("term overlapping by one second, two units -> 409 reservation-overlap", r, 409, "reservation-overlap")
    b = post(rbody([U], [ORG_AUD2], start=base + DAY, end=base + 2 * DAY, note="B"))
    c.status("back-to-back term (starts at A's endsAt) -> 201", b, 201)
    B = b.json["id"]
    b0 = post(rbody([U], [ORG_AUD2], start=base - DAY, end=base, note="B0"))
    c.status("back-to-back term (ends at A's startsAt) -> 201", b0, 201)

    r = post(rbody(["u-0000-99-00-0"], [ORG_AUD], start=base, end=base + DAY))
    c.problem("unknown unit -> 422 unknown-unit", r, 422, "unknown-unit")
    r = post(rbody(["u-0000-c1-00-0"], [ORG_AUD], start=base + 5 * DAY, end=base + 6 * DAY))
    c.problem("u-0000-c1-00-0 -> 409 unit-not-reservable", r, 409, "unit-not-reservable")
    c.check("unit-not-reservable carries the unit's reasons", b"mixed-drivers" in r.body, r)
    r = post(rbody(["u-0000-e1-00-0"], [ORG_AUD], start=base + 5 * DAY, end=base + 6 * DAY))
    c.problem("u-0000-e1-00-0 -> 409 unit-not-reservable", r, 409, "unit-not-reservable")

    def invalid(label, resp, field=None):
        ok = c.problem(f"{label} -> 400 invalid-request", resp, 400, "invalid-request")
        if ok:
            errs = resp.json.get("errors")
            good = bool(errs) and all(isinstance(e, dict) and {"field", "message"} <= set(e) for e in errs)
            if field:
                good = good and any(e.get("field") == field for e in errs)
            c.check(f"{label}: errors[] names {field or 'the fields'}", good, errs)

    invalid("malformed JSON", lab.call("POST", lab.npath("/reservations"), token=admin, raw=b'{"unitIds": ["u-0'))
    invalid("body is a JSON array", post([1, 2]))
    invalid("unitIds a string", post(dict(rbody([U], [ORG_AUD], end=base + 9 * DAY), unitIds=U)), "unitIds")
    invalid("audienceOrgIds of numbers", post(dict(rbody([U], [ORG_AUD], end=base + 9 * DAY), audienceOrgIds=[1])),
            "audienceOrgIds")
    invalid("endsAt a number", post(dict(rbody([U], [ORG_AUD]), endsAt=12345)), "endsAt")
    invalid("unknown field", post(dict(rbody([U], [ORG_AUD], start=base + 9 * DAY, end=base + 10 * DAY), colour="red")),
            "colour")
    invalid("missing endsAt", post(rbody([U], [ORG_AUD], start=base + 9 * DAY)), "endsAt")
    invalid("endsAt in the past", post(rbody([U], [ORG_AUD], start=now - 2 * DAY, end=now - DAY)), "endsAt")
    invalid("endsAt before startsAt", post(rbody([U], [ORG_AUD], start=base + 11 * DAY, end=base + 10 * DAY)))
    invalid("empty unitIds", post(rbody([], [ORG_AUD], start=base + 9 * DAY, end=base + 10 * DAY)), "unitIds")
    invalid("duplicate unitIds", post(rbody([U, U], [ORG_AUD], start=base + 9 * DAY, end=base + 10 * DAY)), "unitIds")
    invalid("empty audienceOrgIds", post(rbody([U], [], start=base + 9 * DAY, end=base + 10 * DAY)), "audienceOrgIds")
    invalid("note over 1024 chars", post(rbody([U], [ORG_AUD], start=base + 9 * DAY, end=base + 10 * DAY,
                                               note="n" * 1025)), "note")
    invalid("startsAt not RFC 3339", post(dict(rbody([U], [ORG_AUD], end=base + 10 * DAY), startsAt="tomorrow")),
            "startsAt")
    after = lab.reservations_all(admin)
    c.check("no refused create made a reservation", {x["id"] for x in after} >= {A, B} and
            not any(x.get("unitIds") == [U] and x["id"] not in (A, B, b0.json["id"]) for x in after),
            [x["id"] for x in after])

    # amend
    g = get(A)
    etag = g.h("etag")
    c.eq("GET one carries ETag = version", etag, f'"{g.json["version"]}"')
    r = patch(A, {"note": "stale"}, etag='"999"')
    c.problem("amend with stale If-Match -> 412 version-mismatch", r, 412, "version-mismatch")
    r = patch(A, {"note": "A2"}, etag=etag)
    c.status("amend with current If-Match -> 200", r, 200)
    c.check("amend bumps version and carries the new ETag",
            r.json.get("version") == g.json["version"] + 1 and r.h("etag") == f'"{g.json["version"] + 1}"', r)
    v = r.json["version"]
    r = patch(A, {"note": "stale again"}, etag=etag)
    c.problem("amend with the previous ETag -> 412 version-mismatch", r, 412, "version-mismatch")

    def unchanged(label):
        g2 = get(A)
        c.check(f"{label}: nothing changed (note, units, endsAt, version {v})",
                g2.json.get("version") == v and g2.json.get("note") == "A2" and g2.json.get("unitIds") == [U]
                and g2.json.get("endsAt") == a.json["endsAt"], g2)

    r = patch(A, {"note": "half", "unitIds": ["u-0000-c1-00-0"]})
    c.problem("amend to a non-reservable unit -> 409 unit-not-reservable", r, 409, "unit-not-reservable")
    unchanged("failed amend (unit-not-reservable)")
    r = patch(A, {"note": "half", "endsAt": L.rfc3339(base + 1.5 * DAY)})
    c.problem("amend into B's term -> 409 reservation-overlap", r, 409, "reservation-overlap")
    c.check("amend overlap names B", B in r.body.decode(errors="replace"), r)
    unchanged("failed amend (overlap)")
    r = patch(A, {"note": "half", "endsAt": L.rfc3339(now - DAY)})
    c.problem("amend endsAt into the past -> 400 invalid-request", r, 400, "invalid-request")
    unchanged("failed amend (endsAt in the past)")
    r = patch(A, {"note": "half", "unitIds": ["u-0000-99-00-0"]})
    c.problem("amend to an unknown unit -> 422 unknown-unit", r, 422, "unknown-unit")
    unchanged("failed amend (unknown unit)")
    r = patch(A, {"note": "half", "bogus": 1})
    c.problem("amend with an unknown field -> 400 invalid-request", r, 400, "invalid-request")
    unchanged("failed amend (unknown field)")
    r = lab.call("PATCH", lab.npath(f"/reservations/{A}"), token=admin, raw=b'{"note": ',
                 headers={"Content-Type": "application/merge-patch+json"})
    c.problem("amend with malformed JSON -> 400 invalid-request", r, 400, "invalid-request")
    unchanged("failed amend (malformed JSON)")

    # end
    r = lab.call("POST", lab.npath(f"/reservations/{A}/end"), token=admin, body={"reason": "integration"})
    c.status("end A -> 200", r, 200)
    c.check("ended: state ended, endReason ended-early, endedAt set",
            r.json.get("state") == "ended" and r.json.get("endReason") == "ended-early" and r.json.get("endedAt"), r)
    r = lab.call("POST", lab.npath(f"/reservations/{A}/end"), token=admin)
    c.problem("end A twice -> 409 reservation-ended", r, 409, "reservation-ended")
    r = patch(A, {"note": "too late"})
    c.problem("amend an ended reservation -> 409 reservation-ended", r, 409, "reservation-ended")
    # the ended term no longer blocks
    r = post(rbody([U], [ORG_AUD], start=base + 3600, end=base + 7200))
    c.status("an ended reservation no longer blocks its term -> 201", r, 201)

    # Idempotency-Key
    before = len(lab.reservations_all(admin))
    body = rbody([U], [ORG_AUD], start=base + 20 * DAY, end=base + 21 * DAY, note="idem")
    r1 = post(body, headers={"Idempotency-Key": "integ-key-1"})
    r2 = post(body, headers={"Idempotency-Key": "integ-key-1"})
    c.status("Idempotency-Key first POST -> 201", r1, 201)
    c.check("Idempotency-Key replay: same status and byte-identical body",
            r2.status == r1.status and r2.body == r1.body, f"{r1!r} / {r2!r}")
    c.eq("Idempotency-Key replay created nothing new", len(lab.reservations_all(admin)), before + 1)
    r3 = post(dict(body, note="other"), headers={"Idempotency-Key": "integ-key-1"})
    c.problem("same Idempotency-Key, other body -> 422 idempotency-key-reuse", r3, 422, "idempotency-key-reuse")
    c.eq("the reused key created nothing", len(lab.reservations_all(admin)), before + 1)
    # a replayed failure is replayed too (the overlap answer)
    r4 = post(body, headers={"Idempotency-Key": "integ-key-2"})
    r5 = post(body, headers={"Idempotency-Key": "integ-key-2"})
    c.check("Idempotency-Key on a refused POST replays the same refusal",
            r4.status == 409 and r5.status == 409 and r4.body == r5.body, f"{r4!r} / {r5!r}")
    I = r1.json["id"]
    p1 = patch(I, {"note": "idem-2"})
    c.status("plain amend of the idempotent one -> 200", p1, 200)
    hk = {"Content-Type": "application/merge-patch+json", "Idempotency-Key": "integ-key-3"}
    p2 = lab.call("PATCH", lab.npath(f"/reservations/{I}"), token=admin, body={"note": "idem-3"}, headers=hk)
    p3 = lab.call("PATCH", lab.npath(f"/reservations/{I}"), token=admin, body={"note": "idem-3"}, headers=hk)
    c.check("PATCH with Idempotency-Key replays (same body, version bumped once)",
            p2.status == 200 and p3.status == 200 and p2.body == p3.body
            and get(I).json.get("version") == p2.json.get("version"), f"{p2!r} / {p3!r}")

    # ETag / If-None-Match on GETs
    for what, path in (("one reservation", lab.npath(f"/reservations/{B}")), ("reservation list", lab.npath("/reservations")),
                       ("units", lab.npath("/units")), ("audit", lab.npath("/audit")),
                       ("reserved-capacity", f"/v1/orgs/{ORG_AUD}/reserved-capacity")):
        r = lab.get(path, admin)
        et = r.h("etag")
        c.check(f"GET {what} carries an ETag", r.status == 200 and bool(et), r.headers)
        if et:
            r2 = lab.get(path, admin, headers={"If-None-Match": et})
            c.check(f"GET {what} with If-None-Match -> 304, empty body", r2.status == 304 and r2.body == b"", r2)
            r3 = lab.get(path, admin, headers={"If-None-Match": '"not-it"'})
            c.status(f"GET {what} with another If-None-Match -> 200", r3, 200)
    gb = get(B)
    patch(B, {"note": "B2"})
    r = get(B, headers={"If-None-Match": gb.h("etag")})
    c.check("If-None-Match with an outdated ETag after a change -> 200 with the new version",
            r.status == 200 and r.json.get("note") == "B2", r)

    # pagination and state filter
    full = lab.get(lab.npath("/reservations?limit=500"), admin).json["reservations"]
    ids, tok, pages = [], None, 0
    while True:
        r = lab.get(lab.npath("/reservations?limit=1" + (f"&pageToken={tok}" if tok else "")), admin)
        if r.status != 200 or pages > 100:
            break
        pages += 1
        if pages <= 3:
            c.check(f"limit=1 page {pages} holds at most one", len(r.json["reservations"]) <= 1, r)
        ids += [x["id"] for x in r.json["reservations"]]
        tok = r.json.get("nextPageToken")
        if not tok:
            break
    c.eq("limit=1 pages with nextPageToken walk the whole list once, in order", ids, [x["id"] for x in full])
    c.check("the last page's nextPageToken is null", r.status == 200 and r.json.get("nextPageToken") is None, r)
    for st in ("scheduled", "active", "ended"):
        r = lab.get(lab.npath(f"/reservations?state={st}&limit=500"), admin)
        got = [x["id"] for x in r.json.get("reservations", [])] if r.status == 200 else None
        want = [x["id"] for x in full if x["state"] == st]
        c.check(f"state={st} lists exactly the {st} ones ({len(want)})", r.status == 200 and got == want and want,
                f"{got} want {want}")
    invalid("state=bogus", lab.get(lab.npath("/reservations?state=bogus"), admin))
    invalid("limit=0", lab.get(lab.npath("/reservations?limit=0"), admin))
    invalid("limit=501", lab.get(lab.npath("/reservations?limit=501"), admin))


def terms_by_clock(c, lab):
    now = time.time()
    start = int(now) + 3
    end = start + 2
    r = lab.create(**rbody([L.VFIO_UNITS[2]], [ORG_AUD], start=start, end=end, note="clock"))
    if not c.status("clock: create with startsAt now+~2s, endsAt +2s -> 201", r, 201):
        return
    X = r.json["id"]
    c.eq("clock: created scheduled", r.json.get("state"), "scheduled")
    # nobody calls the agent now
    time.sleep(max(0.0, end + 2.0 - time.time()))
    recs = [x for x in lab.audit_all() if x.get("reservationId") == X]
    acts = [x["action"] for x in recs]
    c.eq("clock: audit holds create, activate, expire in that order", acts,
         ["reservation.create", "reservation.activate", "reservation.expire"])
    for action, instant in (("reservation.activate", start), ("reservation.expire", end)):
        rec = next((x for x in recs if x["action"] == action), None)
        if not c.check(f"clock: {action} recorded", rec is not None, acts):
            continue
        at = L.parse_time(rec["at"])
        c.check(f"clock: {action} at {rec['at']} within [{L.rfc3339(instant)}, +1s]", instant <= at <= instant + 1.0,
                rec["at"])
        c.eq(f"clock: {action} actor is the agent", rec.get("actor"), AGENT_ACTOR)
        c.eq(f"clock: {action} requestId is null", rec.get("requestId", "missing"), None)
        c.eq(f"clock: {action} result ok", rec.get("result"), "ok")
    g = lab.call("GET", lab.npath(f"/reservations/{X}"), unix=True)
    c.check("clock: reservation ended with term-expired",
            g.json.get("state") == "ended" and g.json.get("endReason") == "term-expired", g)
    c.check("clock: endedAt == endsAt", L.parse_time(g.json.get("endedAt")) == L.parse_time(g.json.get("endsAt")) == end, g)


def audit_chain(c, lab):
    recs = lab.audit_all()
    c.check(f"audit: {len(recs)} records", len(recs) > 10, len(recs))
    probs = L.verify_chain(recs)
    c.check("audit: every hash recomputes (sha256 of sorted compact JSON), prevHash links from 64 zeros",
            not probs, probs[:5])
    keys = {"id", "at", "actor", "action", "nodeId", "reservationId", "unitIds", "vmIds", "result", "detail",
            "requestId", "prevHash", "hash"}
    missing = [(x.get("id"), sorted(keys - set(x))) for x in recs if not keys <= set(x)]
    c.check("audit: every record has every contract key", not missing, missing[:3])
    allowed = {"reservation.create", "reservation.amend", "reservation.end", "reservation.activate",
               "reservation.expire", "units.release", "units.reclaim", "workload.terminate", "unit.absent"}
    c.check("audit: actions from the contract's vocabulary", {x.get("action") for x in recs} <= allowed,
            {x.get("action") for x in recs} - allowed)
    admin = lab.admin()
    r = lab.get(lab.npath("/audit?after=aud_3&limit=500"), admin)
    c.check("audit after=aud_3 starts at aud_4 and equals the rest",
            r.status == 200 and r.json["records"] == recs[3:], r)
    ids, tok, n = [], None, 0
    while n < 1000:
        n += 1
        r = lab.get(lab.npath("/audit?limit=2" + (f"&pageToken={tok}" if tok else "")), admin)
        if r.status != 200:
            break
        ids += [x["id"] for x in r.json["records"]]
        tok = r.json.get("nextPageToken")
        if not tok:
            break
    c.eq("audit limit=2 pages with pageToken walk the whole chain", ids, [x["id"] for x in recs])
    r = lab.get(lab.npath(f"/audit?after={recs[-1]['id']}"), admin)
    c.check("audit after the last id: no records, nextPageToken null",
            r.status == 200 and r.json["records"] == [] and r.json.get("nextPageToken") is None, r)
    r = lab.get(lab.npath("/audit?after=garbage"), admin)
    c.problem("audit after=garbage -> 400 invalid-request", r, 400, "invalid-request")
    owner = lab.get(lab.npath("/audit?limit=500"), lab.token(org=L.OWNER))
    c.check("audit as owner over HTTPS equals the socket's chain (first page)",
            owner.status == 200 and owner.json["records"] == recs[:500], owner)


def raw_tls(lab, data, read_timeout=5.0):
    """Send bytes over a fresh TLS connection, read until close or timeout; (status or None, raw)."""
    s = socket.create_connection(("127.0.0.1", lab.port), timeout=read_timeout)
    t = lab.ctx.wrap_socket(s, server_hostname="127.0.0.1")
    out = b""
    try:
        try:
            t.sendall(data)
        except (OSError, ssl.SSLError):
            pass  # the server may answer and close before it has read everything
        while True:
            try:
                chunk = t.recv(65536)
            except (OSError, ssl.SSLError):
                break
            if not chunk:
                break
            out += chunk
            if b"\r\n\r\n" in out:
                head, _, rest = out.partition(b"\r\n\r\n")
                cl = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
                if cl and len(rest) >= int(cl[0].split(b":")[1]):
                    break
    finally:
        t.close()
    status = None
    if out.startswith(b"HTTP/1."):
        status = int(out.split(b" ", 2)[1])
    return status, out


def problem_code(raw):
    body = raw.partition(b"\r\n\r\n")[2]
    try:
        return json.loads(body).get("code")
    except ValueError:
        return None


def limits(c, lab):
    admin = lab.admin()
    path = lab.npath("/reservations")

    def req(body_len, extra_headers=b""):
        return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {admin}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {body_len}\r\n").encode() + extra_headers + b"\r\n"

    big = b"{" + b" " * (64 * 1024 - 1)  # 64 KiB of not-yet-valid JSON
    st, raw = raw_tls(lab, req(len(big) + 1) + big + b"}")
    c.check("body of 64 KiB + 1 -> 413 body-too-large", st == 413 and problem_code(raw) == "body-too-large",
            raw[:300])
    exact = b'{"unitIds": ["u-0000-99-00-0"], "audienceOrgIds": ["a"], "endsAt": "2099-01-01T00:00:00Z"}'
    exact = exact + b" " * (64 * 1024 - len(exact))
    st, raw = raw_tls(lab, req(len(exact)) + exact)
    c.check("body of exactly 64 KiB is read (422 unknown-unit, not 413)", st == 422, raw[:300])
    pad = b"X-Pad: " + b"a" * (9 * 1024) + b"\r\n"
    st, raw = raw_tls(lab, f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + pad + b"\r\n")
    c.check("9 KiB of headers -> 431 headers-too-large", st == 431 and problem_code(raw) == "headers-too-large",
            raw[:300])
    r = lab.get(lab.npath("/units"), admin, headers={"X-Pad": "a" * 6000})
    c.status("6 KiB of headers in all is served", r, 200)

    # slow clients: half a request over TLS, a TLS handshake and nothing else, a bare TCP connection
    held = []
    try:
        s = socket.create_connection(("127.0.0.1", lab.port), timeout=5)
        t = lab.ctx.wrap_socket(s, server_hostname="127.0.0.1")
        t.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n".encode())
        held.append(t)
        s2 = socket.create_connection(("127.0.0.1", lab.port), timeout=5)
        held.append(lab.ctx.wrap_socket(s2, server_hostname="127.0.0.1"))
        s3 = socket.create_connection(("127.0.0.1", lab.port), timeout=5)
        s3.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello, then nothing
        held.append(s3)
        s4 = socket.socket(socket.AF_UNIX)
        s4.connect(lab.sock)
        s4.sendall(b"GET /v1/nodes/")
        held.append(s4)
        t0 = time.monotonic()
        r = lab.get(lab.npath("/units"), admin, timeout=5)
        took = time.monotonic() - t0
        c.check(f"a second client is served while slow clients hang ({took:.2f}s)", r.status == 200 and took < 2, r)
        t0 = time.monotonic()
        r = lab.call("GET", lab.npath("/units"), unix=True, timeout=5)
        took = time.monotonic() - t0
        c.check(f"an admin-socket client is served while a slow socket client hangs ({took:.2f}s)",
                r.status == 200 and took < 2, r)
        # many at once
        errs = []

        def worker():
            try:
                x = lab.get("/healthz", timeout=10)
                if x.status != 200:
                    errs.append(x.status)
            except Exception as e:  # noqa: BLE001
                errs.append(repr(e))
        th = [threading.Thread(target=worker) for _ in range(20)]
        [x.start() for x in th]
        [x.join() for x in th]
        c.check("20 concurrent clients beside the slow ones are all served", not errs, errs[:3])
    finally:
        for h in held:
            try:
                h.close()
            except OSError:
                pass
    # garbage on the wire
    st, raw = raw_tls(lab, b"\x00\x01 not http at all\r\n\r\n")
    c.check("garbage request line gets a 400 or a close, no crash", st in (None, 400), raw[:200])
    st, raw = raw_tls(lab, b"BREW /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    c.check("unknown method on /healthz -> 405 (or 400/501)", st in (400, 405, 501), raw[:200])
    r = lab.call("DELETE", lab.npath("/units"), token=admin)
    c.problem("DELETE units -> 405 method-not-allowed", r, 405, "method-not-allowed")
    r = lab.get("/healthz")
    c.check("after all of it the server still answers /healthz", r.status == 200 and lab.running(), r)


def main(c, agent):
    with L.Lab(agent) as lab:
        lab.start()
        rid = Ids()
        access_matrix(c, lab, rid)
        reservation_rules(c, lab)
        terms_by_clock(c, lab)
        audit_chain(c, lab)
        limits(c, lab)
        c.check("agent still running at the end", lab.running(), lab.tail())
        rc, took = lab.stop()
        c.check(f"SIGTERM: exit 0 ({took:.1f}s)", rc == 0 and took < 10, rc)


if __name__ == "__main__":
    sys.exit(L.run_main("api", main))
