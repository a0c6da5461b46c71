#!/usr/bin/env python3
"""The agent's life as a process: a clean restart keeps every acknowledged change, SIGHUP reloads
what it may (and refuses an invalid config while serving on), token keys swap within 1 s, and
mTLS refuses a client without an acceptable certificate at the handshake.

Usage: lifecycle_test.py PATH/TO/gpunode-agent
"""
import http.client
import os
import signal
import socket
import ssl
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab as L  # noqa: E402

DAY = 86400


def wait_log(lab, needle, since, timeout=2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in lab.log()[since:].lower():
            return True
        time.sleep(0.05)
    return False


def restart(c, lab):
    admin = lab.admin()
    now = time.time()
    made = []
    for i, unit in enumerate(L.RESERVABLE):
        body = {"unitIds": [unit], "audienceOrgIds": ["org-a"], "managingOrgIds": ["org-m"],
                "startsAt": L.rfc3339(now + (10 + i) * DAY), "endsAt": L.rfc3339(now + (11 + i) * DAY), "note": f"n{i}"}
        r = lab.call("POST", lab.npath("/reservations"), token=admin if i % 2 else None, body=body, unix=not i % 2)
        c.status(f"restart: create {i} -> 201", r, 201)
        made.append(r.json["id"])
    active = lab.create(unitIds=[L.VFIO_UNITS[0]], audienceOrgIds=["org-a"], managingOrgIds=[],
                        startsAt=L.rfc3339(now + 11 * DAY), endsAt=L.rfc3339(now + 12 * DAY))
    r = lab.call("PATCH", lab.npath(f"/reservations/{made[1]}"), token=admin, body={"note": "amended"},
                 headers={"Content-Type": "application/merge-patch+json"})
    c.status("restart: amend -> 200", r, 200)
    r = lab.call("POST", lab.npath(f"/reservations/{made[2]}/end"), token=admin)
    c.status("restart: end -> 200", r, 200)
    c.status("restart: one more create -> 201", active, 201)
    before = lab.reservations_all()
    audit_before = lab.audit_all()
    rc, took = lab.stop()
    c.check(f"SIGTERM: exit 0 within 10 s ({took:.2f}s)", rc == 0 and took < 10, rc)
    c.check("the admin socket file is gone or refuses after stop",
            not os.path.exists(lab.sock) or _refuses(lab.sock), lab.sock)
    lab.start()
    after = lab.reservations_all()
    c.eq(f"after restart: all {len(before)} reservations, field for field", after, before)
    audit_after = lab.audit_all()
    c.eq(f"after restart: the whole audit chain ({len(audit_before)} records) is there",
         audit_after[:len(audit_before)], audit_before)
    c.check("after restart: the chain still recomputes", not L.verify_chain(audit_after), L.verify_chain(audit_after)[:3])
    g = lab.get(lab.npath(f"/reservations/{made[1]}"), admin)
    c.check("after restart: the amended note and its version", g.json.get("note") == "amended" and g.json["version"] == 2, g)
    r = lab.call("POST", lab.npath("/reservations"), token=admin,
                 body={"unitIds": [L.RESERVABLE[0]], "audienceOrgIds": ["org-a"],
                       "startsAt": L.rfc3339(now + 10.5 * DAY), "endsAt": L.rfc3339(now + 10.6 * DAY)})
    c.problem("after restart: the overlap rule still sees the old reservations -> 409", r, 409, "reservation-overlap")
    r = lab.create(unitIds=[L.RESERVABLE[5 % len(L.RESERVABLE)]], audienceOrgIds=["org-a"],
                   startsAt=L.rfc3339(now + 50 * DAY), endsAt=L.rfc3339(now + 51 * DAY))
    c.status("after restart: a new create -> 201", r, 201)
    recs = lab.audit_all()
    c.check("after restart: new audit records continue the chain",
            len(recs) == len(audit_before) + 1 and not L.verify_chain(recs), recs[-1:])


def _refuses(path):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        return False
    except OSError:
        return True
    finally:
        s.close()


def sighup(c, lab):
    admin = lab.admin()
    units = lab.npath("/units")
    c.status("before reload: EdDSA admin token -> 200", lab.get(units, admin), 200)
    c.status("before reload: ES256 token (key not listed) -> 401", lab.get(units, lab.admin(alg="ES256")), 401)
    good = open(lab.cfg).read()

    # an invalid config: refused, the old one keeps serving
    for label, text in (("broken YAML", good + "  : [\n"),
                        ("unknown key", good + "bogus_section: 1\n"),
                        ("missing node.id", good.replace(f"  id: {L.NODE}\n", "")),
                        ("a TLS file that does not exist", good.replace("tls.crt", "no-such.crt"))):
        since = len(lab.log())
        lab.write_config(text)
        lab.signal(signal.SIGHUP)
        refused = wait_log(lab, "refus", since)
        c.check(f"SIGHUP with {label}: the log says refused", refused, lab.log()[since:][-400:])
        c.check(f"SIGHUP with {label}: still running", lab.running(), lab.tail())
        r = lab.get(units, admin)
        c.status(f"SIGHUP with {label}: still serves with the old keys", r, 200)
        r = lab.get("/healthz")
        c.status(f"SIGHUP with {label}: TLS still works", r, 200)
    lab.write_config()

    # keys: only the P-256 key now
    lab.write_config(keys=("p256",))
    es = lab.jwt(lab._claims(org="org-platform", roles=["platform-admin"]), alg="ES256")
    ed = lab.jwt(lab._claims(org="org-platform", roles=["platform-admin"]), alg="EdDSA")
    t0 = time.time()
    lab.signal(signal.SIGHUP)
    time.sleep(max(0.0, t0 + 1.0 - time.time()))
    r_ed = lab.get(units, ed)
    r_es = lab.get(units, es)
    c.problem("1 s after SIGHUP (keys: P-256 only): EdDSA token -> 401", r_ed, 401, "unauthenticated")
    c.status("1 s after SIGHUP (keys: P-256 only): ES256 token -> 200", r_es, 200)
    c.check("ES256 answer is the units body", r_es.status == 200 and r_es.json.get("nodeId") == L.NODE, r_es)
    r = lab.get(units, lab.jwt(lab._claims(org="org-platform", roles=["platform-admin"]), alg="EdDSA", key="ed",
                               header={"alg": "ES256", "typ": "JWT"}))
    c.status("ES256 header over an Ed25519 signature -> 401", r, 401)
    hdr_none = lab.jwt(lab._claims(org="org-platform", roles=["platform-admin"]), alg="ES256",
                       header={"alg": "EdDSA", "typ": "JWT"})
    c.status("EdDSA header over a P-256 signature -> 401", lab.get(units, hdr_none), 401)
    c.check("the log says reloaded", "reload" in lab.log().lower(), lab.tail())
    # and back to both keys
    lab.write_config(keys=("ed", "p256"))
    t0 = time.time()
    lab.signal(signal.SIGHUP)
    time.sleep(max(0.0, t0 + 1.0 - time.time()))
    c.status("1 s after SIGHUP (both keys): EdDSA token -> 200", lab.get(units, ed), 200)
    c.status("1 s after SIGHUP (both keys): ES256 token -> 200", lab.get(units, es), 200)
    rc, took = lab.stop()
    c.check(f"SIGTERM after reloads: exit 0 ({took:.2f}s)", rc == 0 and took < 10, rc)


def no_http_answer(lab, ctx):
    """True when a request over ctx gets no HTTP answer at all (the handshake fails)."""
    try:
        r = lab.call("GET", "/healthz", ctx=ctx, timeout=5)
        return False, repr(r)
    except (ssl.SSLError, ConnectionError, http.client.RemoteDisconnected, OSError) as e:
        return True, repr(e)


def mtls(c, agent):
    with L.Lab(agent, mtls=True) as lab:
        lab.start()
        c.status("mTLS: a client with a certificate from client_ca gets /healthz", lab.get("/healthz"), 200)
        c.status("mTLS: and the API with a token", lab.get(lab.npath("/units"), lab.admin()), 200)
        ok, what = no_http_answer(lab, lab.client_context(cert=False))
        c.check("mTLS: a client without a certificate gets no HTTP answer", ok, what)
        d = lab.dir
        L.sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
              "-keyout", f"{d}/stranger.key", "-out", f"{d}/stranger.crt", "-days", "2", "-subj", "/CN=stranger"])
        ctx = ssl.create_default_context(cafile=f"{d}/tls.crt")
        ctx.load_cert_chain(f"{d}/stranger.crt", f"{d}/stranger.key")
        ok, what = no_http_answer(lab, ctx)
        c.check("mTLS: a client with a self-signed certificate not from client_ca gets no HTTP answer", ok, what)
        warnings.simplefilter("ignore", DeprecationWarning)  # TLS 1.0/1.1 on purpose
        for v in (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1):
            ctx = lab.client_context()
            try:
                ctx.minimum_version = v
                ctx.maximum_version = v
                ctx.set_ciphers("ALL:@SECLEVEL=0")
            except (ValueError, ssl.SSLError):
                continue
            ok, what = no_http_answer(lab, ctx)
            c.check(f"TLS: {v.name} is refused", ok, what)
        ctx = lab.client_context()
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        c.status("TLS: 1.2 with the client certificate works", lab.call("GET", "/healthz", ctx=ctx), 200)
        ctx = lab.client_context()
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers("ECDHE-ECDSA-AES128-GCM-SHA256")
        c.status("TLS: 1.2 ECDHE-ECDSA-AES128-GCM-SHA256 is accepted", lab.call("GET", "/healthz", ctx=ctx), 200)
        for suite in ("ECDHE-ECDSA-AES128-SHA", "ECDHE-ECDSA-AES256-SHA384"):
            ctx = lab.client_context()
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
            ctx.set_ciphers(suite)
            ok, what = no_http_answer(lab, ctx)
            c.check(f"TLS: 1.2 CBC suite {suite} is refused (intermediate profile)", ok, what)
        c.status("mTLS: the admin socket needs no certificate", lab.call("GET", lab.npath("/units"), unix=True), 200)
        c.status("mTLS: still serving after the refused handshakes", lab.get("/healthz"), 200)
        rc, _ = lab.stop()
        c.eq("mTLS: SIGTERM exit code", rc, 0)


def admin_socket_peers(c, agent):
    """A peer whose uid is not in allowed_uids (and no allowed_group) gets nothing from the socket."""
    with L.Lab(agent) as lab:
        lab.write_config(admin_uids=[os.getuid() + 4242])
        lab.start()
        try:
            r = lab.call("GET", lab.npath("/units"), unix=True, timeout=5)
            ok, what = r.status in (401, 403), repr(r)
        except (OSError, http.client.HTTPException) as e:
            ok, what = True, repr(e)
        c.check("admin socket: a peer whose uid is not allowed is refused", ok, what)
        c.status("admin socket: HTTPS still serves meanwhile", lab.get(lab.npath("/units"), lab.admin()), 200)
        rc, _ = lab.stop()
        c.eq("admin socket lab: SIGTERM exit code", rc, 0)


def main(c, agent):
    with L.Lab(agent) as lab:
        lab.start()
        restart(c, lab)
        sighup(c, lab)
    mtls(c, agent)
    admin_socket_peers(c, agent)


if __name__ == "__main__":
    sys.exit(L.run_main("lifecycle", main))
