#!/usr/bin/env python3
"""The real agent against a real libvirtd with QEMU/KVM: two tiny VMs without devices, one spot and
one on-demand, terminated by the node's owner through POST /v1/nodes/{nodeId}/terminate-spot.

The daemon is private to this test and touches no global state: as root, libvirtd's QEMU driver
uses fixed system paths (/run/libvirt, /var/lib/libvirt, /etc/libvirt, ...), so it runs in its own
mount and PID namespaces (`unshare --mount --pid --fork --mount-proc --kill-child`), where a
small `sh` (PID 1 there, reaping QEMU when it exits) bind-mounts directories of a temp dir over
those paths (and private copies of /etc/passwd and /etc/group that add the `libvirt-qemu` user the
driver resolves at start; qemu.conf then runs QEMU as root), hides the cgroup tree (no cgroups
are created) and starts `libvirtd` with only the QEMU connection driver loaded
(LIBVIRT_DRIVER_DIR). Clients (virsh, the agent) reach it from outside through the socket in the
temp dir: `qemu+unix:///system?socket=TMP/run/libvirt/libvirt-sock`; no environment is needed.
When the namespace's PID 1 ends, the kernel kills every process in it (libvirtd, QEMU): it is
sent SIGTERM at the end, SIGKILL if it overstays, and if this script dies the parent-death
signal takes it down.

Then libvirt goes away and comes back. B: an outside `virsh destroy` shows in GET .../state (a
long poll) within 2 s, through libvirt's lifecycle events, not the 30 s rescan. C (the same agent,
up less than 25 s): libvirtd alone is SIGKILLed and started again; once the agent has reconnected
(GET workloads, 503 until it has), an outside `virsh start` and then `virsh destroy` must show in
GET .../state, the destroy within 2 s: the events are registered again on the new connection.
A (the agent restarted with a 2 s rescan): libvirtd alone is SIGKILLed 1.5 s into a terminate-spot with an 8 s
grace (QEMU runs on, reparented to the namespace's `sh`): 503 hypervisor-unavailable before the
grace ends, the write-ahead audit record and nothing more; the `sh` holds libvirtd down while
TMP/hold exists and then starts it again with the same command (it re-attaches to the running
QEMUs), and the agent finishes the termination as itself at its next refresh. D (the same
agent): libvirtd stopped (SIGSTOP): GET workloads still answers from the list libvirt's events
keep current; a terminate-spot lists (it always does) and waits, then libvirtd is SIGKILLed: 503
hypervisor-unavailable within 5 s, logged, and GET workloads 200 again once libvirtd is back.

Skips (exit 77, one `SKIP: why` line) only when not root, when libvirtd, virsh, QEMU, libvirt's
QEMU driver or unshare are missing, or when the private daemon cannot be started: `.ci/run` says
so loudly. Never for want of KVM: with /dev/kvm the guests are KVM (and fall back to TCG if one
cannot start), without it they are QEMU's TCG (type='qemu') from the start.

    python3 tests/integration/libvirtd_test.py build/dev/gpunode-agent
"""
import ctypes
import glob
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab as L  # noqa: E402

SKIP = 77
TENANT = "org-tenant"
SPOT, ONDEMAND = "vm-spot-1", "vm-ondemand-1"
SPOT_NAME, ONDEMAND_NAME = "gpunode-spot-1", "gpunode-ondemand-1"
WORKLOAD_NS = "urn:gpunode:workload:1"
TERMINATION_NS = "urn:gpunode:termination:1"
SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])


class Skip(Exception):
    pass


def which(name):
    return shutil.which(name, path=SBIN)


