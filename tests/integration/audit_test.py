#!/usr/bin/env python3
"""Signed audit checkpoints and verification anyone can run (CONTRACT §12), against the fake
central API over real mTLS:
  - the node key is made at first start (0600), its public half is the heartbeat's auditKey and the
    checkpoints answer's; each checkpoint is an audit.checkpoint event whose data is what
    GET audit/checkpoints answers; a checkpoint does not move the revision;
  - checkpoints come every audit.checkpoint_interval when the chain has grown (not otherwise), and
    at stop (SIGTERM), delivered by the next agent;
  - GET audit/checkpoints pages oldest first; a bad after or limit is 400 naming the field;
  - gpunodectl audit export writes the records then the checkpoints; audit verify passes on the
    file with the key and live, and the export recomputes independently here (hashlib + json.dumps
    per §4, the signatures with `openssl pkeyutl -verify -rawin`, keyId per RFC 7638);
  - tampering is caught and named, exit 1: a changed field, a dropped record, a reordered pair, a
    forged checkpoint (hash, signature), another key; and issue 37's forgeries, which need the
    verifier to fail closed: a chain rewritten whole without its checkpoints, a record fabricated,
    the head cut off, a record rewritten or appended after the last checkpoint, an empty file, ids
    with gaps;
  - the export ends signed (POST /v1/admin/audit/checkpoint first), also one second after start;
    an export --after a signed record is anchored by its checkpoint, and refused after one that is
    not signed.

    audit_test.py PATH/TO/gpunode-agent   (gpunodectl beside it)"""
import base64
import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import time

sys.dont_write_bytecode = True
import lab as L  # noqa: E402

U81 = "u-0000-81-00-0"


