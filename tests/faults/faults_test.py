#!/usr/bin/env python3
"""Faults at the agent's edges (issue 15, item 4), each injected into the real `gpunode-agent run`
and each ending with the agent serving, nothing acknowledged lost, and the log line that says what
happened (asserted by its text).

    faults_test.py PATH/TO/gpunode-agent SCENARIO

SCENARIO is one of:
  disk      the state directory on a small tmpfs, filled to the last page: commits go on in the
            WAL's preallocated pages, then one that must grow it (503 `storage-unavailable`),
            the outbox delete after an acknowledgement, and the checkpoint
            SQLite runs when the agent stops all fail with ENOSPC; the agent starts again on the
            full disk and serves what it has; once space is back, everything acknowledged is there
  checkpoint  SQLite's auto-checkpoint failing on the full disk while commits still fit in the
            WAL's pages (acknowledged), then 503 once the WAL must grow; SIGKILL loses nothing
  readonly  state.db and its WAL made immutable (chattr +i: read-only even for root) under the
            running agent, then at its start
  central   the central API answers an event batch's headers and half its body, then stalls
  sighup    SIGHUP with the TLS key file, then a token key file, missing: the old ones stay

`disk`, `checkpoint` and `readonly` need root (mount, chattr); without it they print `SKIP: why`
and exit 77. Each prints one line per check and ends with `N passed, M failed` (exit 1 on any failure)."""
import errno
import hashlib
import os
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration"))
import lab as L  # noqa: E402

SKIP = 77
U = L.RESERVABLE


def skip(why):
    print(f"SKIP: {why}", flush=True)
    sys.exit(SKIP)


def need_root(what):
    if os.geteuid() != 0:
        skip(f"{what} needs root")


def new_reservation(lab, i, **extra):
    """A scheduled reservation far in the future (no occupancy check, no term firing): its id, or the answer."""
    starts = time.time() + 86400 * (40 + i)
    body = dict(unitIds=[U[i % len(U)]], audienceOrgIds=["org-a"], startsAt=L.rfc3339(starts),
                endsAt=L.rfc3339(starts + 3600), note=f"fault {i}", **extra)
    return lab.create(None, **body)


class Acked:
    """Every change the agent acknowledged (201), as it answered it."""

    def __init__(self, lab):
        self.lab, self.by_id, self.n = lab, {}, 0

    def create(self):
        self.n += 1
        r = new_reservation(self.lab, self.n)
        if r.status == 201:  # as a list shows it (the create's answer adds spotWorkloads)
            self.by_id[r.json["id"]] = {k: v for k, v in r.json.items() if k != "spotWorkloads"}
        return r

    def create_until_refused(self, most):
        """Creates until one is not 201 (at most `most`); returns how many were acknowledged and
        the last answer."""
        n0, r = len(self.by_id), None
        for _ in range(most):
            r = self.create()
            if r.status != 201:
                break
        return len(self.by_id) - n0, r

    def amend(self, rid, body):
        r = self.lab.call("PATCH", self.lab.npath(f"/reservations/{rid}"), body=body, unix=True)
        if r.status == 200:
            self.by_id[rid] = {k: v for k, v in r.json.items() if k != "spotWorkloads"}
        return r

    def check_all_there(self, c, label):
        """Every acknowledged reservation, as acknowledged; the audit chain from aud_1."""
        have = {x["id"]: x for x in self.lab.reservations_all()}
        lost = [i for i in self.by_id if i not in have]
        changed = [i for i, x in self.by_id.items() if i in have and have[i] != x]
        c.check(f"{label}: all {len(self.by_id)} acknowledged reservations present exactly as acknowledged",
                not lost and not changed, (lost[:3], changed[:3]))
        records = self.lab.audit_all()
        c.eq(f"{label}: the audit chain verifies from aud_1 ({len(records)} records)", L.verify_chain(records), [])
        creates = {r["reservationId"] for r in records if r["action"] == "reservation.create" and r["result"] == "ok"}
        c.check(f"{label}: one audit record per acknowledged create, none for a refused one",
                creates == set(self.by_id), sorted(creates ^ set(self.by_id))[:3])


def wait_for(cond, timeout):
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def outbox_state(lab):
    db = sqlite3.connect(f"file:{os.path.join(lab.state, 'state.db')}?mode=ro", uri=True)
    try:
        return (db.execute("SELECT count(*) FROM outbox").fetchone()[0],
                int(db.execute("SELECT value FROM meta WHERE key = 'event_seq'").fetchone()[0]))
    finally:
        db.close()