def qemu_driver_module():
    for pattern in ("/usr/lib/*/libvirt/connection-driver/libvirt_driver_qemu.so",
                    "/usr/lib64/libvirt/connection-driver/libvirt_driver_qemu.so",
                    "/usr/lib/libvirt/connection-driver/libvirt_driver_qemu.so"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


def preflight():
    """What is needed to run at all; raises Skip naming what is missing."""
    if os.geteuid() != 0:
        raise Skip("needs root (a private libvirtd in its own mount namespace)")
    missing = [n for n in ("libvirtd", "virsh", "qemu-system-x86_64", "unshare", "mount") if not which(n)]
    if missing:
        raise Skip(f"not installed: {', '.join(missing)} (scripts/install-deps.sh installs them)")
    module = qemu_driver_module()
    if not module:
        raise Skip("libvirt's QEMU driver (libvirt_driver_qemu.so, libvirt-daemon-driver-qemu) is not installed")
    if not os.path.isdir("/etc/libvirt"):
        raise Skip("/etc/libvirt does not exist (nothing to bind the private config over)")
    return module


def die_with_parent():
    """preexec_fn: SIGKILL this child when the test process dies (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


INIT_SH = r"""set -e
T="$1"
mount --bind "$T/run" /run
mount --bind "$T/var" /var
mount --bind "$T/etc" /etc/libvirt
mount --bind "$T/passwd" /etc/passwd
mount --bind "$T/group" /etc/group
if [ -d /sys/fs/cgroup ]; then mount -t tmpfs -o size=64k gpunode-no-cgroups /sys/fs/cgroup; fi
set +e
stop=
trap 'stop=1; kill -TERM "$daemon" 2>/dev/null' TERM INT
# libvirtd runs until it ends by itself or this sh is told to stop; if it ends while $T/hold
# exists (the test killed it on purpose), the same command starts it again once the test removes
# that file. QEMU, reparented to this sh, runs on meanwhile.
while :; do
  LIBVIRT_DRIVER_DIR="$T/drivers" libvirtd --config /etc/libvirt/libvirtd.conf &
  daemon=$!
  wait "$daemon"
  wait "$daemon"
  [ -z "$stop" ] && [ -e "$T/hold" ] || break
  while [ -z "$stop" ] && [ -e "$T/hold" ]; do sleep 0.05; done
  [ -z "$stop" ] || break
done
"""

LIBVIRTD_CONF = """# private test daemon: root only, no polkit, no TCP
auth_unix_ro = "none"
auth_unix_rw = "none"
unix_sock_ro_perms = "0700"
unix_sock_rw_perms = "0700"
log_outputs = "3:stderr"
"""

QEMU_CONF = """# private test daemon: QEMU as root, nothing relabelled, no cgroups, no virtlogd
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
stdio_handler = "file"
cgroup_controllers = [ ]
namespaces = [ ]
"""


class Libvirtd:
    """A private libvirtd (QEMU driver only) in its own mount and PID namespaces."""

    def __init__(self, module):
        base = tempfile.gettempdir()
        real = os.path.realpath(base)
        if any(real == p or real.startswith(p + "/") for p in ("/run", "/var", "/etc")):
            base = "/tmp"  # those are covered by bind mounts inside the namespace
        self.dir = tempfile.mkdtemp(prefix="gpunode-libvirt-", dir=base)
        self.proc, self.init_pid, self.pidns = None, None, None
        self.sock = os.path.join(self.dir, "run", "libvirt", "libvirt-sock")
        self.uri = f"qemu+unix:///system?socket={self.sock}"
        d = self.dir
        for sub in ("run/libvirt", "var/lib/libvirt", "var/cache/libvirt", "var/log/libvirt", "var/tmp",
                    "etc", "drivers"):
            os.makedirs(os.path.join(d, sub))
        os.symlink("/run", os.path.join(d, "var", "run"))
        os.symlink(module, os.path.join(d, "drivers", os.path.basename(module)))
        with open(os.path.join(d, "etc", "libvirtd.conf"), "w") as f:
            f.write(LIBVIRTD_CONF)
        with open(os.path.join(d, "etc", "qemu.conf"), "w") as f:
            f.write(QEMU_CONF)
        # The QEMU driver resolves its built-in user (libvirt-qemu on Debian) before it reads
        # qemu.conf; libvirt-daemon-system would create it system-wide, this only in the namespace.
        for name, line in (("passwd", "libvirt-qemu:x:64055:64055:gpunode test:/var/lib/libvirt:/usr/sbin/nologin\n"),
                           ("group", "libvirt-qemu:x:64055:\n")):
            with open(f"/etc/{name}") as src, open(os.path.join(d, name), "w") as dst:
                text = src.read()
                dst.write(text if text.endswith("\n") or not text else text + "\n")
                if not any(l.startswith("libvirt-qemu:") for l in text.splitlines()):
                    dst.write(line)
        with open(os.path.join(d, "init.sh"), "w") as f:
            f.write(INIT_SH)
        self.log = os.path.join(d, "libvirtd.log")

    def tail(self, n=1200):
        try:
            with open(self.log, "rb") as f:
                return f.read().decode(errors="replace")[-n:].strip()
        except OSError:
            return ""

    def start(self, wait=30):
        """Starts the daemon; raises Skip (with its log) if it cannot be started."""
        env = dict(os.environ, PATH=SBIN)
        with open(self.log, "ab") as logf:
            self.proc = subprocess.Popen(
                [which("unshare"), "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc",
                 "--kill-child", "sh", os.path.join(self.dir, "init.sh"), self.dir],
                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                preexec_fn=die_with_parent)
        deadline = time.time() + wait
        while time.time() < deadline:
            if self.init_pid is None:
                self.init_pid = self._child_of(self.proc.pid)
                if self.init_pid is not None:
                    try:
                        self.pidns = os.stat(f"/proc/{self.init_pid}/ns/pid").st_ino
                    except OSError:
                        self.init_pid = None
            if self.proc.poll() is not None:
                raise Skip(f"the private libvirtd could not be started (exit {self.proc.returncode}): "
                           + self.tail().replace("\n", " | "))
            if os.path.exists(self.sock):
                r = self.virsh("uri", check=False)
                if r.returncode == 0:
                    return
            time.sleep(0.1)
        raise Skip(f"the private libvirtd did not answer within {wait}s: " + self.tail().replace("\n", " | "))

    @staticmethod
    def _child_of(ppid):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == ppid:
                return int(entry)
        return None

    def virsh(self, *args, check=True):
        r = subprocess.run([which("virsh"), "-q", "-c", self.uri, *args], capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise RuntimeError(f"virsh {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
        return r

    def leftovers(self):
        """PIDs still in the daemon's PID namespace (empty once it is gone)."""
        if self.pidns is None:
            return []
        out = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat(f"/proc/{entry}/ns/pid").st_ino == self.pidns:
                        out.append(int(entry))
                except OSError:
                    pass
        return out

    def procs(self):
        """{pid: (ppid, comm, argv)} of the processes in the daemon's PID namespace (host PIDs)."""
        out = {}
        for pid in self.leftovers():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] == "Z":
                continue  # a zombie is dead already
            out[pid] = (int(fields[1]), stat[stat.index("(") + 1:stat.rindex(")")], argv)
        return out

    def daemon_pid(self):
        """The libvirtd that the namespace's PID 1 runs (None when there is none)."""
        return next((pid for pid, (ppid, comm, _) in self.procs().items()
                     if ppid == self.init_pid and comm == "libvirtd"), None)

    def qemu_pid(self, name):
        """The QEMU process of domain `name` (its -name guest=NAME,...), or None."""
        for pid, (_, comm, argv) in self.procs().items():
            if comm.startswith("qemu") and any(a == f"guest={name}" or a.startswith(f"guest={name},") for a in argv):
                return pid
        return None

    def kill_daemon(self, wait=5):
        """SIGKILL to libvirtd only (QEMU runs on); PID 1 holds it down until restart_daemon().
        Returns the killed PID."""
        pid = self.daemon_pid()
        if pid is None:
            raise RuntimeError("no libvirtd is running in the namespace: " + repr(self.procs()))
        open(os.path.join(self.dir, "hold"), "w").close()
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + wait
        while pid in self.procs():
            if time.time() > deadline:
                raise RuntimeError(f"libvirtd {pid} is still there {wait}s after SIGKILL")
            time.sleep(0.02)
        return pid

    def restart_daemon(self, wait=30):
        """Lets PID 1 start libvirtd again (the same command and config); returns once virsh
        reaches it."""
        try:
            os.unlink(os.path.join(self.dir, "hold"))
        except FileNotFoundError:
            pass
        deadline = time.time() + wait
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the namespace ended (exit {self.proc.returncode}): " + self.tail())
            if self.daemon_pid() is not None and self.virsh("uri", check=False).returncode == 0:
                return
            time.sleep(0.05)
        raise RuntimeError(f"libvirtd did not answer within {wait}s of its restart: " + self.tail())

    def stop(self, timeout=10):
        """SIGTERM to the namespace's PID 1 (stops libvirtd; its end kills QEMU); SIGKILL if it overstays."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            if self.init_pid is not None:
                try:
                    os.kill(self.init_pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                for pid in (self.init_pid, self.proc.pid):  # the namespace's init first: takes all with it
                    if pid is not None:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                self.proc.wait()
        deadline = time.time() + 5
        while self.leftovers() and time.time() < deadline:
            time.sleep(0.05)

    def close(self):
        try:
            self.stop()
        finally:
            L.remove_tree(self.dir, "libvirtd dir")


def domain_xml(name, vm_id, tier, kind):
    # No disks, NICs, graphics, USB, balloon or hostdevs: SeaBIOS finds nothing to boot and waits,
    # "running". ACPI is on so that a graceful shutdown is accepted (and ignored: no OS answers).
    return f"""<domain type='{kind}'>
  <name>{name}</name>
  <memory unit='MiB'>32</memory>
  <vcpu>1</vcpu>
  <metadata>
    <gw:workload xmlns:gw="{WORKLOAD_NS}" vm-id="{vm_id}" org="{TENANT}" tier="{tier}"/>
  </metadata>
  <os><type arch='x86_64'>hvm</type><boot dev='hd'/></os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>
