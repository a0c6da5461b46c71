#!/usr/bin/env python3
"""gpunodectl against a real agent (CONTRACT §8): the demo host, libvirt's test driver with the
demo's domains (tests/fixtures/libvirt/demo_node.xml), the admin socket. Every command, `--json`
equal to the route's body fetched directly, the exit status of each kind of ending (a problem, a
usage error, a missing socket, a stale one, the file system refusing the caller, the agent refusing
the caller), colour on a terminal only and never with NO_COLOR.

    ctl_test.py PATH/TO/gpunodectl PATH/TO/gpunode-agent

When run as root, the refusals are made real by running gpunodectl as `nobody` (setpriv); else the
agent is configured so that this uid is not allowed."""
import json
import os
import re
import pty
import select
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
sys.dont_write_bytecode = True
import lab as L  # noqa: E402

CTL = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else ""
XML = os.path.join(L.FIXTURES, "libvirt", "demo_node.xml")
U23, U24, U43 = "u-0000-23-00-0", "u-0000-24-00-0", "u-0000-43-00-0"
NOBODY = 65534


class Run:
    def __init__(self, p):
        self.rc, self.out, self.err = p.returncode, p.stdout, p.stderr

    def json(self):
        try:
            return json.loads(self.out)
        except ValueError:
            return None

    def __repr__(self):
        return f"rc={self.rc} out={self.out[:600]!r} err={self.err[:600]!r}"


def eventually(pred, wait=30.0, every=0.05):
    """Whether pred() holds within `wait` seconds, asked every `every` seconds: a hang guard, not a
    bound on the agent's speed (it returns as soon as pred() holds)."""
    deadline = time.monotonic() + wait
    while not pred():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every)
    return True


def ctl(lab, *args, sock=None, ctl_path=None, env=None, user=None):
    cmd = [ctl_path or CTL, "--socket", sock or lab.sock, *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    e = dict(os.environ)
    e.pop("NO_COLOR", None)
    e.update(env or {})
    return Run(subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=e))