def check_delivery(c, fc, lab, label):
    """Every event written is at the central API: seq dense from 1, each exactly once after dedup by seq."""
    _, written = outbox_state(lab)
    ok = fc.wait_for(lambda: fc.acked() >= written, 15)
    c.check(f"{label}: every event delivered ({fc.acked()} of {written})", ok, fc.acked())
    c.eq(f"{label}: seq dense from 1", sorted(fc.events), list(range(1, written + 1)))
    c.eq(f"{label}: nothing sent twice with another content, no batch out of order", fc.problems, [])


# ---------------------------------------------------------------------------------------------
# disk full

def mount_tmpfs(path, size):
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "gpunode-faults", path],
                       capture_output=True, text=True)
    if r.returncode != 0:
        skip(f"cannot mount a tmpfs: {r.stderr.strip()}")


def umount(path):
    subprocess.run(["umount", path], capture_output=True)
    if os.path.ismount(path):
        subprocess.run(["umount", "-l", path], capture_output=True)


def fill(directory):
    """Fills the file system of `directory` to its last page with a file; returns its path."""
    path = os.path.join(directory, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9):
            block = b"\0" * chunk
            while True:
                try:
                    if os.write(fd, block) < chunk:
                        break
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return path


def scenario_disk(c, agent):
    need_root("a tmpfs for the state directory")
    with L.Lab(agent) as lab:
        fc = lab.fake_central()
        mount_tmpfs(lab.state, "8m")
        try:
            disk_body(c, lab, fc)
        finally:
            lab.kill()
            fc.close()
            umount(lab.state)


def disk_body(c, lab, fc):
    lab.write_config(lab.config_text(central=lab.central_text(fc.url)))
    lab.start()
    acked = Acked(lab)
    for _ in range(5):
        c.status("before: a create is 201", acked.create(), 201)
    check_delivery(c, fc, lab, "before")

    # The central API goes away; changes queue in the outbox.
    fc.down()
    for _ in range(3):
        c.status("central down: a create is 201 (its events wait in the outbox)", acked.create(), 201)
    filler = fill(lab.state)
    st = os.statvfs(lab.state)
    c.check(f"the state directory's file system is full ({st.f_bavail} blocks free)", st.f_bavail == 0, st.f_bavail)

    # (1) commits on a full disk: the WAL's preallocated pages (zeros the agent wrote at its start)
    # take them, acknowledged and durable, until SQLite's auto-checkpoint cannot grow state.db and
    # the WAL must grow: then 503.
    on_full, r = acked.create_until_refused(2000)
    c.check(f"disk full: {on_full} creates acknowledged in the WAL's preallocated pages", on_full > 10, on_full)
    c.problem("disk full: once the WAL must grow, a create is 503 storage-unavailable", r, 503, "storage-unavailable")
    c.check("disk full: the answer says so (SQLite's code survives to it), naming no file",
            "(disk full)" in r.json.get("detail", "") and "state.db" not in r.json.get("detail", ""), r.json)
    c.check("log: " + "state commit failed: disk full (SQLITE_FULL...): ... database or disk is full",
            "database or disk is full" in lab.log_line("state commit failed")
            and "disk full (SQLITE_FULL" in lab.log_line("state commit failed"),
            lab.tail(600))
    # The failed create's frames went where the WAL's last page had room; a smaller change may
    # still fit there (acknowledged, and kept as acknowledged), a few more do not.
    first = next(iter(acked.by_id))
    for i in range(20):
        r = acked.amend(first, {"note": f"on a full disk {i}"})
        if r.status != 200:
            break
    c.problem("disk full: an amend is 503 storage-unavailable", r, 503, "storage-unavailable")
    c.status("disk full: /healthz 200", lab.get("/healthz"), 200)
    acked.check_all_there(c, "disk full")

    # (2) the outbox delete after an acknowledgement, on the full disk
    depth_before, written = outbox_state(lab)
    fc.up()
    ok = fc.wait_for(lambda: fc.acked() >= written, 15)
    c.check(f"disk full: the queued events are delivered ({fc.acked()} of {written})", ok, fc.acked())
    c.check("log: central: acknowledged through seq N but cannot delete it from the outbox: ... database or disk is full",
            "database or disk is full" in lab.log_line("cannot delete it from the outbox"),
            lab.tail(600))
    depth, _ = outbox_state(lab)
    c.check(f"disk full: the acknowledged rows stay in the outbox ({depth} of {depth_before})", depth == depth_before > 0, depth)

    # Space for a moment: the reporter deletes the acknowledged rows at its next turn, no new event needed.
    os.unlink(filler)
    emptied = wait_for(lambda: outbox_state(lab)[0] == 0, 8)
    c.check("space for a moment: the acknowledged rows are deleted at the reporter's next turn", emptied, outbox_state(lab))
    c.check("log: central: the acknowledged events through seq N are deleted from the outbox now",
            bool(lab.log_line("are deleted from the outbox now")), lab.tail(600))
    beats = len(fc.heartbeats)
    hb = fc.wait_for(lambda: [b for b in fc.heartbeats[beats:] if b["body"]["outboxDepth"] == 0], 4)
    c.check("space for a moment: a heartbeat says outboxDepth 0", hb, [b["body"]["outboxDepth"] for b in fc.heartbeats[-3:]])
    filler = fill(lab.state)
    # With space, SQLite's checkpoint grew state.db and the WAL started again from its first page:
    # fill its pages again, so that the checkpoint at the stop needs state.db to grow.
    _, r = acked.create_until_refused(2000)
    c.problem("disk full again: once the WAL must grow, a create is 503 storage-unavailable", r, 503, "storage-unavailable")

    # (3) the checkpoint: SQLite's last connection copies the WAL into state.db when the agent stops
    rc, took = lab.stop()
    c.check(f"disk full: SIGTERM stops it cleanly ({rc}, {took:.2f}s)", rc == 0 and took < 10, (rc, took))
    wal = os.path.join(lab.state, "state.db-wal")
    c.check("disk full: the checkpoint at the stop could not finish: the WAL is kept",
            os.path.exists(wal) and os.path.getsize(wal) > 0, os.listdir(lab.state))

    # The agent starts on the full disk and serves what it has.
    lab.start()
    c.status("restart on the full disk: /healthz 200", lab.get("/healthz"), 200)
    acked.check_all_there(c, "restart on the full disk")
    c.problem("restart on the full disk: a create is 503", acked.create(), 503, "storage-unavailable")

    # Space comes back: no restart needed.
    os.unlink(filler)
    for _ in range(3):
        c.status("space back: a create is 201", acked.create(), 201)
    acked.check_all_there(c, "space back")
    check_delivery(c, fc, lab, "space back")
    fc.wait_for(lambda: outbox_state(lab)[0] == 0, 5)
    c.eq("space back: the outbox is emptied by the next acknowledgement", outbox_state(lab)[0], 0)
    first = list(dict.fromkeys(fc.arrivals))
    c.check(f"events sent again only by seq (the rows whose delete failed): {len(fc.arrivals) - len(first)} resent",
            len(first) == len(fc.events), (len(first), len(fc.events)))
    rc, _ = lab.stop()
    c.eq("a clean stop", rc, 0)
    lab.start()
    acked.check_all_there(c, "after a restart")