"""


def guest_kinds():
    """The domain types to try, in order: KVM where /dev/kvm exists (TCG if it fails), else TCG."""
    return ("kvm", "qemu") if os.path.exists("/dev/kvm") else ("qemu",)


def define_and_start(daemon, vms):
    """Defines and starts the VMs as KVM guests where /dev/kvm exists, falling back to TCG
    (type='qemu') if KVM cannot start one; as TCG guests where it does not."""
    kinds = guest_kinds()
    kind = kinds[0]
    if kind == "qemu":
        print("# no /dev/kvm here: the guests run under QEMU's TCG (type='qemu')", flush=True)
    for attempt in kinds:
        kind = attempt
        try:
            for name, vm_id, tier in vms:
                path = os.path.join(daemon.dir, f"{name}.xml")
                with open(path, "w") as f:
                    f.write(domain_xml(name, vm_id, tier, kind))
                daemon.virsh("define", path)
                daemon.virsh("start", name)
            return kind
        except RuntimeError as e:
            if attempt == "qemu":
                raise
            print(f"# KVM guests cannot start here ({e}); falling back to TCG (type='qemu')", flush=True)
            for name, _, _ in vms:
                daemon.virsh("destroy", name, check=False)
                daemon.virsh("undefine", name, check=False)
    return kind


def domstate(daemon, name):
    return daemon.virsh("domstate", name).stdout.strip()


def inactive_termination(daemon, name):
    """(termination attributes or None, workload attributes or None) of the persistent definition."""
    root = ET.fromstring(daemon.virsh("dumpxml", "--inactive", name).stdout)
    md = root.find("metadata")
    term = md.find(f"{{{TERMINATION_NS}}}termination") if md is not None else None
    work = md.find(f"{{{WORKLOAD_NS}}}workload") if md is not None else None
    return (dict(term.attrib) if term is not None else None, dict(work.attrib) if work is not None else None)


def by_vm(workloads):
    return {w.get("vmId"): w for w in workloads}


def check_termination(c, lab, daemon, owner, label, since, uuid):
    """The persistent definition's termination record and the audit record it names."""
    term, work = inactive_termination(daemon, SPOT_NAME)
    c.check(f"{label}: the spot VM's persistent definition holds the termination element", term is not None,
            daemon.virsh("dumpxml", "--inactive", SPOT_NAME).stdout[-800:])
    term = term or {}
    c.eq(f"{label}: termination reason", term.get("reason"), "capacity-reclaim")
    c.eq(f"{label}: termination by (the owner's org)", term.get("by"), L.OWNER)
    at = None
    try:
        at = L.parse_time(term.get("at"))
    except (AssertionError, ValueError, TypeError):
        pass
    c.check(f"{label}: termination at is RFC 3339 UTC and now", at is not None and since - 2 <= at <= time.time() + 2,
            term.get("at"))
    c.eq(f"{label}: the workload element is untouched",
         work, {"vm-id": SPOT, "org": TENANT, "tier": "spot"})
    records = lab.audit_all(token=owner)
    c.eq("audit chain recomputes", L.verify_chain(records), [])
    rec = next((r for r in records if r.get("id") == term.get("audit-id")), None)
    c.check(f"{label}: audit-id {term.get('audit-id')!r} names an audit record", rec is not None,
            [r.get("id") for r in records])
    rec = rec or {}
    c.eq(f"{label}: audit action", rec.get("action"), "workload.terminate")
    c.check(f"{label}: audit vmIds lists {SPOT}", SPOT in (rec.get("vmIds") or []), rec.get("vmIds"))
    c.eq(f"{label}: the record written ahead is pending", rec.get("result"), "pending")
    # The outcome: the next workload.terminate record of the VM (the caller's, or the agent's when
    # it finished a termination cut short).
    seq = lambda r: int(str(r.get("id", "aud_0"))[4:] or 0)
    later = [r for r in records if r.get("action") == "workload.terminate" and SPOT in (r.get("vmIds") or [])
             and seq(r) > seq(rec)]
    c.eq(f"{label}: the outcome record after it is ok", [r.get("result") for r in later[:1]], ["ok"])
    c.eq(f"{label}: audit actor", {k: (rec.get("actor") or {}).get(k) for k in ("org", "via")},
         {"org": L.OWNER, "via": "https"})
    return term.get("audit-id")


