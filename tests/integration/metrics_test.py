#!/usr/bin/env python3
"""/metrics (CONTRACT §6) through the real agent: a scenario over HTTPS and the admin socket (creates,
an amend, an end, a release, terminate-spot on libvirt's test driver, some 404s), then /metrics over
the admin socket and over metrics.listen (plain HTTP), `promtool check metrics` on both, and each
metric's value against the API: units by class and reservable vs GET units, reservations by state
vs GET reservations, the revision vs GET state, the HTTP counters moved by exactly the scenario's
requests, terminations vs the terminations done and audited, the outbox vs its table. Then the
agent again with a fake central API that fails twice with 500: the delivery counters, acked seq
and an empty outbox.

promtool (Debian package prometheus, installed by scripts/install-deps.sh) must be on PATH: the
test fails without it.

    metrics_test.py PATH/TO/gpunode-agent"""
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time

sys.dont_write_bytecode = True
import lab as L  # noqa: E402

XML = os.path.join(L.FIXTURES, "libvirt", "spot_node.xml")
U23, U24, U43, UA1 = "u-0000-23-00-0", "u-0000-24-00-0", "u-0000-43-00-0", "u-0000-a1-00-0"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SAMPLE_RE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """{(name, frozenset(labels)): value} and {name: type}; raises on a line it cannot read."""
    samples, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        m = SAMPLE_RE.match(line)
        if not m:
            raise ValueError(f"not a sample line: {line!r}")
        labels = frozenset(LABEL_RE.findall(m.group(2) or ""))
        samples[(m.group(1), labels)] = float(m.group(3))
    return samples, types


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())))


def http_count(samples, route, method, code):
    return value(samples, "gpunode_http_requests_total", route=route, method=method, code=str(code)) or 0.0


def promtool(c, label, body):
    tool = shutil.which("promtool")
    if not c.check(f"{label}: promtool is installed (Debian package prometheus; scripts/install-deps.sh)", tool, "not on PATH"):
        return
    r = subprocess.run([tool, "check", "metrics"], input=body, capture_output=True, timeout=30)
    out = (r.stdout + r.stderr).decode(errors="replace").strip()
    c.check(f"{label}: promtool check metrics finds nothing", r.returncode == 0 and not out, f"exit {r.returncode}: {out}")


def outbox_rows(state_dir):
    db = sqlite3.connect(f"file:{os.path.join(state_dir, 'state.db')}?mode=ro", uri=True)
    try:
        return db.execute("SELECT count(*), min(seq), max(seq) FROM outbox").fetchone()
    finally:
        db.close()