def scenario_checkpoint(c, agent):
    need_root("a tmpfs for the state directory")
    with L.Lab(agent) as lab:
        mount_tmpfs(lab.state, "16m")
        try:
            checkpoint_body(c, lab)
        finally:
            lab.kill()
            umount(lab.state)


def checkpoint_body(c, lab):
    """SQLite copies the WAL into state.db once it holds 1000 pages (its auto-checkpoint, after a
    commit), then writes the WAL again from its start. With the disk full after such a checkpoint,
    commits still fit in the WAL's pages; the next checkpoint needs state.db to grow and fails."""
    lab.start()
    acked = Acked(lab)
    db = os.path.join(lab.state, "state.db")

    def create_until(cond, most, label):
        for _ in range(most):
            r = acked.create()
            if r.status != 201:
                c.check(f"{label}: creates are 201", False, r)
                return False
            if cond():
                return True
        return cond()

    grew = os.path.getsize(db)
    c.check(f"with space: SQLite checkpoints (state.db grows from {grew} bytes)",
            create_until(lambda: os.path.getsize(db) > grew, 1000, "with space"), os.path.getsize(db))
    filler = fill(lab.state)
    c.eq("the state directory's file system is full", os.statvfs(lab.state).f_bavail, 0)
    db_size = os.path.getsize(db)
    # The WAL is written again from its start: commits need no new page until it is full again,
    # and the checkpoint then needs state.db to grow: ENOSPC. Then the WAL must grow: ENOSPC.
    on_full, r = acked.create_until_refused(1000)
    c.check(f"disk full: {on_full} creates acknowledged in the WAL's own pages", on_full > 10, on_full)
    c.eq("disk full: the checkpoint could not grow state.db", os.path.getsize(db), db_size)
    c.problem("disk full: once the WAL must grow, a create is 503 storage-unavailable", r, 503, "storage-unavailable")
    line = lab.log_line("state commit failed")
    c.check(f"log: {line[line.find('state commit failed'):][:160]!r}", "database or disk is full" in line, lab.tail(600))
    acked.check_all_there(c, "disk full after the failed checkpoint")
    lab.kill()
    lab.start()
    acked.check_all_there(c, "SIGKILL and restart on the full disk")
    os.unlink(filler)
    c.status("space back: a create is 201", acked.create(), 201)
    c.check("space back: the next checkpoint copies the WAL into state.db",
            create_until(lambda: os.path.getsize(db) > db_size, 1000, "space back"), os.path.getsize(db))
    lab.kill()
    lab.start()
    acked.check_all_there(c, "space back, after SIGKILL and restart")