def terminated_events(lab, vm_id, kind="workload.terminated"):
    """The `kind` events of `vm_id` in the agent's outbox (its database, read-only)."""
    db = sqlite3.connect(f"file:{os.path.join(lab.state, 'state.db')}?mode=ro", uri=True)
    try:
        evs = [json.loads(e) for (e,) in db.execute("SELECT event FROM outbox ORDER BY seq")]
    finally:
        db.close()
    return [e for e in evs if e.get("type") == kind and (e.get("data") or {}).get("vmId") == vm_id]


def spot_terminations(lab, owner):
    """The workload.terminate audit records that name the spot VM, in chain order."""
    return [r for r in lab.audit_all(token=owner)
            if r.get("action") == "workload.terminate" and SPOT in (r.get("vmIds") or [])]


def observed(lab, admin, after=None, wait="10s"):
    """GET .../state (a long poll when `after` is given): (revision, {vmId: state}, answer)."""
    q = "" if after is None else f"?after={after}&wait={wait}"
    r = lab.get(lab.npath("/state" + q), token=admin, timeout=30)
    j = r.json if r.status == 200 and isinstance(r.json, dict) else {}
    return j.get("revision"), {w.get("vmId"): w.get("state") for w in j.get("workloads") or []}, r


def wait_for_spot(lab, admin, rev, states, want, deadline, since):
    """Long-polls GET .../state from revision `rev` until the spot VM is `want` or `deadline` passes
    (a 304 is a wait that ended with nothing new: poll again). Returns (rev, states, seconds after
    `since` when it was seen or None, [(status, revision, spot state, s after since)])."""
    polls = []
    while states.get(SPOT) != want and time.time() < deadline and rev is not None:
        got, now_states, r = observed(lab, admin, after=rev, wait=f"{max(1, int(deadline - time.time()))}s")
        polls.append((r.status, got, now_states.get(SPOT), round(time.time() - since, 2)))
        if r.status == 304:
            continue
        if r.status != 200:
            break
        rev, states = got, now_states
    return rev, states, (time.time() - since if states.get(SPOT) == want else None), polls


def outside_stop(c, lab, daemon, agent_up):
    """B: `virsh destroy` from outside the agent shows in GET .../state through libvirt's
    lifecycle events, without waiting for the rescan (30 s here)."""
    admin = lab.admin()
    if domstate(daemon, SPOT_NAME) != "running":
        daemon.virsh("start", SPOT_NAME)
    # The start is itself an event: wait until the agent's view has the spot VM running.
    deadline = time.time() + 10
    rev, states, r = observed(lab, admin)
    c.status("B: GET state as the admin", r, 200)
    rev, states, _, _ = wait_for_spot(lab, admin, rev, states, "running", deadline, time.time())
    c.eq("B: the agent's view has the spot VM running (after virsh start)", states.get(SPOT), "running")
    before = rev
    t0 = time.time()
    daemon.virsh("destroy", SPOT_NAME)
    t1 = time.time()
    rev, states, delay, polls = wait_for_spot(lab, admin, rev, states, "shutoff", t1 + 10, t1)
    since_start = time.time() - agent_up
    print(f"# B: virsh destroy took {t1 - t0:.2f}s; GET state showed the spot VM shutoff "
          f"{'never (10 s)' if delay is None else f'{delay:.2f}s'} after it returned "
          f"(agent up {since_start:.1f}s, rescan every 30s)", flush=True)
    c.check(f"B: an outside virsh destroy shows as shutoff in GET state within 2 s "
            f"({'not within 10 s' if delay is None else f'{delay:.2f}s'})",
            delay is not None and delay <= 2.0,
            f"long polls (status, revision, spot state, s after destroy): {polls}; agent log: {lab.tail(800)}")
    c.check("B: ... by an event, not the 30 s rescan (the agent is up less than 30 s)", since_start < 29,
            f"{since_start:.1f}s")
    c.check("B: the revision moved", isinstance(rev, int) and isinstance(before, int) and rev > before,
            f"{before!r} -> {rev!r}")
    c.eq("B: the on-demand VM runs in the agent's view", states.get(ONDEMAND), "running")
    c.eq("virsh: the on-demand VM still runs after B", domstate(daemon, ONDEMAND_NAME), "running")


def refresh_failures(lab, start):
    """When (epoch seconds, at the latest) the agent's failed workload refreshes were logged after
    byte `start` of its log ("<RFC 3339> warning workload refresh: ..."); a stamp in whole seconds
    counts as the end of its second."""
    out = []
    for line in lab.log()[start:].splitlines():
        if "workload refresh:" not in line:
            continue
        stamp = line.split()[0]
        try:
            out.append(L.parse_time(stamp) + (0.0 if "." in stamp else 1.0))
        except (AssertionError, ValueError, TypeError, IndexError):
            pass
    return out


