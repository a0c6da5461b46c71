#!/usr/bin/env python3
"""Upgrades keep the state (CONTRACT §11): the real agent started on a state directory that an
earlier release wrote, and an earlier agent refused one that a newer release wrote.

Every schema the project released is a fixture under tests/fixtures/state/ (`sqlite3 .dump` of a
state.db that release's agent wrote on the demo host, see the README there): 0.1.0's is schema 2.
For each: the agent migrates it at start (schema_version gains the new versions); the live
reservations are in GET state, the ended one is paged by GET reservations?state=ended and read by
id; the audit chain goes on from the old records and verifies whole; a create works; after a
restart nothing changes. Then a state.db whose schema is newer than this agent's: it refuses to
start, naming both versions, and the file is left as it was.

    upgrade_test.py PATH/TO/gpunode-agent
"""
import glob
import json
import os
import re
import sqlite3
import subprocess
import sys
import time

sys.dont_write_bytecode = True
import lab as L  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "state")


def load_fixture(lab, sql_file):
    os.makedirs(lab.state, exist_ok=True)
    db = sqlite3.connect(os.path.join(lab.state, "state.db"))
    with open(sql_file, encoding="utf-8") as f:
        db.executescript(f.read())
    db.close()


def schema(lab):
    db = sqlite3.connect(os.path.join(lab.state, "state.db"))
    try:
        return [v for (v,) in db.execute("SELECT version FROM schema_version ORDER BY version")]
    finally:
        db.close()


def one_release(c, agent, sql_file):
    release = re.sub(r"^state-|\.sql$", "", os.path.basename(sql_file))
    with L.Lab(agent) as lab:
        load_fixture(lab, sql_file)
        before = schema(lab)
        db = sqlite3.connect(os.path.join(lab.state, "state.db"))
        docs = {rid: doc for rid, doc in db.execute("SELECT id, doc FROM reservations")}
        old_audit = db.execute("SELECT count(*) FROM audit").fetchone()[0]
        db.close()
        states = {rid: json.loads(d)["state"] for rid, d in docs.items()}
        ended = sorted(r for r, s in states.items() if s == "ended")
        live = sorted(r for r, s in states.items() if s != "ended")
        c.check(f"{release}: the fixture holds live and ended reservations ({len(live)} live, {len(ended)} ended)",
                live and ended, states)

        lab.start()
        after = schema(lab)
        c.check(f"{release}: migrated at start (schema {before[-1]} -> {after[-1]})",
                after[:len(before)] == before and len(after) > len(before), (before, after))
        state = lab.get(lab.npath("/state"), token=lab.admin()).json
        c.eq(f"{release}: GET state holds the live reservations only", sorted(x["id"] for x in state["reservations"]), live)
        c.eq(f"{release}: GET reservations?state=ended pages the ended ones",
             sorted(x["id"] for x in lab.reservations_all(state="ended")), ended)
        metrics = lab.get("/metrics", unix=True).body.decode()
        c.check(f"{release}: the ended ones counted by the migration (gpunode_reservations ended {len(ended)})",
                f'gpunode_reservations{{state="ended"}} {len(ended)}\n' in metrics,
                [l for l in metrics.splitlines() if l.startswith("gpunode_reservations")])
        for rid in ended:
            got = lab.get(lab.npath(f"/reservations/{rid}"), unix=True)
            c.check(f"{release}: the ended {rid} is read by id, as it was stored",
                    got.status == 200 and got.json == json.loads(docs[rid]), got)
        for rid in live:
            got = lab.get(lab.npath(f"/reservations/{rid}"), unix=True)
            c.check(f"{release}: the live {rid} is read by id, as it was stored",
                    got.status == 200 and got.json == json.loads(docs[rid]), got)
        made = lab.create(unitIds=[L.VFIO_UNITS[2]], audienceOrgIds=["org-new"],
                          startsAt=L.rfc3339(time.time() + 400 * 86400), endsAt=L.rfc3339(time.time() + 401 * 86400))
        c.check(f"{release}: a create after the upgrade", made.status == 201, made)
        records = lab.audit_all()
        c.check(f"{release}: the audit chain goes on from the old records and verifies whole "
                f"({old_audit} old, {len(records)} in all)",
                len(records) > old_audit and not L.verify_chain(records), L.verify_chain(records)[:3])
        lab.stop()
        lab.start()
        c.eq(f"{release}: after a restart, the same reservations",
             sorted(x["id"] for x in lab.reservations_all()), sorted(live + ended + [made.json["id"]]))
        c.eq(f"{release}: ... and the same schema", schema(lab), after)
        lab.stop()


def newer_schema(c, agent):
    with L.Lab(agent) as lab:
        lab.start()
        lab.stop()
        mine = schema(lab)[-1]
        db = sqlite3.connect(os.path.join(lab.state, "state.db"))
        with db:
            db.execute("INSERT INTO schema_version (version, name, applied_at) VALUES (?, 'from a newer agent', "
                       "'2030-01-01T00:00:00Z')", (mine + 1,))
        db.close()
        with open(os.path.join(lab.state, "state.db"), "rb") as f:
            bytes_before = f.read()
        p = subprocess.run([agent, "run", "--config", lab.cfg], capture_output=True, text=True, timeout=60)
        c.check(f"a state.db of schema {mine + 1} (newer): the agent refuses to start, naming both versions",
                p.returncode != 0 and f"schema version {mine + 1} is newer than this agent ({mine})" in p.stderr,
                p.stderr[-400:])
        with open(os.path.join(lab.state, "state.db"), "rb") as f:
            c.check("... and leaves the file as it was", f.read() == bytes_before)


def main(c, agent):
    releases = sorted(glob.glob(os.path.join(FIXTURES, "state-*.sql")))
    c.check(f"released schemas to upgrade from: {[os.path.basename(r) for r in releases]}", releases)
    for sql_file in releases:
        one_release(c, agent, sql_file)
    newer_schema(c, agent)


if __name__ == "__main__":
    sys.exit(L.run_main("upgrade", main))