# ---------------------------------------------------------------------------------------------
# read-only state.db

def chattr(flag, *paths):
    r = subprocess.run(["chattr", flag, *paths], capture_output=True, text=True)
    return r.returncode == 0, r.stderr.strip()


def scenario_readonly(c, agent):
    need_root("chattr +i")
    with L.Lab(agent) as lab:
        files = [os.path.join(lab.state, n) for n in ("state.db", "state.db-wal")]
        try:
            readonly_body(c, lab, files)
        finally:
            chattr("-i", *[f for f in files if os.path.exists(f)])


def readonly_body(c, lab, files):
    lab.start()
    acked = Acked(lab)
    for _ in range(4):
        c.status("before: a create is 201", acked.create(), 201)
    ok, why = chattr("+i", *files)
    if not ok:
        skip(f"chattr +i on the state directory's file system: {why}")

    # Under the running agent
    r = acked.create()
    c.problem("read-only state.db: a create is 503 storage-unavailable", r, 503, "storage-unavailable")
    line = lab.log_line("state commit failed")
    c.check(f"log: {line[line.find('state commit failed'):][:160]!r}",
            "state.db: disk I/O error" in line and "I/O error (SQLITE_IOERR" in line, lab.tail(600))
    c.check("read-only state.db: the answer names the kind, I/O error", "(I/O error)" in r.json.get("detail", ""), r.json)
    c.status("read-only state.db: /healthz 200", lab.get("/healthz"), 200)
    acked.check_all_there(c, "read-only state.db")
    chattr("-i", *files)
    c.status("writable again: a create is 201 without a restart", acked.create(), 201)
    acked.check_all_there(c, "writable again")

    # At start
    rc, _ = lab.stop()
    c.eq("a clean stop", rc, 0)
    db = files[0]
    chattr("+i", db)
    try:
        lab.start(wait=5)
        c.check("read-only state.db at start: the agent refuses to start", False, "it started")
    except RuntimeError as e:
        c.check("read-only state.db at start: the agent refuses to start, naming the file and the reason",
                db in str(e) and "Operation not permitted" in str(e), str(e)[-400:])
    chattr("-i", db)
    lab.start()
    acked.check_all_there(c, "started again")
    c.status("started again: a create is 201", acked.create(), 201)


# ---------------------------------------------------------------------------------------------
# the central API stalling in the middle of its answer

def scenario_central(c, agent):
    with L.Lab(agent) as lab:
        fc = lab.fake_central()
        try:
            central_body(c, lab, fc)
        finally:
            fc.close()


def central_body(c, lab, fc):
    lab.write_config(lab.config_text(central=lab.central_text(fc.url)))
    lab.start()
    acked = Acked(lab)
    c.status("before: a create is 201", acked.create(), 201)
    check_delivery(c, fc, lab, "before")

    fc.set_mode("stall-body")
    beats = len(fc.heartbeats)
    t0 = time.monotonic()
    c.status("central stalling: a create is 201", acked.create(), 201)
    stalled = fc.wait_for(lambda: any(m == "stall-body" for _, m, _ in fc.attempts), 5)
    c.check("the central API answered the batch's headers and half its body, then stalled", stalled, fc.attempts[-2:])
    time.sleep(2)
    c.status("central stalling: the agent serves (a create is 201)", acked.create(), 201)
    c.status("central stalling: /healthz 200", lab.get("/healthz"), 200)
    depth, written = outbox_state(lab)
    c.check(f"central stalling: a half answer acknowledges nothing (outbox depth {depth}: seq {written - depth + 1}..{written})",
            depth == 2, depth)
    c.check("central stalling: heartbeats keep coming on their own connection",
            fc.wait_for(lambda: len(fc.heartbeats) >= beats + 2, 5), len(fc.heartbeats) - beats)
    timed_out = fc.wait_for(lambda: "reading the answer: timed out" in lab.log(), 40, step=0.2)
    line = lab.log_line("reading the answer: timed out")
    c.check(f"log after {time.monotonic() - t0:.0f}s: {line[line.find('central:'):][:150]!r}", timed_out and "event delivery failed" in line, lab.tail(600))
    fc.set_mode("ok")
    check_delivery(c, fc, lab, "after the stall")
    acked.check_all_there(c, "after the stall")

    # The same stall, and a SIGTERM in the middle of it; the restart delivers.
    fc.set_mode("stall-body")
    c.status("stalling again: a create is 201", acked.create(), 201)
    fc.wait_for(lambda: sum(m == "stall-body" for _, m, _ in fc.attempts) >= 2, 5)
    rc, took = lab.stop()
    c.check(f"SIGTERM in the middle of a stalled answer: prompt and clean ({rc}, {took:.2f}s)", rc == 0 and took < 5, (rc, took))
    fc.set_mode("ok")
    lab.start()
    check_delivery(c, fc, lab, "after the restart")
    acked.check_all_there(c, "after the restart")