def resubscribed(c, lab, daemon, owner, agent_up):
    """C: libvirtd alone is killed (SIGKILL, QEMU runs on) and started again; once the agent has
    reconnected (GET workloads, retried while it answers 503), an outside `virsh start` and then
    `virsh destroy` show in GET .../state through lifecycle events on the new connection, not the
    30 s rescan."""
    admin = lab.admin()
    qemu = daemon.qemu_pid(ONDEMAND_NAME)
    log_at = len(lab.log())
    killed_at = time.time()
    killed = daemon.kill_daemon()
    time.sleep(0.5)  # down for a moment: the agent's refresh on the close callback fails meanwhile
    daemon.restart_daemon()
    up = time.time()
    print(f"# C: libvirtd (pid {killed}) killed, answered again {up - killed_at:.2f}s later", flush=True)
    c.check("C: libvirtd restarted (a new PID)", daemon.daemon_pid() not in (None, killed), daemon.daemon_pid())
    c.check("C: the on-demand VM's QEMU ran on through the restart", daemon.qemu_pid(ONDEMAND_NAME) == qemu,
            daemon.procs())

    # The agent reconnects on the next call that lists the domains (503 until it has).
    polls, r = [], None
    deadline = time.time() + 10
    while time.time() < deadline:
        r = lab.get(lab.npath("/workloads"), token=owner)
        polls.append((r.status, round(time.time() - up, 2)))
        if r.status == 200:
            break
        time.sleep(0.1)
    print(f"# C: GET workloads after the restart (status, s after libvirtd answered): {polls}", flush=True)
    c.status("C: GET workloads as the owner answers 200 once the agent has reconnected", r, 200)
    ws = by_vm((r.json or {}).get("workloads", [])) if r is not None and r.status == 200 else {}
    c.eq("C: workloads after the reconnect: spot shutoff, on-demand running",
         {vm: ws.get(vm, {}).get("state") for vm in (SPOT, ONDEMAND)}, {SPOT: "shutoff", ONDEMAND: "running"})

    # The agent retries a failed refresh by itself (1 s after the first failure, doubling). Let
    # the retry that follows the last failure run first, so that what the agent sees below can
    # only have come through an event (or the rescan, 30 s after its start).
    fails = refresh_failures(lab, log_at)
    settle = up + 0.5
    if fails:
        settle = max(settle, fails[-1] + min(2 ** (len(fails) - 1), 30) + 0.5)
    settle = min(settle, up + 8)
    print(f"# C: {len(fails)} failed refresh(es) logged while libvirtd was down; starting the spot VM "
          f"{max(0.0, settle - up):.2f}s after libvirtd answered", flush=True)
    time.sleep(max(0.0, settle - time.time()))

    rev, states, r = observed(lab, admin)
    c.status("C: GET state as the admin", r, 200)
    if domstate(daemon, SPOT_NAME) != "running":
        daemon.virsh("start", SPOT_NAME)
    started = time.time()
    rev, states, run_delay, _ = wait_for_spot(lab, admin, rev, states, "running", started + 10, started)
    print(f"# C: GET state showed the spot VM running "
          f"{'never (10 s)' if run_delay is None else f'{run_delay:.2f}s'} after virsh start returned", flush=True)
    c.check("C: an outside virsh start after libvirtd's restart shows as running in GET state within 10 s "
            f"({'not within 10 s' if run_delay is None else f'{run_delay:.2f}s'})", run_delay is not None,
            f"the agent's view still has the spot VM {states.get(SPOT)!r} at revision {rev!r}: no lifecycle "
            f"event on the agent's new connection?; agent log: {lab.tail(800)}")
    if run_delay is None:
        # Not heard: a listing puts the running VM into the agent's view, so that the destroy
        # below is still measured.
        lab.get(lab.npath("/workloads"), token=owner)
        rev, states, r = observed(lab, admin)
    measurable = states.get(SPOT) == "running"
    before = rev

    t0 = time.time()
    daemon.virsh("destroy", SPOT_NAME)
    t1 = time.time()
    delay, polls = None, []
    if measurable:
        rev, states, delay, polls = wait_for_spot(lab, admin, rev, states, "shutoff", t1 + 5, t1)
    since_start = time.time() - agent_up
    print(f"# C: virsh destroy took {t1 - t0:.2f}s; GET state showed the spot VM shutoff "
          f"{'never (5 s)' if delay is None else f'{delay:.2f}s'} after it returned "
          f"(agent up {since_start:.1f}s, rescan every 30s)", flush=True)
    c.check("C: the agent's view had the spot VM running before the destroy", measurable,
            f"spot state {states.get(SPOT)!r}: the destroy could not be measured")
    c.check("C: after libvirtd restarted, an outside virsh destroy shows as shutoff in GET state within 2 s "
            f"({'not within 5 s' if delay is None else f'{delay:.2f}s'}; lifecycle events must be "
            "registered again on the agent's new connection)",
            delay is not None and delay <= 2.0,
            f"long polls (status, revision, spot state, s after destroy): {polls}; agent log: {lab.tail(800)}")
    c.check("C: ... by an event, not the 30 s rescan (the agent is up less than 25 s)", since_start < 25,
            f"{since_start:.1f}s")
    c.check("C: the revision moved", isinstance(rev, int) and isinstance(before, int) and rev > before,
            f"{before!r} -> {rev!r}")
    c.eq("C: the on-demand VM runs in the agent's view", states.get(ONDEMAND), "running")
    c.eq("virsh: the on-demand VM still runs after C", domstate(daemon, ONDEMAND_NAME), "running")