def b64u(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def unb64u(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def ctl(lab, *args):
    exe = os.path.join(os.path.dirname(lab.agent), "gpunodectl")
    return subprocess.run([exe, "--socket", lab.sock, *args], capture_output=True, text=True, timeout=60)


def checkpoints(lab, query=""):
    return lab.get(lab.npath("/audit/checkpoints" + query), unix=True)


def independent(c, lab, lines, pub):
    """The export recomputed here, with no code of the agent's."""
    objs = [json.loads(x) for x in lines]
    recs = [o for o in objs if "id" in o]
    cps = [o for o in objs if "signature" in o and "id" not in o]
    c.eq("independent: the chain recomputes from aud_1 (hashlib, json.dumps)", L.verify_chain(recs), [])
    raw = subprocess.run(["openssl", "pkey", "-pubin", "-in", pub, "-outform", "DER"], capture_output=True,
                         check=True).stdout[-32:]
    jwk = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": b64u(raw)}, sort_keys=True, separators=(",", ":"))
    kid = b64u(hashlib.sha256(jwk.encode()).digest())
    by_seq = {int(r["id"][4:]): r for r in recs}
    bad = []
    for i, cp in enumerate(cps):
        r = by_seq.get(cp["seq"])
        msg, sig = os.path.join(lab.dir, f"msg.{i}"), os.path.join(lab.dir, f"sig.{i}")
        with open(msg, "wb") as f:
            f.write(f"{r['nodeId']}\n{cp['seq']}\n{cp['hash']}\n{cp['at']}".encode())
        with open(sig, "wb") as f:
            f.write(unb64u(cp["signature"]))
        ok = subprocess.run(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", pub, "-rawin", "-in", msg,
                             "-sigfile", sig], capture_output=True).returncode == 0
        if not (r and r["hash"] == cp["hash"] and cp["keyId"] == kid and ok):
            bad.append(cp)
    c.check(f"independent: {len(cps)} checkpoints hold their record's hash, keyId {kid}, and verify with openssl",
            cps and not bad, bad[:2])
    c.check("independent: a checkpoint covers the last record (the export ends signed)",
            recs and cps and max(cp["seq"] for cp in cps) == int(recs[-1]["id"][4:]), (recs[-1:], cps[-1:]))


def tampered(c, lab, lines, pub, label, edit, want):
    path = os.path.join(lab.dir, f"tampered-{label.replace(' ', '-')}.jsonl")
    with open(path, "w") as f:
        f.write("".join(x + "\n" for x in edit(list(lines))))
    p = ctl(lab, "audit", "verify", "--file", path, "--key", pub)
    c.check(f"tampered ({label}): exit 1, named: {p.stderr.strip()}", p.returncode == 1 and want in p.stderr,
            (p.returncode, p.stdout, p.stderr))


def edit_record(lines, idx, key, value):
    r = json.loads(lines[idx])
    r[key] = value
    lines[idx] = json.dumps(r, separators=(",", ":"), ensure_ascii=False)
    return lines


def sealed(records, first=0):
    """The records from index `first` sealed again after the one before: a forger's chain that holds."""
    for i in range(first, len(records)):
        records[i]["prevHash"] = records[i - 1]["hash"] if i else "0" * 64
        records[i]["hash"] = L.audit_hash(records[i])
    return records


def dumps(objs):
    return [json.dumps(o, separators=(",", ":"), ensure_ascii=False) for o in objs]


def forgeries(c, lab, lines, pub):
    """Issue 37's table: exports an attacker with the node's public key makes, each of which the
    verifier once passed. Each exits 1 now, naming what is missing or broken (the message printed)."""
    recs = [json.loads(x) for x in lines if '"signature"' not in x]
    cps = [json.loads(x) for x in lines if '"signature"' in x]
    n = len(recs)
    head_cp = [cp for cp in cps if cp["seq"] == n]
    c.check(f"the export ends signed: its last checkpoint is at its last record aud_{n}", head_cp, cps[-2:])
    rogue = os.path.join(lab.dir, "rogue.pub")
    nobody = {"sub": "mallory", "org": None, "roles": ["platform-admin"], "via": "https"}

    edited = [dict(r) for r in recs]
    edited[1].update(actor=nobody, detail="edited")
    sealed(edited, 1)
    fabricated = sealed([{"id": "aud_1", "at": L.rfc3339(time.time()), "actor": nobody, "action": "reservation.end",
                          "nodeId": L.NODE, "reservationId": "rsv_x", "unitIds": [], "vmIds": [], "result": "ok",
                          "detail": "", "requestId": None}])
    before_head = [cp for cp in cps if cp["seq"] < n]
    last_signed = before_head[-1]["seq"] if before_head else 0
    rewritten = [dict(r) for r in recs]
    rewritten[-1]["detail"] = "rewritten after the last checkpoint"
    sealed(rewritten, n - 1)
    appended = sealed([dict(r) for r in recs] + [dict(recs[-1], id=f"aud_{n + 1}", detail="appended")], n)
    gaps = sealed([dict(r) for r in recs[:3]])
    gaps[1]["id"], gaps[2]["id"] = "aud_5", "aud_9"
    sealed(gaps, 1)
    rows = [
        ("a record edited (actor and detail), every hash recomputed, the checkpoint lines deleted", dumps(edited), pub,
         f"no checkpoint covers aud_1..aud_{n}"),
        ("one record fabricated from nothing, no checkpoint", dumps(fabricated), pub, "no checkpoint covers aud_1..aud_1"),
        ("the same, verified with an unrelated Ed25519 key", dumps(fabricated), rogue, "no checkpoint covers aud_1..aud_1"),
        ("the head cut off (aud_1..aud_3 dropped), the genuine checkpoint kept", dumps(recs[3:] + head_cp), pub,
         "the export does not start at aud_1 (its first record is aud_4), and no signed checkpoint at aud_3"),
        ("a record rewritten after the last checkpoint", dumps(rewritten + before_head), pub,
         f"no checkpoint covers aud_{last_signed + 1}..aud_{n}"),
        ("a record appended after the last checkpoint", dumps(appended + cps), pub,
         f"no checkpoint covers aud_{n + 1}..aud_{n + 1}"),
        ("an empty file", [], pub, "no records"),
        ("ids aud_1, aud_5, aud_9", dumps(gaps), pub, "aud_5: ids jump from aud_1 to aud_5"),
    ]
    for label, forged, key, want in rows:
        tampered(c, lab, forged, key, label, lambda ls: ls, want)


def fresh_export(c, lab, cfg):
    """A genuine export made one second after start-up, with one record: whole (the export asks the
    agent to sign its head first)."""
    lab.stop()
    shutil.rmtree(lab.state)
    lab.write_config(cfg.replace("checkpoint_interval: 1s", "checkpoint_interval: 1h"))
    lab.start()
    s = time.time() + 86400 * 60
    lab.create(None, unitIds=[U81], audienceOrgIds=["org-a"], startsAt=L.rfc3339(s), endsAt=L.rfc3339(s + 3600))
    time.sleep(1)
    out = os.path.join(lab.dir, "fresh.jsonl")
    p = ctl(lab, "audit", "export", "--output", out)
    c.eq("one second after start, one record: audit export exit 0", (p.returncode, p.stderr), (0, ""))
    key = os.path.join(lab.state, "audit-signing.key")
    pub = os.path.join(lab.dir, "fresh.pub")
    subprocess.run(["openssl", "pkey", "-in", key, "-pubout", "-out", pub], check=True)
    p = ctl(lab, "audit", "verify", "--file", out, "--key", pub)
    c.check(f"... and it verifies whole, exit 0 ({p.stdout.strip()})",
            p.returncode == 0 and p.stdout.startswith("audit verify: whole: 1 record, aud_1 to aud_1"),
            (p.returncode, p.stdout, p.stderr))
    independent(c, lab, open(out).read().splitlines(), pub)


def after_exports(c, lab, lines, pub):
    """export --after ID: anchored at the signed checkpoint of ID, and refused where none signs ID."""
    cps = [json.loads(x) for x in lines if '"signature"' in x]
    recs = [json.loads(x) for x in lines if '"signature"' not in x]
    anchor = cps[0]["seq"]
    out = os.path.join(lab.dir, "after.jsonl")
    p = ctl(lab, "audit", "export", "--after", f"aud_{anchor}", "--output", out)
    c.eq(f"audit export --after aud_{anchor} (a signed record): exit 0", (p.returncode, p.stderr), (0, ""))
    sliced = open(out).read().splitlines()
    c.eq("... its records start after it, its first checkpoint is the anchor's",
         (json.loads(sliced[0])["id"], [json.loads(x)["seq"] for x in sliced if '"signature"' in x][:1]),
         (f"aud_{anchor + 1}", [anchor]))
    p = ctl(lab, "audit", "verify", "--file", out, "--key", pub)
    c.check(f"... verifies whole, saying what it did not check ({p.stdout.strip()})",
            p.returncode == 0 and f"after the signed checkpoint at aud_{anchor}" in p.stdout
            and "not in this export and were not checked here" in p.stdout, (p.returncode, p.stdout, p.stderr))
    signed = {cp["seq"] for cp in cps}
    unsigned = [int(r["id"][4:]) for r in recs if int(r["id"][4:]) not in signed]
    if unsigned:
        p = ctl(lab, "audit", "export", "--after", f"aud_{unsigned[0]}")
        c.check(f"audit export --after aud_{unsigned[0]} (no checkpoint signs it): exit 1, naming the next signed one"
                f" ({p.stderr.strip()})", p.returncode == 1 and f"no checkpoint signs aud_{unsigned[0]}" in p.stderr,
                (p.returncode, p.stderr))
    p = ctl(lab, "audit", "export", "--after", "aud_x")
    c.eq("audit export --after aud_x: a usage error", p.returncode, 2)


def body(c, lab, fc):
    day = 86400
    cfg = lab.config_text(central=lab.central_text(fc.url)) + "audit:\n  checkpoint_interval: 1s\n"
    lab.write_config(cfg)
    lab.start()
    key = os.path.join(lab.state, "audit-signing.key")
    mode = stat.S_IMODE(os.stat(key).st_mode) if os.path.exists(key) else None
    c.eq("the node key is made at first start, mode 0600", oct(mode or 0), oct(0o600))
    pub = os.path.join(lab.dir, "node.pub")
    subprocess.run(["openssl", "pkey", "-in", key, "-pubout", "-out", pub], check=True)
    pem = open(pub).read()
    hb = fc.wait_for(lambda: list(fc.heartbeats), 5)
    c.eq("the heartbeat's auditKey is the node key's public PEM", (hb[0]["body"].get("auditKey") if hb else None), pem)
    c.eq("GET audit/checkpoints: none yet, auditKey", (checkpoints(lab).json or {}).get("auditKey"), pem)

    ids = []
    for i in range(3):
        s = time.time() + day * (10 + i)
        r = lab.create(None, unitIds=[U81], audienceOrgIds=["org-a"], startsAt=L.rfc3339(s), endsAt=L.rfc3339(s + 3600))
        ids.append(r.json["id"])
    lab.call("POST", lab.npath(f"/reservations/{ids[0]}/end"), body={"reason": "audit test"}, unix=True)
    head = len(lab.audit_all())

    def cp_events():
        with fc.lock:
            return [e for e in fc.events.values() if e.get("type") == "audit.checkpoint"]
    got = fc.wait_for(lambda: [e for e in cp_events() if e["data"]["seq"] == head], 5)
    c.check(f"an audit.checkpoint event for the head aud_{head} within the interval", got, cp_events())
    rev = lab.get(lab.npath("/state"), unix=True).json["revision"]
    time.sleep(2.5)
    c.eq("no new checkpoint while the chain does not grow", [e["data"]["seq"] for e in cp_events()][-1:], [head])
    c.eq("a checkpoint does not move the revision", lab.get(lab.npath("/state"), unix=True).json["revision"], rev)
    listed = checkpoints(lab).json["checkpoints"]
    c.eq("the events' data are the checkpoints GET audit/checkpoints lists", [e["data"] for e in cp_events()], listed)
    c.check("checkpoint keys and types", all(set(x) == {"seq", "hash", "at", "keyId", "signature"}
                                             and isinstance(x["seq"], int) for x in listed), listed)

    # A second checkpoint, then paging.
    s = time.time() + day * 30
    lab.create(None, unitIds=[U81], audienceOrgIds=["org-b"], startsAt=L.rfc3339(s), endsAt=L.rfc3339(s + 3600))
    fc.wait_for(lambda: len(cp_events()) >= 2, 5)
    p1 = checkpoints(lab, "?limit=1").json
    p2 = checkpoints(lab, f"?limit=1&pageToken={p1['nextPageToken']}").json if p1.get("nextPageToken") else {}
    c.check("paging: limit=1 pages oldest first", len(p1["checkpoints"]) == 1 and p2.get("checkpoints")
            and p2["checkpoints"][0]["seq"] > p1["checkpoints"][0]["seq"], (p1, p2))
    after = checkpoints(lab, f"?after={p1['checkpoints'][0]['seq']}").json["checkpoints"]
    c.check("after=SEQ: the later ones", after and all(x["seq"] > p1["checkpoints"][0]["seq"] for x in after), after)
    for q, field in (("?after=aud_1", "after"), ("?after=-1", "after"), ("?limit=0", "limit"), ("?limit=501", "limit")):
        r = checkpoints(lab, q)
        c.check(f"GET audit/checkpoints{q}: 400 naming {field}",
                r.status == 400 and [e["field"] for e in r.json["errors"]] == [field], r)

    # The stop's checkpoint: interval 1h, a change, SIGTERM; stored, then delivered by the next agent.
    lab.stop()
    lab.write_config(cfg.replace("checkpoint_interval: 1s", "checkpoint_interval: 1h"))
    lab.start()
    lab.create(None, unitIds=[U81], audienceOrgIds=["org-c"], startsAt=L.rfc3339(s + day),
               endsAt=L.rfc3339(s + day + 3600))
    head = len(lab.audit_all())
    rc, took = lab.stop()
    db = sqlite3.connect(os.path.join(lab.state, "state.db"))
    last = db.execute("SELECT max(seq) FROM checkpoints").fetchone()[0]
    schema = db.execute("SELECT version, name FROM schema_version ORDER BY version").fetchall()
    db.close()
    c.eq("SIGTERM: a checkpoint of the head is stored at stop", last, head)
    c.check(f"SIGTERM: exit 0 within 2 s ({took:.2f} s)", rc == 0 and took < 2, (rc, took))
    c.check("state.db holds migration 4 (audit checkpoints)", (4, "audit checkpoints") in schema, schema)
    lab.start()
    c.check("the stop's checkpoint is delivered by the next agent",
            fc.wait_for(lambda: [e for e in cp_events() if e["data"]["seq"] == head], 5), cp_events()[-2:])
    key_line = lab.log_line("audit signing key", "keyId")
    c.check("the start's log names the key and its keyId", key_line, lab.tail())

    # Export, verify offline and live, and the independent recomputation.
    out = os.path.join(lab.dir, "export.jsonl")
    p = ctl(lab, "audit", "export", "--output", out)
    c.eq("gpunodectl audit export --output: exit 0", (p.returncode, p.stderr), (0, ""))
    lines = open(out).read().splitlines()
    kinds = ["cp" if "signature" in json.loads(x) else "rec" for x in lines]
    c.check("the export: records, then checkpoints, one JSON object a line",
            kinds == sorted(kinds, key=lambda k: k == "cp") and "cp" in kinds and kinds[0] == "rec", kinds)
    c.eq("the export's records are GET audit's", [json.loads(x) for x in lines if '"signature"' not in x],
         lab.audit_all())
    p2 = ctl(lab, "audit", "export")
    c.eq("export to stdout is the same text", p2.stdout, "".join(x + "\n" for x in lines))
    p = ctl(lab, "audit", "verify", "--file", out, "--key", pub)
    c.check(f"audit verify --file --key: exit 0 ({p.stdout.strip()})", p.returncode == 0 and "whole" in p.stdout,
            (p.returncode, p.stdout, p.stderr))
    p = ctl(lab, "audit", "verify")
    c.check(f"audit verify (live): exit 0 ({p.stdout.strip()})", p.returncode == 0 and "whole" in p.stdout,
            (p.returncode, p.stdout, p.stderr))
    p = ctl(lab, "audit", "verify", "--file", out)
    c.eq("audit verify --file without --key: a usage error", p.returncode, 2)
    independent(c, lab, lines, pub)

    n_rec = kinds.count("rec")
    tampered(c, lab, lines, pub, "changed field", lambda ls: edit_record(ls, 2, "result", "failed"),
             "aud_3: hash mismatch")
    tampered(c, lab, lines, pub, "dropped record", lambda ls: ls[:1] + ls[2:], "aud_3: ids jump from aud_1 to aud_3")
    tampered(c, lab, lines, pub, "reordered pair", lambda ls: ls[:1] + [ls[2], ls[1]] + ls[3:],
             "aud_3: ids jump from aud_1 to aud_3")
    cp0 = json.loads(lines[n_rec])
    tampered(c, lab, lines, pub, "forged checkpoint hash",
             lambda ls: edit_record(ls, n_rec, "hash", json.loads(ls[0])["hash"]), f"checkpoint seq {cp0['seq']}: hash")
    sig = cp0["signature"]
    forged = ("A" if sig[0] != "A" else "B") + sig[1:]
    tampered(c, lab, lines, pub, "forged signature", lambda ls: edit_record(ls, n_rec, "signature", forged),
             f"checkpoint seq {cp0['seq']}: signature does not verify")
    tampered(c, lab, lines, os.path.join(lab.dir, "rogue.pub"), "another key", lambda ls: ls,
             f"checkpoint seq {cp0['seq']}: signed by key")
    tampered(c, lab, lines, pub, "the head dropped", lambda ls: ls[:n_rec - 1] + ls[n_rec:], "no record")
    forgeries(c, lab, lines, pub)
    after_exports(c, lab, lines, pub)

    r = lab.call("POST", "/v1/admin/audit/checkpoint", unix=True)
    head = len(lab.audit_all())
    c.check(f"POST /v1/admin/audit/checkpoint: the head's checkpoint (aud_{head})",
            r.status == 200 and r.json["seq"] == head, r)
    c.eq("... the same one when asked again with no record since",
         lab.call("POST", "/v1/admin/audit/checkpoint", unix=True).json, r.json)
    c.status("... not a route of HTTPS", lab.call("POST", "/v1/admin/audit/checkpoint", token=lab.admin()), 404)
    fresh_export(c, lab, cfg)


if __name__ == "__main__":
    sys.exit(L.run_with_central("audit", body))