# ---------------------------------------------------------------------------------------------
# SIGHUP with a missing key file

def tls_fingerprint(lab):
    """The SHA-256 of the certificate the agent presents on a new connection."""
    ctx = ssl.create_default_context(cafile=f"{lab.dir}/tls.crt")
    with socket.create_connection(("127.0.0.1", lab.port), timeout=5) as s, ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
        return hashlib.sha256(t.getpeercert(binary_form=True)).hexdigest()


def scenario_sighup(c, agent):
    with L.Lab(agent) as lab:
        sighup_body(c, lab)


def sighup_body(c, lab):
    lab.start()
    acked = Acked(lab)
    c.status("before: a create is 201", acked.create(), 201)
    before = tls_fingerprint(lab)
    token = lab.admin()
    units = lab.npath("/units")

    def hup(label):
        mark = lab.log().count("reload")
        lab.signal(signal.SIGHUP)
        ok = wait_for(lambda: lab.log().count("reload") > mark, 5)
        c.check(f"{label}: the reload was answered in the log", ok, lab.tail(300))

    # the TLS key file
    key = f"{lab.dir}/tls.key"
    os.rename(key, key + ".away")
    hup("TLS key missing")
    line = lab.log_line("reload refused")
    c.check(f"log: {line[line.find('reload refused'):][:200]!r}",
            "reload refused" in line and "tls.key" in line and line.endswith("keeping the running configuration"), lab.tail(400))
    c.eq("TLS key missing: new connections get the old certificate and key", tls_fingerprint(lab), before)
    c.status("TLS key missing: HTTPS serves (units 200)", lab.get(units, token), 200)
    c.status("TLS key missing: a create is 201", acked.create(), 201)
    os.rename(key + ".away", key)

    # a token key file
    mark = lab.log().count("reload refused")
    lab.write_config(keys=("ed", "missing"))
    hup("token key missing")
    lines = [x for x in lab.log().splitlines() if "reload refused" in x]
    line = lines[-1] if len(lines) > mark else ""
    c.check(f"log: {line[line.find('reload refused'):][:200]!r}",
            "missing.pub" in line and line.endswith("keeping the running configuration"), lab.tail(400))
    c.status("token key missing: tokens of the old keys are still accepted", lab.get(units, token), 200)

    # restored: the reload applies
    lab.write_config()
    mark = lab.log().count("reloaded:")
    lab.signal(signal.SIGHUP)
    c.check("files back: SIGHUP reloads (log: 'reloaded: TLS files, token keys, ...')",
            wait_for(lambda: lab.log().count("reloaded:") > mark, 5), lab.tail(300))
    c.status("files back: units 200", lab.get(units, token), 200)
    acked.check_all_there(c, "after the reloads")
    rc, _ = lab.stop()
    c.eq("a clean stop", rc, 0)


SCENARIOS = {"disk": scenario_disk, "checkpoint": scenario_checkpoint, "readonly": scenario_readonly, "central": scenario_central, "sighup": scenario_sighup}

if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in SCENARIOS:
        print(f"usage: {sys.argv[0]} PATH/TO/gpunode-agent {'|'.join(SCENARIOS)}", file=sys.stderr)
        sys.exit(2)
    scenario = sys.argv[2]
    # SIGTERM (a CTest timeout) unwinds through the finally blocks: the agent, the mount, the dir go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(L.run_main(f"faults.{scenario}", SCENARIOS[scenario]))