def cut_short(c, lab, daemon, owner, left, uuid):
    """A: libvirtd is killed (SIGKILL, QEMU runs on) in the middle of a terminate-spot with an
    8 s grace: 503 hypervisor-unavailable, the write-ahead record and nothing more; libvirtd
    starts again, re-attaches to QEMU, and the agent finishes the termination as itself at its
    next refresh (rescan every 2 s here)."""
    grace = 8
    if domstate(daemon, SPOT_NAME) != "running":
        daemon.virsh("start", SPOT_NAME)
    c.eq("A: virsh: the spot VM runs", domstate(daemon, SPOT_NAME), "running")
    c.eq("A: virsh: the on-demand VM runs", domstate(daemon, ONDEMAND_NAME), "running")
    qemu = {n: daemon.qemu_pid(n) for n in (SPOT_NAME, ONDEMAND_NAME)}
    c.check("A: the QEMU processes of both VMs are found", all(qemu.values()), f"{qemu}; {daemon.procs()}")
    recs0 = spot_terminations(lab, owner)
    evs0 = terminated_events(lab, SPOT)

    answer = {}

    def post():
        try:
            answer["r"] = lab.call("POST", lab.npath("/terminate-spot"), token=owner,
                                   body={"gracePeriodSeconds": grace}, timeout=60)
        except Exception as e:  # reported by the check below
            answer["error"] = f"{type(e).__name__}: {e}"
        answer["at"] = time.time()

    since = time.time()
    t = threading.Thread(target=post, daemon=True)
    t.start()
    # Kill once the termination is under way: its write-ahead record is there, 1.5 s in.
    ahead = None
    while time.time() < since + 5 and ahead is None:
        ahead = next((r for r in spot_terminations(lab, owner)[len(recs0):]), None)
        if ahead is None:
            time.sleep(0.1)
    c.check("A: the write-ahead workload.terminate record is there while the call runs", ahead is not None,
            f"answer so far: {answer}")
    time.sleep(max(0.0, since + 1.5 - time.time()))
    c.check("A: the call is still waiting out the grace when libvirtd is killed", t.is_alive(), answer)
    killed_at = time.time()
    killed = daemon.kill_daemon()
    print(f"# A: libvirtd (pid {killed}) killed {killed_at - since:.2f}s after the POST", flush=True)
    t.join(60)
    r = answer.get("r")
    took = answer.get("at", time.time()) - since
    print(f"# A: terminate-spot answered {took:.2f}s after the POST, {took - (killed_at - since):.2f}s after "
          f"the kill (grace {grace}s): {r!r}", flush=True)
    if r is None:
        # The agent's own words: an agent that died here (seen once under ASan on a loaded machine,
        # its log lost) says why in its last lines.
        c.check("A: terminate-spot answered", False,
                f"{answer.get('error', 'no answer within 60 s')}; agent log: {lab.tail(3000)}")
        r = L.Resp(0, {}, b"")
    c.problem("A: terminate-spot cut short by libvirtd's death: 503 hypervisor-unavailable", r, 503,
              "hypervisor-unavailable")
    c.check(f"A: ... answered before the {grace} s grace ended ({took:.2f}s after the POST)", took < grace,
            f"{took:.2f}s; agent log: {lab.tail(800)}")
    j = r.json if isinstance(r.json, dict) else {}
    c.eq("A: 503 body: terminated is empty", j.get("terminated"), [])
    c.eq("A: 503 body: leftRunning is the on-demand VM (not-spot)", j.get("leftRunning"), [left])
    alive = {n: daemon.procs().get(p) is not None for n, p in qemu.items()}
    c.eq("A: QEMU of both VMs runs on without libvirtd", alive, {SPOT_NAME: True, ONDEMAND_NAME: True})

    recs = spot_terminations(lab, owner)[len(recs0):]
    c.check("A: the audit holds the write-ahead record and no outcome yet",
            len(recs) == 1 and ahead is not None and recs[0].get("id") == ahead.get("id"), recs)
    ahead = recs[0] if recs else (ahead or {})
    c.eq("A: write-ahead record: actor, result",
         ({k: (ahead.get("actor") or {}).get(k) for k in ("org", "via")}, ahead.get("result")),
         ({"org": L.OWNER, "via": "https"}, "pending"))
    c.eq("A: outbox: no new workload.terminated event", terminated_events(lab, SPOT)[len(evs0):], [])

    # Down through a refresh or two (every 2 s): still pending, nothing recorded, QEMU untouched.
    time.sleep(2.5)
    c.eq("A: after 2.5 s without libvirtd: still no outcome record",
         len(spot_terminations(lab, owner)[len(recs0):]), 1)
    c.eq("A: after 2.5 s without libvirtd: still no event", terminated_events(lab, SPOT)[len(evs0):], [])
    c.check("A: the spot VM's QEMU still runs", daemon.procs().get(qemu[SPOT_NAME]) is not None, daemon.procs())

    restarted_at = time.time()
    daemon.restart_daemon()
    up = time.time()
    print(f"# A: libvirtd answered again {up - restarted_at:.2f}s after its restart "
          f"(down {up - killed_at:.1f}s)", flush=True)
    c.check("A: libvirtd restarted (a new PID)", daemon.daemon_pid() not in (None, killed), daemon.daemon_pid())
    states = {n: domstate(daemon, n) for n in (SPOT_NAME, ONDEMAND_NAME)}
    c.eq("A: the restarted libvirtd re-attached to both QEMUs (virsh domstate)", states,
         {SPOT_NAME: "running", ONDEMAND_NAME: "running"})
    c.eq("A: ... the same QEMU processes", {n: daemon.qemu_pid(n) for n in qemu}, qemu)

    # The agent reconnects at its next refresh and finishes the termination itself, with the
    # original record and grace (SeaBIOS ignores the shutdown: destroyed after 8 s).
    deadline = up + 2 + grace + 8
    done_at, outcome, evs = None, [], []
    while time.time() < deadline:
        outcome = spot_terminations(lab, owner)[len(recs0) + 1:]
        evs = terminated_events(lab, SPOT)[len(evs0):]
        if outcome and evs and domstate(daemon, SPOT_NAME) == "shut off":
            done_at = time.time()
            break
        time.sleep(0.25)
    print(f"# A: the agent finished the termination {'never' if done_at is None else f'{done_at - up:.1f}s'} "
          f"after libvirtd came back (rescan 2 s + grace {grace} s)", flush=True)
    c.check(f"A: the agent finished the termination within {deadline - up:.0f} s of libvirtd's return",
            done_at is not None, f"outcome records {outcome}; events {evs}; spot VM "
            f"{domstate(daemon, SPOT_NAME)!r}; agent log: {lab.tail(1500)}")
    c.eq("virsh: the spot VM is shut off (A)", domstate(daemon, SPOT_NAME), "shut off")
    c.eq("virsh: the on-demand VM still runs (A)", domstate(daemon, ONDEMAND_NAME), "running")
    c.check("A: exactly one outcome record", len(outcome) == 1, outcome)
    rec = outcome[0] if outcome else {}
    c.eq("A: outcome record: actor (the agent), result, requestId",
         (rec.get("actor"), rec.get("result"), rec.get("requestId")),
         ({"sub": "gpunode-agent", "org": None, "roles": [], "via": "agent"}, "ok", None))
    c.check("A: outcome record says the agent finished it", "finished by the agent" in (rec.get("detail") or ""),
            rec.get("detail"))
    c.check("A: exactly one new workload.terminated event", len(evs) == 1, evs)
    ev = (evs[0] if evs else {}).get("data") or {}
    c.eq("A: the event: by the owner's org, auditId the write-ahead record's, reason, domain",
         {k: ev.get(k) for k in ("vmId", "domainUuid", "by", "auditId", "reason")},
         {"vmId": SPOT, "domainUuid": uuid[SPOT_NAME], "by": L.OWNER, "auditId": ahead.get("id"),
          "reason": "capacity-reclaim"})
    named = check_termination(c, lab, daemon, owner, "A", since, uuid)
    c.eq("A: the termination element names the write-ahead record", named, ahead.get("id"))
    c.check("A: the on-demand VM's QEMU is the same process throughout",
            daemon.qemu_pid(ONDEMAND_NAME) == qemu[ONDEMAND_NAME], daemon.procs())
    r = lab.get(lab.npath("/workloads"), token=owner)
    ws = by_vm((r.json or {}).get("workloads", [])) if r.status == 200 else {}
    c.eq("A: workloads: spot shutoff (capacity-reclaim), on-demand running",
         {vm: (ws.get(vm, {}).get("state"), ws.get(vm, {}).get("terminationReason")) for vm in (SPOT, ONDEMAND)},
         {SPOT: ("shutoff", "capacity-reclaim"), ONDEMAND: ("running", None)})