def scenario(c, lab):
    metrics_port = L.free_port()
    lab.write_config(lab.config_text(metrics_listen=f"127.0.0.1:{metrics_port}").replace(
        "uri: test:///default", f"uri: test://{XML}"))
    lab.start()
    admin, owner = lab.admin(), lab.token(org=L.OWNER)
    N = lab.npath

    def scrape_admin():
        r = lab.get("/metrics", unix=True)
        c.check("GET /metrics on the admin socket: 200 text/plain 0.0.4", r.status == 200 and r.h("content-type") == CONTENT_TYPE,
                (r.status, r.h("content-type")))
        return r

    def scrape_plain(path="/metrics", method="GET"):
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=10)
        try:
            conn.request(method, path)
            r = conn.getresponse()
            return L.Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            conn.close()

    before, _ = parse(scrape_admin().body.decode())
    # The first scrape is answered before it is counted: nothing of /metrics yet.
    c.eq("the first scrape does not count itself", http_count(before, "/metrics", "GET", 200), 0.0)

    # ---- the scenario ----
    end = L.rfc3339(time.time() + 86400)
    later, later_end = L.rfc3339(time.time() + 2 * 86400), L.rfc3339(time.time() + 3 * 86400)
    r1 = lab.create(admin, unitIds=[U23, U43], audienceOrgIds=["org-aud"], managingOrgIds=["org-mgr"], endsAt=end)
    c.status("create an active reservation on 23 and 43", r1, 201)
    rid1 = (r1.json or {}).get("id", "")
    r2 = lab.create(admin, unitIds=[UA1], audienceOrgIds=["org-aud"], startsAt=later, endsAt=later_end)
    c.status("create a scheduled reservation on a1", r2, 201)
    rid2 = (r2.json or {}).get("id", "")
    r3 = lab.create(None, unitIds=[UA1], audienceOrgIds=["org-b"], endsAt=end)  # the admin socket
    c.status("create an active reservation on a1 on the admin socket", r3, 201)
    rid3 = (r3.json or {}).get("id", "")
    c.problem("create on 24: unit-occupied", lab.create(admin, unitIds=[U24], audienceOrgIds=["org-aud"], endsAt=end), 409, "unit-occupied")
    r = lab.call("PATCH", N(f"/reservations/{rid2}"), token=admin, body={"note": "amended"})
    c.status("amend the scheduled reservation", r, 200)
    c.status("end the reservation on a1", lab.call("POST", N(f"/reservations/{rid3}/end"), token=admin, body={}), 200)
    c.status("release 23", lab.call("POST", N(f"/reservations/{rid1}/release"), token=lab.token(org="org-mgr"), body={"unitIds": [U23]}), 200)
    t = lab.call("POST", N("/terminate-spot"), token=owner, body={"unitIds": [U23]})
    c.status("terminate-spot on 23 as the owner", t, 200)
    terminated = len((t.json or {}).get("terminated", []))
    c.check("terminate-spot stopped at least one spot VM", terminated >= 1, t)
    # 404s: another node, an unknown path, an unknown reservation; on the metrics listener, an API path.
    c.status("another node's units: 404", lab.get("/v1/nodes/node-elsewhere/units", admin), 404)
    c.status("an unknown path: 404", lab.get("/no/such/path", admin), 404)
    c.status("an unknown reservation: 404", lab.get(N("/reservations/rsv_00000000000000000000000000"), admin), 404)
    p = scrape_plain(N("/units"))
    c.check("metrics.listen: an API path is 404", p.status == 404, p)
    p = scrape_plain("/healthz")
    c.check("metrics.listen: /healthz answers 200", p.status == 200 and (p.json or {}).get("status") == "ok", p)
    p = scrape_plain("/metrics", "POST")
    c.check("metrics.listen: POST /metrics is 405", p.status == 405 and p.h("allow") == "GET", p)

    # ---- the metrics and the API, read with no change in between ----
    scrapes = 0  # /metrics answered after `before` and before `a` (admin socket and metrics.listen)
    for _ in range(20):
        rev0 = lab.get(N("/state"), admin).json["revision"]
        a = scrape_admin()
        p = scrape_plain()
        rev1 = lab.get(N("/state"), admin).json["revision"]
        if rev0 == rev1:
            break
        scrapes += 2  # a and p
        time.sleep(0.2)
    c.eq("no change while reading (the revision held still)", rev1, rev0)
    c.check("GET /metrics on metrics.listen: 200 text/plain 0.0.4", p.status == 200 and p.h("content-type") == CONTENT_TYPE,
            (p.status, p.h("content-type")))
    promtool(c, "admin socket", a.body)
    promtool(c, "metrics.listen", p.body)
    m, types = parse(a.body.decode())
    mp, _ = parse(p.body.decode())

    c.eq("state revision = GET state's revision", value(m, "gpunode_state_revision"), float(rev0))
    c.eq("the same revision on metrics.listen", value(mp, "gpunode_state_revision"), float(rev0))

    units = lab.get(N("/units"), unix=True).json["units"]
    want = {}
    for u in units:
        k = (u["class"], "true" if u["reservable"] else "false")
        want[k] = want.get(k, 0) + 1
    for cls in ("vfio-group", "device-request", "none"):
        for res in ("true", "false"):
            c.eq(f"units class={cls} reservable={res} = GET units", value(m, "gpunode_units", **{"class": cls, "reservable": res}),
                 float(want.get((cls, res), 0)))

    rs = lab.reservations_all()
    for st in ("scheduled", "active", "ended"):
        c.eq(f"reservations state={st} = GET reservations", value(m, "gpunode_reservations", state=st),
             float(sum(1 for x in rs if x["state"] == st)))
    c.check("the scenario left one reservation in each state", all(any(x["state"] == s for x in rs) for s in ("scheduled", "active", "ended")), rs)

    # HTTP counters: exactly the scenario's requests (HTTPS, admin socket and metrics.listen together)
    R = "/v1/nodes/{nodeId}/reservations"
    scrapes += 1  # `before`
    moved = {
        (R, "POST", 201): 3, (R, "POST", 409): 1,
        (R + "/{reservationId}", "PATCH", 200): 1,
        (R + "/{reservationId}/end", "POST", 200): 1,
        (R + "/{reservationId}/release", "POST", 200): 1,
        ("/v1/nodes/{nodeId}/terminate-spot", "POST", 200): 1,
        ("/v1/nodes/{nodeId}/units", "GET", 404): 2,  # another node's over HTTPS, ours on metrics.listen
        ("other", "GET", 404): 1,
        (R + "/{reservationId}", "GET", 404): 1,
        ("/metrics", "POST", 405): 1,
        ("/metrics", "GET", 200): scrapes,  # those before this one (a scrape is counted once answered)
        ("/healthz", "GET", 200): 1,  # metrics.listen's
    }
    for (route, method, code), n in moved.items():
        c.eq(f"http_requests_total route={route} method={method} code={code} moved by {n}",
             http_count(m, route, method, code) - http_count(before, route, method, code), float(n))
    # The histogram agrees with the counter, and its buckets are cumulative.
    for route, method in ((R, "POST"), ("/v1/nodes/{nodeId}/terminate-spot", "POST"), ("/v1/nodes/{nodeId}/state", "GET")):
        total = sum(v for (name, labels), v in m.items() if name == "gpunode_http_requests_total"
                    and dict(labels).get("route") == route and dict(labels).get("method") == method)
        buckets = sorted(((float(dict(labels)["le"]), v) for (name, labels), v in m.items()
                          if name == "gpunode_http_request_duration_seconds_bucket"
                          and dict(labels).get("route") == route and dict(labels).get("method") == method))
        count = value(m, "gpunode_http_request_duration_seconds_count", route=route, method=method)
        c.check(f"duration histogram of {method} {route}: _count = the requests counted = the +Inf bucket, buckets cumulative",
                total > 0 and count == total and buckets and buckets[-1] == (float("inf"), total)
                and all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), (total, count, buckets[-3:]))
        c.check(f"duration histogram of {method} {route}: _sum > 0",
                (value(m, "gpunode_http_request_duration_seconds_sum", route=route, method=method) or 0) > 0, "")

    audits = lab.audit_all()
    ok = sum(1 for x in audits if x["action"] == "workload.terminate" and x["result"] == "ok")
    failed = sum(1 for x in audits if x["action"] == "workload.terminate" and x["result"] == "failed")
    c.eq("terminations_total{result=ok} = the VMs terminated", value(m, "gpunode_terminations_total", result="ok"), float(terminated))
    c.eq("terminations_total{result=ok} = the ok termination records", value(m, "gpunode_terminations_total", result="ok"), float(ok))
    c.eq("terminations_total{result=failed} = the failed termination records", value(m, "gpunode_terminations_total", result="failed"), float(failed))

    n, first, last = outbox_rows(lab.state)
    c.eq("reporting off: outbox_events = the outbox table's rows", value(m, "gpunode_outbox_events"), float(n))
    c.eq("reporting off: central_acked_seq = 0 (nothing was acknowledged)", value(m, "gpunode_central_acked_seq"), 0.0)
    age = value(m, "gpunode_outbox_oldest_undelivered_age_seconds")
    c.check("the oldest undelivered event's age: from the first start, under a minute", age is not None and 0 <= age < 60, age)
    for reason in ("transport", "5xx", "429", "4xx"):
        c.eq(f"reporting off: delivery failures {reason} = 0", value(m, "gpunode_central_delivery_failures_total", reason=reason), 0.0)
    c.eq("libvirt connected", value(m, "gpunode_libvirt_connected"), 1.0)
    d = value(m, "gpunode_discovery_duration_seconds")
    c.check("discovery duration: the last scan, above 0 and under 10 s", d is not None and 0 < d < 10, d)
    for result in ("allowed", "refused", "audit-refused"):
        c.eq(f"domain_admissions_total{{result={result}}} exists at 0", value(m, "gpunode_domain_admissions_total", result=result), 0.0)
    version = lab.get("/healthz", unix=True).json["version"]
    c.eq("build_info: the agent's version", value(m, "gpunode_build_info", version=version), 1.0)
    c.eq("types", {k: v for k, v in types.items() if k in ("gpunode_units", "gpunode_http_request_duration_seconds",
                                                            "gpunode_terminations_total", "gpunode_state_revision")},
         {"gpunode_units": "gauge", "gpunode_http_request_duration_seconds": "histogram",
          "gpunode_terminations_total": "counter", "gpunode_state_revision": "gauge"})
    text = a.body.decode() + p.body.decode()
    leaked = [s for s in ("org-", "rsv_", "user@", L.NODE, "local:") if s in text]
    c.eq("no label holds an org, a reservation id, a subject or the node id", leaked, [])
    same = {k for k in m if k[0] != "gpunode_http_requests_total" and not k[0].startswith("gpunode_http_request_duration")}
    c.check("metrics.listen serves the same series", same <= set(mp), sorted(same - set(mp))[:5])
    lab.stop()