def on_pty(args, env):
    """Runs gpunodectl with stdout on a terminal; returns (rc, what it wrote there)."""
    master, slave = pty.openpty()
    p = subprocess.Popen([CTL, *args], stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    out = b""
    while True:
        r, _, _ = select.select([master], [], [], 30)
        if not r:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return p.wait(30), out.decode(errors="replace")


def body(c, lab):
    lab.write_config(lab.config_text().replace("uri: test:///default", f"uri: test://{XML}"))
    lab.start()
    N = lab.npath

    def direct(path):
        return lab.get(path, unix=True)

    def same_json(label, run, path):
        """`--json` prints the route's body exactly: the same bytes (and a newline)."""
        want = direct(path)
        c.check(label, run.rc == 0 and run.out == want.body.decode() + "\n", f"{run!r}; want {want!r}")

    # --- reads ---
    same_json("units --json is GET units", ctl(lab, "--json", "units"), N("/units"))
    same_json("--json after the command", ctl(lab, "units", "--json"), N("/units"))
    r = ctl(lab, "units")
    c.check("units: the tree", r.rc == 0 and r.out.startswith(f"node {L.NODE}: 7 units, 8 GPUs\n") and "├── NUMA node 0" in r.out
            and "└── NUMA node 1" in r.out and "u-0000-43-00-0  vfio-group  2 GPUs  reservable" in r.out
            and "not reservable: driver-unbound, class-not-reservable" in r.out and "VM train-spot-7 (vm-spot-7)  spot of org-tenant-b  running" in r.out
            and "VM legacy-vm  unlabelled  running" in r.out and "\x1b[" not in r.out, r)
    same_json("workloads --json is GET workloads", ctl(lab, "--json", "workloads"), N("/workloads"))
    r = ctl(lab, "workloads")
    c.check("workloads: a table", r.rc == 0 and r.out.startswith("NAME") and "train-spot-7" in r.out, r)

    # --- reserve, amend, read back ---
    t0 = time.time()
    r = ctl(lab, "--json", "reserve", "--units", f"{U23},{U43}", "--audience", "org-acme", "--managers", "org-acme",
            "--ends", "+30d", "--note", "demo")
    j = r.json() or {}
    rid = j.get("id", "")
    c.check("reserve --json: 201's body, a reservation", r.rc == 0 and rid.startswith("rsv_") and j.get("unitIds") == [U23, U43]
            and j.get("note") == "demo", r)
    ends = L.parse_time(j.get("endsAt"))
    c.check("--ends +30d is 30 days from now", ends is not None and abs(ends - (t0 + 30 * 86400)) < 120, j.get("endsAt"))
    c.eq("reserve: the spot VM is listed", [w.get("name") for w in j.get("spotWorkloads", [])], ["train-spot-7"])
    r = ctl(lab, "reserve", "--units", U24, "--audience", "org-b", "--starts", "+40d", "--ends", "+50d")
    c.check("reserve for people: created, then the reservation", r.rc == 0 and r.out.startswith("created reservation rsv_")
            and "state:            scheduled" in r.out, r)
    same_json("reservation ID --json is GET it", ctl(lab, "--json", "reservation", rid), N(f"/reservations/{rid}"))
    same_json("reservations --json is GET reservations (every page)", ctl(lab, "--json", "reservations"), N("/reservations?limit=500"))
    same_json("reservations --state active --json", ctl(lab, "--json", "reservations", "--state", "active"), N("/reservations?limit=500&state=active"))
    r = ctl(lab, "reservations")
    c.check("reservations: a table", r.rc == 0 and r.out.startswith("ID") and rid in r.out, r)
    r = ctl(lab, "--json", "amend", rid, "--note", "amended", "--if-match", "1")
    c.check("amend --if-match 1", r.rc == 0 and (r.json() or {}).get("note") == "amended" and (r.json() or {}).get("version") == 2, r)
    r = ctl(lab, "amend", rid, "--note", "stale", "--if-match", "1")
    c.check("amend with a stale version: exit 1, gpunodectl: version-mismatch: ...", r.rc == 1 and r.out == ""
            and r.err.startswith("gpunodectl: version-mismatch: "), r)

    # --- the spot market ---
    r = ctl(lab, "--json", "release", rid, "--units", U23)
    c.check("release --json", r.rc == 0 and (r.json() or {}).get("reservation", {}).get("releasedUnitIds") == [U23], r)
    same_json("capacity ORG --json is GET capacity?org=", ctl(lab, "--json", "capacity", "org-outsider"), N("/capacity?org=org-outsider"))
    r = ctl(lab, "capacity", "org-outsider")
    c.check("capacity: the released unit as spot", r.rc == 0 and any(U23 in line and "spot" in line for line in r.out.splitlines()), r)
    r = ctl(lab, "units")
    c.check("units: the reservation and its released unit in the tree", r.rc == 0 and f"reservation {rid} active until" in r.out
            and "released to spot" in r.out, r)
    r = ctl(lab, "timeline")
    c.check("timeline: a row per unit, the bars' legend", r.rc == 0 and r.out.startswith(f"timeline of node {L.NODE}: 4 weeks from ")
            and any(line.startswith(U23) and "A org-acme━" in line and line.endswith("A released to spot") for line in r.out.splitlines())
            and rid in r.out, r)
    r = ctl(lab, "timeline", "--weeks", "8")
    c.check("timeline --weeks 8: the scheduled reservation is drawn too", r.rc == 0 and "8 weeks" in r.out and "B org-b" in r.out, r)
    tj = ctl(lab, "--json", "timeline").json() or {}
    c.check("timeline --json: the reservations drawn, as the agent wrote them", [x.get("id") for x in tj.get("reservations", [])] == [rid]
            and tj.get("nodeId") == L.NODE, tj)
    # --dry-run (CONTRACT §12): what the call would do, printed; nothing done, audited or reported.
    before = (lab.get(N("/state"), unix=True).body, len(lab.audit_all()))
    r = ctl(lab, "reclaim", rid, "--units", U23, "--terminate-spot", "--dry-run")
    c.check("reclaim --dry-run for people: says it is a dry run, the VM it would stop", r.rc == 0
            and r.out.startswith(f"would reclaim {U23} from spot for") and "dry run: nothing was changed" in r.out
            and "would be terminated" in r.out and "train-spot-7" in r.out, r)
    dry = ctl(lab, "--json", "reclaim", rid, "--units", U23, "--terminate-spot", "--dry-run").json() or {}
    c.eq("reclaim --dry-run --json: dryRun, the spot VM it would terminate",
         (dry.get("dryRun"), [x.get("name") for x in dry.get("terminated", [])]), (True, ["train-spot-7"]))
    r = ctl(lab, "terminate-spot", "--units", U23, "--grace", "0", "--dry-run")
    c.check("terminate-spot --dry-run for people", r.rc == 0 and r.out.startswith("dry run: nothing was changed")
            and "would be terminated" in r.out, r)
    c.eq("the dry runs changed nothing: GET state and the audit log as they were",
         (lab.get(N("/state"), unix=True).body, len(lab.audit_all())), before)
    r = ctl(lab, "--json", "reclaim", rid, "--units", U23, "--terminate-spot")
    j = r.json() or {}
    # The reservation's updatedAt is the moment each call was answered: the real call's may be a
    # second later than the dry run's (a slow build crosses a second), never earlier.
    def but_updated(a):
        return {k: ({**v, "updatedAt": None} if k == "reservation" else v) for k, v in a.items() if k != "dryRun"}
    c.eq("reclaim --terminate-spot: the answer the dry run gave (but dryRun and the moment)",
         (but_updated(j), j.get("reservation", {}).get("updatedAt", "") >= dry.get("reservation", {}).get("updatedAt", "~")),
         (but_updated(dry), True))
    c.check("reclaim --terminate-spot --json: the spot VM terminated", r.rc == 0 and [x.get("name") for x in j.get("terminated", [])] == ["train-spot-7"]
            and j.get("reservation", {}).get("releasedUnitIds") == [], r)
    r = ctl(lab, "terminate-spot", "--grace", "0", "--reason", "test")
    c.check("terminate-spot for people: the VMs left running, none terminated", r.rc == 0 and "left running (not-spot)" in r.out
            and "terminated" not in r.out.replace("left running", ""), r)
    r = ctl(lab, "--json", "terminate-spot", "--units", U24, "--grace", "0")
    c.check("terminate-spot --json", r.rc == 0 and set(r.json() or {}) >= {"terminated", "leftRunning"}, r)

    # --- status, rescan, audit ---
    r = ctl(lab, "--json", "status")
    j = r.json() or {}
    c.check("status --json", r.rc == 0 and j.get("nodeId") == L.NODE and j.get("libvirt") == "connected"
            and j.get("units", {}).get("total") == 7 and j.get("reservations", {}).get("active") == 1
            and j.get("reservations", {}).get("scheduled") == 1, r)
    r = ctl(lab, "status")
    c.check("status for people", r.rc == 0 and f"node:         {L.NODE}" in r.out and "libvirt:      connected" in r.out, r)
    r = ctl(lab, "--json", "rescan")
    c.check("rescan --json is POST /v1/admin/rescan's body", r.rc == 0 and isinstance((r.json() or {}).get("revision"), int), r)
    c.check("rescan for people", ctl(lab, "rescan").out.startswith("rescanned: revision "), "")
    r = ctl(lab, "--json", "end", rid, "--reason", "done")
    c.check("end --json", r.rc == 0 and (r.json() or {}).get("state") == "ended" and (r.json() or {}).get("endReason") == "ended-early", r)
    r = ctl(lab, "--json", "audit")
    c.eq("audit --json: every record (all pages)", r.json(), {"records": lab.audit_all(), "nextPageToken": None})
    same_json("audit --limit 2 --json is GET audit?limit=2", ctl(lab, "--json", "audit", "--limit", "2"), N("/audit?limit=2"))
    same_json("audit --after aud_2 --json", ctl(lab, "--json", "audit", "--after", "aud_2"), N("/audit?limit=500&after=aud_2"))
    r = ctl(lab, "audit")
    c.check("audit for people", r.rc == 0 and "reservation.create" in r.out and "workload.terminate" in r.out, r)

    # --- problems: exit 1 ---
    r = ctl(lab, "reservation", "rsv_nope")
    c.check("an unknown reservation: exit 1, not-found", r.rc == 1 and r.err == "gpunodectl: not-found: no such resource\n", r)
    r = ctl(lab, "--json", "reservation", "rsv_nope")
    c.check("--json on a problem: its body on stdout", r.rc == 1 and (r.json() or {}).get("code") == "not-found", r)
    r = ctl(lab, "reserve", "--units", "u-0000-99-00-0", "--audience", "org-a", "--ends", "+1d")
    c.check("an unknown unit: exit 1, the code, then the field's error", r.rc == 1 and r.err.startswith("gpunodectl: unknown-unit: ")
            and "\n  unitIds: u-0000-99-00-0 is not a unit of node" in r.err, r)
    r = ctl(lab, "reserve", "--units", U24, "--audience", "org-a", "--ends", "+1d")
    c.check("unit-occupied names the VM", r.rc == 1 and "gpunodectl: unit-occupied: " in r.err and "occupied by VM legacy-vm (unlabelled)" in r.err, r)
    r = ctl(lab, "release", rid, "--units", U23)
    c.check("release of an ended reservation: exit 1", r.rc == 1 and r.err.startswith("gpunodectl: reservation-not-active: "), r)

    # --- usage: exit 2 ---
    for args, why in ((["frobnicate"], "an unknown command"), (["reserve", "--units", U23, "--audience", "a"], "--ends missing"),
                      (["reserve", "--units", U23, "--audience", "a", "--ends", "+30x"], "a bad time"),
                      (["reservations", "--state", "gone"], "a bad state"), (["terminate-spot", "--grace", "301"], "grace over 300"),
                      (["amend", rid], "nothing to amend"), ([], "no command")):
        r = ctl(lab, *args)
        c.check(f"usage: {why}: exit 2 with the usage", r.rc == 2 and r.out == "" and "Usage:" in r.err, r)
    c.check("--help: exit 0", ctl(lab, "--help").rc == 0, "")

    # --- colour: a terminal only, NO_COLOR honoured ---
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    rc, out = on_pty(["--socket", lab.sock, "units"], env)
    c.check("units on a terminal: colour", rc == 0 and "\x1b[" in out and "NUMA node 0" in out, out[:300])
    rc, out = on_pty(["--socket", lab.sock, "timeline"], dict(env, NO_COLOR="1"))
    c.check("NO_COLOR=1 on a terminal: no colour", rc == 0 and "\x1b[" not in out and "timeline of node" in out, out[:300])
    rc, out = on_pty(["--socket", lab.sock, "units"], dict(env, NO_COLOR=""))
    c.check("NO_COLOR empty: colour", rc == 0 and "\x1b[" in out, out[:300])

    # --- the socket: exit 3 ---
    missing = os.path.join(lab.dir, "no", "such.sock")
    r = ctl(lab, "units", sock=missing)
    c.check("a missing socket: exit 3, the path, is the agent running, admin.socket", r.rc == 3 and missing in r.err
            and "is gpunode-agent running" in r.err and "admin.socket" in r.err and r.out == "", r)
    stale = os.path.join(lab.dir, "stale.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(stale)  # bound, never listening: a socket file nobody answers on
    r = ctl(lab, "status", sock=stale)
    s.close()
    c.check("a stale socket: exit 3, nothing listens", r.rc == 3 and f"nothing listens on the admin socket {stale}" in r.err, r)
    if not os.path.exists("/etc/gpunode/agent.yaml") and not os.path.exists("/run/gpunode/admin.sock"):
        r = Run(subprocess.run([CTL, "units"], capture_output=True, text=True, timeout=60))
        c.check("no --socket, no agent.yaml: the default /run/gpunode/admin.sock", r.rc == 3 and "/run/gpunode/admin.sock" in r.err, r)

    if os.geteuid() == 0:
        # gpunodectl as nobody: a copy it may run, in a directory it may enter.
        tools = os.path.join(lab.dir, "bin")
        os.mkdir(tools)
        os.chmod(tools, 0o755)
        os.chmod(lab.dir, 0o711)
        mine = os.path.join(tools, "gpunodectl")
        shutil.copy(CTL, mine)
        os.chmod(mine, 0o755)
        # The socket as the agent makes it (0660, root and the admin group): the file system refuses nobody.
        mode = os.stat(lab.sock).st_mode & 0o777
        c.eq("the admin socket is 0660", oct(mode), oct(0o660))
        r = ctl(lab, "units", ctl_path=mine, user=NOBODY)
        c.check("as nobody on the 0660 socket: exit 3, permission denied, the uid and admin.allowed_group", r.rc == 3
                and f"permission denied on the admin socket {lab.sock}" in r.err and f"uid {NOBODY}" in r.err
                and "admin.allowed_group" in r.err, r)
        # Opened to everyone by the file system: now the agent itself refuses nobody (not in allowed_uids).
        os.chmod(lab.sock, 0o666)
        r = ctl(lab, "units", ctl_path=mine, user=NOBODY)
        c.check("as nobody on a 0666 socket: the agent refuses, exit 3, not in admin.allowed_uids", r.rc == 3
                and f"the agent at {lab.sock} refused this caller" in r.err and f"uid {NOBODY} is not in admin.allowed_uids" in r.err, r)
        c.check("the agent logged the refusal", eventually(lambda: f"refused peer uid={NOBODY}" in lab.log()), lab.tail())
        os.chmod(lab.sock, 0o660)
    else:
        # Not root: an agent whose allowed_uids and group leave this uid out.
        lab.stop()
        lab.write_config(lab.config_text(admin_uids=[0]).replace("uri: test:///default", f"uri: test://{XML}"))
        lab.start()  # the lab's probe of /healthz is over HTTPS
        r = ctl(lab, "units")
        c.check("a uid the agent does not allow: exit 3, refused", r.rc == 3 and "refused this caller" in r.err, r)
    lab.stop()


# Bytes a terminal acts on: C0 controls but the newline that ends a line, DEL, and C1 (U+0080..U+009F).
RAW_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f\x80-\x9f]")


def hostile_text(c, agent):
    """CONTRACT §10: an org's or a caller's text (a note, a reason) never reaches an operator's terminal
    or the text log raw; `--json` stays exact."""
    evil_note = "quarterly\x1b[2J\x1b[1;1H\x07\rFORGED row\nsecond line\u009b31m"
    evil_reason = "done\x1b]0;owned\x07\r\nFORGED 2026-01-01 INFO fake record"
    with L.Lab(agent) as lab:
        lab.write_config(lab.config_text().replace("uri: test:///default", f"uri: test://{XML}"))
        lab.start()
        r = ctl(lab, "--json", "reserve", "--units", U24, "--audience", "org-acme", "--starts", "+1d", "--ends", "+30d", "--note", evil_note)
        rid = (r.json() or {}).get("id", "")
        c.check("a note with ESC, BEL, CR, a newline and CSI (U+009B): --json gives it back exactly",
                r.rc == 0 and (r.json() or {}).get("note") == evil_note, r)
        r = ctl(lab, "reservation", rid)
        c.check("reservation ID for people: no raw control byte, each escaped as \\xNN",
                r.rc == 0 and not RAW_CONTROL.search(r.out.replace("\n", "")) and "quarterly\\x1b[2J\\x1b[1;1H\\x07\\x0dFORGED row\\x0asecond line\\xc2\\x9b31m" in r.out, r)
        c.check("... and no line of it begins with the forged text", not any(l.startswith("FORGED") for l in r.out.splitlines()), r.out)
        r = ctl(lab, "end", rid, "--reason", evil_reason)
        c.eq("end with a hostile reason: exit 0", r.rc, 0)
        r = ctl(lab, "audit")
        c.check("audit for people: the reason escaped, no raw control byte, no forged line",
                r.rc == 0 and not RAW_CONTROL.search(r.out) and "\\x1b]0;owned\\x07\\x0d\\x0aFORGED" in r.out
                and not any(l.startswith("FORGED") for l in r.out.splitlines()), r)
        r = ctl(lab, "--json", "audit")
        recs = (r.json() or {}).get("records", [])
        c.check("audit --json: the reason exact", any(evil_reason in json.dumps(x, ensure_ascii=False) or evil_reason in str(x.get("detail"))
                                                      for x in recs), recs[-1:])
        r = ctl(lab, "reservations")
        c.check("reservations for people: no raw control byte", r.rc == 0 and not RAW_CONTROL.search(r.out), r)
        lab.stop()
        with open(os.path.join(lab.dir, "agent.log"), "rb") as f:
            log = f.read().decode("utf-8", errors="replace")
        c.check("the agent's text log: no raw control byte, no line begins with forged text",
                not RAW_CONTROL.search(log) and not any(l.startswith("FORGED") for l in log.splitlines()),
                RAW_CONTROL.search(log) and log[max(0, RAW_CONTROL.search(log).start() - 100):][:200])


def unentitled(c, agent):
    """CONTRACT §9 "What the hook cannot see": a reservation that starts under a running domain of an
    outsider (the demo's unlabelled legacy-vm on 24): the agent finds it when the term starts, reports
    it once (workload.unentitled, checked against the API document), counts it in the gauge, shows
    it in `status` and `units`, and leaves it running. The demo's spot VM train-spot-7 runs on 23,
    which no reservation releases: unentitled from the first listing."""
    import sqlite3
    with L.Lab(agent) as lab:
        lab.write_config(lab.config_text().replace("uri: test:///default", f"uri: test://{XML}"))
        lab.start()
        starts = time.time() + 2
        r = ctl(lab, "--json", "reserve", "--units", U24, "--audience", "org-acme", "--starts",
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(starts + 1)), "--ends", "+1d")
        c.check("a reservation of 24 that starts in 3 s (legacy-vm runs there: allowed while scheduled)", r.rc == 0, r)
        # Until the term has started (its instant, then the agent's timer): status asked again
        # until it names both, 30 s at most (a hang guard, not a bound on the agent's speed).
        both = ("2 VMs on units they are not entitled to: legacy-vm (u-0000-24-00-0: unit-reserved); "
                "train-spot-7 (u-0000-23-00-0: not-released)")
        seen = {}

        def status_names_both():
            seen["r"] = ctl(lab, "status")
            seen["line"] = next((l for l in seen["r"].out.splitlines() if l.startswith("unentitled:")), "")
            return both in seen["line"]
        eventually(status_names_both, every=0.25)
        c.check(f"status names both: {seen['line']!r}", both in seen["line"], seen["r"])
        r = ctl(lab, "units")
        c.check("units marks it", "VM legacy-vm  unlabelled  running  NOT ENTITLED (u-0000-24-00-0: unit-reserved)" in r.out, r)
        m = lab.call("GET", "/metrics", unix=True).body.decode()
        c.check("gpunode_unentitled_workloads 2", "\ngpunode_unentitled_workloads 2\n" in m, [l for l in m.splitlines() if "unentitled" in l])
        ctl(lab, "workloads")
        ctl(lab, "status")
        db = sqlite3.connect(f"file:{os.path.join(lab.state, 'state.db')}?mode=ro", uri=True)
        try:
            evs = [json.loads(e) for (e,) in db.execute("SELECT event FROM outbox ORDER BY seq")]
        finally:
            db.close()
        mine = [e for e in evs if e.get("type") == "workload.unentitled" and e["data"].get("name") == "legacy-vm"]
        c.eq("one workload.unentitled event for legacy-vm, however often it is listed", len(mine), 1)
        if mine:
            c.eq("... its data", {k: mine[0]["data"].get(k) for k in ("name", "org", "tier", "unitIds")},
                 {"name": "legacy-vm", "org": None, "tier": "on-demand", "unitIds": [U24]})
            c.eq("... as the API document's Event says", L.api_document().component_errors("Event", mine[0]), [])
        r = ctl(lab, "--json", "workloads")
        state = next((w.get("state") for w in (r.json() or {}).get("workloads", []) if w.get("name") == "legacy-vm"), None)
        c.eq("the agent leaves it running", state, "running")
        c.check("the agent's log has one warning about it",
                sum("DOMAIN=legacy-vm" in l and "not entitled" in l for l in lab.log().splitlines()) == 1, lab.tail(600))


def main(c, agent):
    if not CTL or not os.access(CTL, os.X_OK):
        raise RuntimeError(f"gpunodectl not found: {CTL!r}")
    with L.Lab(agent) as lab:
        body(c, lab)
    hostile_text(c, agent)
    unentitled(c, agent)


if __name__ == "__main__":
    # lab.run_main takes the agent as argv[1]: drop gpunodectl's path first.
    sys.argv = [sys.argv[0]] + sys.argv[2:]
    sys.exit(L.run_main("ctl", main))