def mid_list(c, lab, daemon, owner):
    """D: libvirtd stopped (SIGSTOP) while the agent lists, so the list call is on the wire with no
    answer, then SIGKILLed: the list fails on the closed connection, the request that needed it
    (a terminate-spot: it always lists now) answers 503 hypervisor-unavailable with the reason
    logged, everything else is served meanwhile, and once libvirtd is back the agent lists again.
    GET workloads, meanwhile, is the list libvirt's events keep current (no event came)."""
    pid = daemon.daemon_pid()
    mark = len(lab.log())
    os.kill(pid, signal.SIGSTOP)
    kept = lab.get(lab.npath("/workloads"), token=owner, timeout=5)
    c.status("D: GET workloads answers from the list the events keep current, libvirtd stopped", kept, 200)
    answer = {}

    def terminate():
        # The node's owner, every unit: neither VM is on a unit, so nothing would be terminated.
        answer["r"] = lab.call("POST", lab.npath("/terminate-spot"), token=owner, body={}, timeout=60)
        answer["at"] = time.time()

    t = threading.Thread(target=terminate)
    t.start()
    time.sleep(1.0)
    c.check("D: terminate-spot waits on the stopped libvirtd (its list is in flight)", t.is_alive(), answer)
    c.status("D: /healthz answers meanwhile", lab.get("/healthz"), 200)
    killed_at = time.time()
    daemon.kill_daemon()  # SIGKILL to the stopped libvirtd: its socket closes mid-call
    t.join(30)
    r = answer.get("r")
    took = answer.get("at", float("inf")) - killed_at
    print(f"# D: terminate-spot answered {took:.2f}s after libvirtd was killed mid-list", flush=True)
    c.check(f"D: the list in flight fails: 503 hypervisor-unavailable within 5 s of the kill ({took:.2f}s)",
            r is not None and r.status == 503 and r.code() == "hypervisor-unavailable" and took < 5, r)
    line = lab.log_line("hypervisor:", since=mark)
    c.check(f"D: log: {line[line.find('hypervisor:'):][:160]!r}", bool(line), lab.tail(800))
    c.status("D: reads that need no hypervisor are served (units)", lab.get(lab.npath("/units"), token=owner), 200)
    daemon.restart_daemon()
    deadline, r = time.time() + 20, None
    while time.time() < deadline:
        r = lab.get(lab.npath("/workloads"), token=owner)
        if r.status == 200:
            break
        time.sleep(0.25)
    c.status("D: libvirtd back: GET workloads 200 again (the agent reconnected)", r, 200)
    ws = by_vm((r.json or {}).get("workloads", [])) if r is not None and r.status == 200 else {}
    c.eq("D: both VMs listed, as before", sorted(ws), sorted([SPOT, ONDEMAND]))