def central(c, lab):
    """The agent again, reporting to a fake central API that answers 500 twice first."""
    fc = lab.fake_central()
    try:
        fc.fail("500", times=2)
        lab.write_config(lab.config_text(central=lab.central_text(fc.url)))
        lab.start()
        n, first, last = outbox_rows(lab.state)
        got = fc.wait_for(lambda: fc.acked() >= (last or 0) and outbox_rows(lab.state)[0] == 0, 30)
        c.check("every waiting event is delivered after two 500s", got, (fc.acked(), last))
        m = {}
        for _ in range(50):  # the reporter's numbers follow its acknowledgement within a moment
            m, _ = parse(lab.get("/metrics", unix=True).body.decode())
            if value(m, "gpunode_central_acked_seq") == float(fc.acked()) and value(m, "gpunode_outbox_events") == 0.0:
                break
            time.sleep(0.1)
        c.eq("central_acked_seq = what the central API acknowledged", value(m, "gpunode_central_acked_seq"), float(fc.acked()))
        c.eq("outbox_events = 0 once delivered", value(m, "gpunode_outbox_events"), 0.0)
        c.eq("the oldest undelivered age is 0 when the outbox is empty", value(m, "gpunode_outbox_oldest_undelivered_age_seconds"), 0.0)
        c.eq("delivery failures: two 5xx", value(m, "gpunode_central_delivery_failures_total", reason="5xx"), 2.0)
        c.eq("delivery failures: no transport failure", value(m, "gpunode_central_delivery_failures_total", reason="transport"), 0.0)
        lab.stop()
    finally:
        fc.close()


def body(c, agent):
    with L.Lab(agent) as lab:
        scenario(c, lab)
        central(c, lab)


if __name__ == "__main__":
    sys.exit(L.run_main("metrics", body))