def body(c, agent, daemon):
    kind = define_and_start(daemon, [(SPOT_NAME, SPOT, "spot"), (ONDEMAND_NAME, ONDEMAND, "on-demand")])
    print(f"# libvirtd {daemon.uri}; guests are type='{kind}'", flush=True)
    uuid = {n: daemon.virsh("domuuid", n).stdout.strip() for n in (SPOT_NAME, ONDEMAND_NAME)}
    c.eq("virsh: the spot VM runs", domstate(daemon, SPOT_NAME), "running")
    c.eq("virsh: the on-demand VM runs", domstate(daemon, ONDEMAND_NAME), "running")

    with L.Lab(agent) as lab:
        text = lab.config_text()
        assert "uri: test:///default" in text, "lab.config_text() no longer names test:///default"
        lab.write_config(text.replace("uri: test:///default", f'uri: "{daemon.uri}"'))
        lab.start()
        agent_up = time.time()
        owner = lab.token(org=L.OWNER)

        # -- what the owner sees ---------------------------------------------------------------
        r = lab.get(lab.npath("/workloads"), token=owner)
        c.status("GET workloads as the owner", r, 200)
        ws = by_vm((r.json or {}).get("workloads", []))
        c.eq("workloads: exactly the two VMs", sorted(ws), sorted([SPOT, ONDEMAND]))
        for vm, name, tier in ((SPOT, SPOT_NAME, "spot"), (ONDEMAND, ONDEMAND_NAME, "on-demand")):
            w = ws.get(vm, {})
            c.eq(f"workloads: {vm}", {k: w.get(k) for k in
                                     ("vmId", "domainUuid", "name", "org", "tier", "state", "unitIds", "terminationReason")},
                 {"vmId": vm, "domainUuid": uuid[name], "name": name, "org": TENANT, "tier": tier,
                  "state": "running", "unitIds": [], "terminationReason": None})

        # -- terminate-spot by the owner, no grace ---------------------------------------------
        left = {"vmId": ONDEMAND, "domainUuid": uuid[ONDEMAND_NAME], "name": ONDEMAND_NAME, "unitIds": [],
                "tier": "on-demand", "reason": "not-spot"}
        gone = {"vmId": SPOT, "domainUuid": uuid[SPOT_NAME], "name": SPOT_NAME, "unitIds": []}
        since = time.time()
        r = lab.call("POST", lab.npath("/terminate-spot"), token=owner, body={"gracePeriodSeconds": 0}, timeout=60)
        c.status("terminate-spot (grace 0) as the owner", r, 200)
        j = r.json if isinstance(r.json, dict) else {}
        c.eq("terminate-spot: terminated is the spot VM", j.get("terminated"), [gone])
        c.eq("terminate-spot: leftRunning is the on-demand VM (not-spot)", j.get("leftRunning"), [left])
        c.eq("virsh: the spot VM is shut off", domstate(daemon, SPOT_NAME), "shut off")
        c.eq("virsh: the on-demand VM still runs", domstate(daemon, ONDEMAND_NAME), "running")
        first = check_termination(c, lab, daemon, owner, "grace 0", since, uuid)

        r = lab.get(lab.npath("/workloads"), token=owner)
        c.status("GET workloads after the termination", r, 200)
        ws = by_vm((r.json or {}).get("workloads", []))
        c.eq("workloads: the spot VM is shutoff, capacity-reclaim",
             {k: ws.get(SPOT, {}).get(k) for k in ("state", "terminationReason")},
             {"state": "shutoff", "terminationReason": "capacity-reclaim"})
        c.eq("workloads: the on-demand VM runs, no termination",
             {k: ws.get(ONDEMAND, {}).get(k) for k in ("state", "terminationReason")},
             {"state": "running", "terminationReason": None})

        # -- the spot VM again, terminated with a 2 s grace (SeaBIOS ignores the ACPI shutdown) --
        daemon.virsh("start", SPOT_NAME)
        c.eq("virsh: the spot VM runs again", domstate(daemon, SPOT_NAME), "running")
        since = time.time()
        r = lab.call("POST", lab.npath("/terminate-spot"), token=owner, body={"gracePeriodSeconds": 2}, timeout=60)
        took = time.time() - since
        c.status("terminate-spot (grace 2) as the owner", r, 200)
        j = r.json if isinstance(r.json, dict) else {}
        c.eq("terminate-spot (grace 2): terminated is the spot VM", j.get("terminated"), [gone])
        c.eq("terminate-spot (grace 2): leftRunning is the on-demand VM", j.get("leftRunning"), [left])
        c.check(f"terminate-spot (grace 2) waited out the grace before destroying (took {took:.1f}s)",
                2.0 <= took < 30, f"{took:.2f}s")
        c.eq("virsh: the spot VM is shut off again", domstate(daemon, SPOT_NAME), "shut off")
        c.eq("virsh: the on-demand VM still runs after the second call", domstate(daemon, ONDEMAND_NAME), "running")
        answered = time.time()
        second = check_termination(c, lab, daemon, owner, "grace 2", since, uuid)
        c.check("grace 2: a new audit record, not the first one", second is not None and second != first,
                f"{first!r} then {second!r}")
        # CONTRACT §12: the notice came first, stored before the guest was asked to shut down, and
        # the destroy no earlier than its deadline.
        notices = terminated_events(lab, SPOT, "workload.terminating")
        done = terminated_events(lab, SPOT)
        n = (notices[-1] if notices else {}).get("data", {})
        c.eq("grace 2: one workload.terminating (grace 0 gave none), naming the write-ahead record",
             (len(notices), n.get("auditId"), n.get("domainUuid")), (1, second, uuid[SPOT_NAME]))
        c.check("grace 2: workload.terminating before workload.terminated",
                notices and done and notices[-1]["seq"] < done[-1]["seq"], (notices, done))
        deadline = L.parse_time(n.get("deadline", "")) if n.get("deadline") else None
        c.check(f"grace 2: the deadline is the start plus 2 s, and the VM was stopped no earlier ({n.get('deadline')})",
                deadline is not None and since - 1 <= deadline - 2 <= since + 1 and answered >= deadline,
                (n, since, answered))

        # -- B: an outside stop is seen through libvirt's events (rescan every 30 s) ----------
        outside_stop(c, lab, daemon, agent_up)

        # -- C: events are heard again after libvirtd restarts (rescan every 30 s) -------------
        if time.time() - agent_up > 8:  # C must be measured well before the rescan
            rc, _ = lab.stop()
            c.eq("the agent stops cleanly on SIGTERM (before C)", rc, 0)
            lab.start()
            agent_up = time.time()
            print("# C: the agent was restarted (up too long for C)", flush=True)
        resubscribed(c, lab, daemon, owner, agent_up)
        rc, _ = lab.stop()
        c.eq("the agent stops cleanly on SIGTERM", rc, 0)

        # -- A: libvirtd dies mid-termination and comes back (rescan every 2 s) ---------------
        assert "rescan_interval: 30s" in text, "lab.config_text() no longer sets rescan_interval: 30s"
        lab.write_config(text.replace("uri: test:///default", f'uri: "{daemon.uri}"')
                         .replace("rescan_interval: 30s", "rescan_interval: 2s"))
        if domstate(daemon, SPOT_NAME) != "running":
            daemon.virsh("start", SPOT_NAME)
        lab.start()
        cut_short(c, lab, daemon, owner, left, uuid)

        # -- D: libvirtd killed in the middle of a list ----------------------------------------
        mid_list(c, lab, daemon, owner)
        rc, _ = lab.stop()
        c.eq("the agent (rescan 2 s) stops cleanly on SIGTERM", rc, 0)


def main():
    if len(sys.argv) < 2:
        print(f"usage: {sys.argv[0]} PATH/TO/gpunode-agent", file=sys.stderr)
        return 2
    t0 = time.time()
    daemon = None
    # SIGTERM (a CTest timeout) unwinds through the finally blocks: agent, daemon and dirs go.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    c = L.Checks("libvirtd")
    try:
        try:
            daemon = Libvirtd(preflight())
            daemon.start()
        except Skip as e:
            print(f"SKIP: {e}", flush=True)
            return SKIP
        try:
            body(c, sys.argv[1], daemon)
        except Exception as e:  # a crash of the test itself is one failed check
            import traceback
            traceback.print_exc()
            c.check("libvirtd test ran to the end", False, f"{type(e).__name__}: {e}")
            print("# libvirtd log tail:\n" + daemon.tail(), flush=True)
    finally:
        if daemon is not None:
            daemon.close()
    c.check("no process of the private libvirtd is left (libvirtd, QEMU)", not daemon.leftovers(), daemon.leftovers())
    print(f"# {time.time() - t0:.1f}s", flush=True)
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())
