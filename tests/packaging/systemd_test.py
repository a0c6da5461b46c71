#!/usr/bin/env python3
"""The package on a stock Debian host under a real systemd (issue 25, CONTRACT §11 "A stock host",
"Reload says whether it took", "Checking the files"; issue 39, §14: each release's package on that
release).

A root of the release the package was built for (--release: bookworm, Debian 12, with systemd 252;
trixie, Debian 13, with systemd 257; mmdebstrap from this machine's Debian apt sources, the suite
switched; cached, see below) with Debian's own systemd, dbus, polkitd and libvirt-daemon-system is
booted with `systemd-nspawn -b` (`--register=no --keep-unit`: the test machine's PID 1 need not be
systemd, and there may be no system bus; a private network). Commands run inside it through
`nsenter`. The package is installed with apt and configured as the README's steps say; then, each
checked and printed:

  install     the user and groups (gpunode in libvirt in /etc/group), the key directory, the unit
              enabled and not started, the postinst saying why
  configure   check-config --files as gpunode refusing a 0600 root:root key, then passing
  start       Type=notify active, HTTPS /healthz, `libvirt: connected` on qemu:///system through
              polkit (gpunode_libvirt_connected 1, no polkit refusal in the journal), units from the
              container's own sysfs under the sandbox, the admin socket for root and for a member of
              gpunode-admin (a non-member refused, exit 3), systemd-analyze security of the live unit
  reload      refused (`systemctl reload` fails, the agent keeps running with the same PID) and
              accepted; a key needing a restart, then the restart
  watchdog    a frozen agent (SIGSTOP) is killed by systemd and restarted
  restart     `systemctl restart` while HTTPS and admin-socket callers keep asking: none refused
  upgrade     the same package installed over the running agent: restarted, state and edited
              configuration kept, no caller refused; after restarts until the unit's start limit
              refused one (the agent down, its socket unit failed): started again; the handover
              from 0.1.0 (its unit, with no socket unit, running the agent): the postinst stops
              it, the socket unit binds, the agent runs from it, and the next restart refuses
              nothing
  remove      stopped, state and configuration kept; purge: both gone

With --upgrade-from DIR (trixie only: DIR holds the Debian 12 package) a second container of the same
root is a Debian 13 host that ran the Debian 12 package, as `apt full-upgrade` from 12 to 13 leaves
one: the 12 package installed and its libraries that 13 no longer has kept (obsolete), configured,
running with a reservation; then the 13 package is installed over it under load: nothing refused,
the agent restarted on this release's libraries, the edited configuration, the reservation and the
audit chain kept, libvirt connected.

Debian 12 and 13 differ little here, and the test says what it finds: both run the monolithic
libvirtd (13 packages no modular daemons), socket-activated (`libvirtd.socket`,
/run/libvirt/libvirt-sock, mode 0666) and leaving after 120 s idle (`--timeout 120`); polkit (122 on
12, 126 on 13) reads its rules from /etc/polkit-1/rules.d and /usr/share/polkit-1/rules.d (126 also
/run and /usr/local/share), where libvirt's 60-libvirt.rules admits group libvirt by /etc/group.

The root is cached in $GPUNODE_TEST_CACHE (default /var/cache/gpunode-tests) as
`systemd-SUITE-HASH` (`systemd-upgrade-SUITE-HASH` with --upgrade-from), one directory per
release, package list and apt sources (scripts/debroot.py), built once (about 90 s and 270 MB with the network) and never written to: each run boots an overlay
of it. Needs root, systemd-nspawn (systemd-container) and mmdebstrap; without root it prints
`SKIP: why` and exits 77.

Usage: systemd_test.py OUT_DIR SOURCE_DIR [--release SUITE] [--upgrade-from DIR]
  OUT_DIR holds the package (as package.build or make packages left it); SUITE is the release it was
  built for (default: this machine's).
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
sys.dont_write_bytecode = True
import lab as L  # noqa: E402
import hook_test as H  # noqa: E402
sys.path.insert(0, HERE)
from package_test import HOOK, MAX_EXPOSURE, UNIT, run, wait_for  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts"))
import debroot  # noqa: E402

UPGRADE_FROM = "bookworm"  # --upgrade-from: the release a Debian 13 host was upgraded from
# What a stock libvirt host has, beyond the package's own Depends (added from the .deb): Debian's
# libvirtd with its QEMU driver and polkit, systemd as PID 1 with a system bus, procps (priority
# important, on every installed system: libvirtd's ExecReload= is its /bin/kill), and curl for the
# checks. Not qemu-system: no domain is started here (tests/integration/libvirtd_hook_test.py
# starts real ones).
BASE_PACKAGES = ["systemd", "systemd-sysv", "dbus", "polkitd", "libvirt-daemon-system", "libvirt-daemon-driver-qemu",
                 "libvirt-clients", "procps", "curl"]
ROOT_FORMAT = "2"  # bump when the way the root is built changes


def short(text, n=300):
    text = (text or "").strip()
    return text if len(text) <= n else text[:n] + " ..."


# ---- the cached root ------------------------------------------------------------------------------

def package_depends(deb):
    """The first alternative of each Depends and Recommends entry of the .deb, without versions."""
    names = []
    for field in ("Depends", "Recommends"):
        value = run(["dpkg-deb", "-f", deb, field], check=True).stdout.strip()
        for entry in filter(None, (e.strip() for e in value.split(","))):
            names.append(re.split(r"[\s(|]", entry.split("|")[0].strip())[0])
    return names


def cached_root(suite, deb, old_deb=None):
    """The root of `suite` with BASE_PACKAGES and the package's dependencies (debroot.cached_root,
    kind `systemd`, or `systemd-upgrade` with `old_deb`). With `old_deb` (the Debian 12 package, for the upgrade on a Debian 13 host) it
    also holds what that package needs beyond them as a host upgraded from Debian 12 keeps it: the
    libraries its release had and this one has not (libboost-json1.81.0, libfmt9, ...), installed
    from that release's archive, whose source is then removed again, as `apt full-upgrade` leaves
    them (installed, obsolete)."""
    hooks, inputs = [], []
    if old_deb is not None:
        # What the old package needs, not the package itself (the root stays cached while the
        # package is rebuilt): its Depends, given to a stand-in package apt resolves.
        depends = run(["dpkg-deb", "-f", old_deb, "Depends"], check=True).stdout.strip()
        arch = run(["dpkg-deb", "-f", old_deb, "Architecture"], check=True).stdout.strip()
        inputs.append(("old-control", (f"Package: gpunode-upgrade-from\nVersion: 1\nArchitecture: {arch}\n"
                                       f"Maintainer: gpunode tests <tests@invalid>\nDepends: {depends}\n"
                                       "Description: what the old gpunode-agent package depends on\n").encode()))
        scratch = tempfile.mkdtemp(prefix="gpunode-sources-")
        try:
            paths, texts = debroot.sources_for(UPGRADE_FROM, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        # Each as it was written (NN-NAME.list or .sources: apt reads them by their ending).
        inputs += [(f"old-{os.path.basename(p)}", t.encode()) for p, t in zip(paths, texts)]
        # apt picks what the old package needs beyond this root: the names this release has not,
        # from the old release (apt -s says which); nothing this release has is replaced.
        hooks = ['mkdir -p "$1/tmp/old/DEBIAN" && cp "$GPUNODE_ROOT_INPUTS/old-control" "$1/tmp/old/DEBIAN/control"',
                 'chroot "$1" dpkg-deb --build /tmp/old /tmp/old.deb >/dev/null',
                 'for f in "$GPUNODE_ROOT_INPUTS"/old-*.list "$GPUNODE_ROOT_INPUTS"/old-*.sources; do [ ! -e "$f" ] || '
                 'cp "$f" "$1/etc/apt/sources.list.d/gpunode-upgrade-from-${f##*/old-}"; done',
                 'chroot "$1" apt-get update -qq',
                 'chroot "$1" sh -c \'set -e; want=$(apt-get -s install --no-install-recommends /tmp/old.deb | '
                 'sed -n "s/^Inst \\([^ ]*\\) .*/\\1/p" | grep -vx gpunode-upgrade-from || true); '
                 'echo "upgrade-from: $want"; apt-get install -y -qq --no-install-recommends $want\'',
                 'rm -rf "$1/tmp/old" "$1/tmp/old.deb" "$1"/etc/apt/sources.list.d/gpunode-upgrade-from-*']
    packages = BASE_PACKAGES + package_depends(deb)
    # Its own kind with the upgrade's libraries: a host of `suite` that boots both (make test's root,
    # test-packages' upgrade) keeps both, instead of each making the other stale.
    kind = "systemd" if old_deb is None else "systemd-upgrade"
    return debroot.cached_root(kind, suite, packages, hooks=hooks, inputs=inputs, fmt=ROOT_FORMAT,
                               log=lambda text: print(text, flush=True))


# ---- the container --------------------------------------------------------------------------------

class Container:
    """systemd-nspawn -b over an overlay of the cached root; commands through nsenter."""

    def __init__(self, lower, scratch, binds):
        self.scratch = scratch
        self.dir = os.path.join(scratch, "merged")
        self.mounted = False
        for d in ("upper", "work", "merged"):
            os.makedirs(os.path.join(scratch, d))
        p = run(["mount", "-t", "overlay", "overlay", "-o",
                 f"lowerdir={lower},upperdir={scratch}/upper,workdir={scratch}/work", self.dir])
        if p.returncode == 0:
            self.mounted = True
        else:  # no overlayfs here: a copy (slower, same result)
            print(f"# overlay mount failed ({short(p.stderr)}): copying the root", flush=True)
            os.rmdir(self.dir)
            run(["cp", "-a", "--reflink=auto", lower, self.dir], check=True, timeout=600)
        self.console = open(os.path.join(scratch, "console.log"), "wb")
        args = ["systemd-nspawn", "--quiet", "-D", self.dir, "-b", "--register=no", "--keep-unit",
                "--machine=gpunode-systemd-test", "--private-network", "--console=passive"]
        args += [f"--bind-ro={src}:{dst}" for src, dst in binds]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.console, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.leader = None

    def boot(self, timeout=120):
        """Waits for the container's systemd to finish starting up; returns what it says."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.proc.returncode}: {self.console_tail()}")
            # The container's PID 1 is the systemd among nspawn's descendants (nspawn forks a
            # short-lived child of its own first: a pid taken too early is gone a moment later).
            self.leader = self.container_init()
            if self.leader is not None:
                state = self.sh("systemctl is-system-running").stdout.strip()
                if state in ("running", "degraded"):
                    return state
            time.sleep(0.25)
        raise RuntimeError(f"the container did not finish booting ({state!r}): {self.console_tail()}")

    def container_init(self):
        todo, seen = [self.proc.pid], set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if pid != self.proc.pid and f.read().strip() == "systemd":
                        return pid
            except OSError:
                continue
            todo += [int(k) for k in run(["pgrep", "-P", str(pid)]).stdout.split()]
        return None

    def sh(self, script, timeout=300, user=None):
        """`sh -c script` inside, as root (or as `user` with runuser), with a clean environment."""
        inner = ["runuser", "-u", user, "--"] if user else []
        return run(["nsenter", "-t", str(self.leader), "-a", "--", "env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
                    "LANG=C.UTF-8", "DEBIAN_FRONTEND=noninteractive", "SYSTEMD_COLORS=0", *inner, "/bin/sh", "-c", script],
                   timeout=timeout)

    def path(self, inside):
        return os.path.join(self.dir, inside.lstrip("/"))

    def console_tail(self):
        try:
            with open(os.path.join(self.scratch, "console.log"), "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def close(self):
        if self.proc.poll() is None:
            if self.leader is not None:
                self.sh("systemctl poweroff --no-block", timeout=30)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.console.close()
        if self.mounted:
            run(["umount", "-l", self.dir])


# ---- the checks -----------------------------------------------------------------------------------

def main_pid(ct):
    return ct.sh(f"systemctl show -P MainPID {UNIT}").stdout.strip()


def wait_active(ct, timeout=30):
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = ct.sh(f"systemctl is-active {UNIT}").stdout.strip()
        if state == "active":
            return state
        time.sleep(0.2)
    return state


def status_json(ct, user=None):
    p = ct.sh("gpunodectl --json status", user=user)
    try:
        return p, json.loads(p.stdout)
    except ValueError:
        return p, {}


def wait_libvirt(ct, timeout=30):
    deadline = time.monotonic() + timeout
    status = {}
    while time.monotonic() < deadline:
        _, status = status_json(ct)
        if status.get("libvirt") == "connected":
            break
        time.sleep(0.5)
    return status


def journal(ct, since_cursor=None):
    cursor = f"--after-cursor='{since_cursor}'" if since_cursor else ""
    return ct.sh(f"journalctl -u {UNIT} --no-pager -o cat {cursor}").stdout


def cursor(ct):
    p = ct.sh("journalctl -n 0 --show-cursor --no-pager")
    m = re.search(r"-- cursor: (\S+)", p.stdout)
    return m.group(1) if m else None


def set_config(ct, text):
    with open(ct.path("/etc/gpunode/agent.yaml"), "w", encoding="utf-8") as f:
        f.write(text)


def check_install(c, ct, deb_name):
    p = ct.sh(f"apt-get install -y --no-install-recommends /mnt/pkg/{deb_name}", timeout=600)
    c.eq(f"apt-get install ./{deb_name}: exit 0", p.returncode, 0)
    if p.returncode != 0:
        print(f"# apt: {p.stdout[-1500:]}{p.stderr[-1500:]}", flush=True)
    said = [l for l in (p.stdout + p.stderr).splitlines() if "gpunode" in l and ("not started" in l or ": " in l)]
    c.check("postinst: enabled, not started, and why (the shipped config's problems as gpunode)",
            "enabled, not started" in p.stdout + p.stderr and "node.id" in p.stdout + p.stderr, short(p.stdout + p.stderr, 800))
    print("#   postinst said: " + " | ".join(short(l, 160) for l in said[:6]), flush=True)
    p = ct.sh("getent passwd gpunode; getent group libvirt; getent group gpunode-admin; id gpunode")
    print(f"#   {p.stdout.strip()}".replace("\n", "\n#   "), flush=True)
    group = next((l for l in p.stdout.splitlines() if l.startswith("libvirt:")), "")
    c.check("sysusers: gpunode is a member of libvirt in /etc/group", "gpunode" in group.split(":")[-1].split(","), group)
    p = ct.sh("stat -c '%a %U:%G' /etc/gpunode/tls")
    c.eq("tmpfiles: /etc/gpunode/tls is 750 root:gpunode", p.stdout.strip(), "750 root:gpunode")
    p = ct.sh(f"systemctl is-enabled {UNIT}; systemctl is-active {UNIT}")
    c.eq("the unit: enabled, not started", p.stdout.split(), ["enabled", "inactive"])
    p = ct.sh("test -x /etc/libvirt/hooks/qemu.d/50-gpunode && systemctl is-active libvirtd")
    c.eq("the libvirt hook is installed and libvirtd runs", p.stdout.strip(), "active")
    log = ct.sh("journalctl --no-pager -o cat -u libvirtd.service").stdout
    c.check("... and the postinst had it reload (it reads its hooks then)",
            "Reloaded libvirtd" in log and "Reload failed" not in log, short(log[-600:]))


def check_configure(c, ct, lab, shipped):
    for name in ("agent.crt", "agent.key"):
        shutil.copy(os.path.join(lab, name), ct.path(f"/etc/gpunode/tls/{name}"))
    shutil.copy(os.path.join(lab, "issuer.pub"), ct.path("/etc/gpunode/issuer.pub"))
    ct.sh("chown root:root /etc/gpunode/tls/agent.* /etc/gpunode/issuer.pub; chmod 0600 /etc/gpunode/tls/agent.key; "
          "chmod 0644 /etc/gpunode/tls/agent.crt /etc/gpunode/issuer.pub")
    # The README's steps: node.id and owner_org, the issuer; TLS files and key at their default paths.
    config = (shipped.replace('id: ""', "id: node-systemd-1", 1).replace('owner_org: ""', "owner_org: org-systemd", 1)
              .replace("issuer: https://central.example.invalid", "issuer: https://central.test", 1))
    set_config(ct, config)
    p = ct.sh("gpunode-agent check-config --files --config /etc/gpunode/agent.yaml", user="gpunode")
    print(f"#   as gpunode, key 0600 root:root: exit {p.returncode}: {short(p.stderr)}", flush=True)
    c.check("check-config --files as gpunode: the 0600 root:root key is refused (permission denied, naming gpunode)",
            p.returncode == 1 and "/etc/gpunode/tls/agent.key: permission denied: gpunode (uid" in p.stderr, p.stderr)
    ct.sh("chown root:gpunode /etc/gpunode/tls/agent.key; chmod 0640 /etc/gpunode/tls/agent.key")
    p = ct.sh("gpunode-agent check-config --files --config /etc/gpunode/agent.yaml", user="gpunode")
    print(f"#   as gpunode, key 0640 root:gpunode: exit {p.returncode}: {short(p.stdout + p.stderr)}", flush=True)
    c.eq("check-config --files as gpunode, key 0640 root:gpunode: exit 0", p.returncode, 0)
    return config


def check_running(c, ct):
    p = ct.sh(f"systemctl start {UNIT}", timeout=60)
    c.eq("systemctl start: exit 0 (Type=notify: READY=1 came)", p.returncode, 0)
    c.eq("the unit is active", wait_active(ct), "active")
    status = wait_libvirt(ct)
    print(f"#   gpunodectl --json status: {json.dumps(status)}", flush=True)
    c.eq("gpunodectl status as root: libvirt connected (qemu:///system, polkit by /etc/group)", status.get("libvirt"), "connected")
    p = ct.sh("curl -s --unix-socket /run/gpunode/admin.sock http://agent/metrics | grep '^gpunode_libvirt_connected'")
    c.eq("/metrics: gpunode_libvirt_connected 1", p.stdout.strip(), "gpunode_libvirt_connected 1")
    log = journal(ct)
    c.check("the journal has no polkit refusal", "polkit" not in log, short(log[-600:]))
    p = ct.sh("curl -sk https://127.0.0.1:8443/healthz")
    c.eq("HTTPS on api.listen: /healthz", p.stdout.strip(), '{"status":"ok"}')
    p = ct.sh("gpunodectl --json units")
    try:
        units = json.loads(p.stdout).get("units")
    except ValueError:
        units = None
    c.check(f"units from the container's own /sys under the sandbox: answered ({len(units or [])} units, no GPU here)",
            p.returncode == 0 and isinstance(units, list), short(p.stdout + p.stderr))
    ct.sh("useradd -m alice && usermod -aG gpunode-admin alice; useradd -m bob")
    p, s = status_json(ct, user="alice")
    c.check("the admin socket: alice (gpunode-admin) gets status", p.returncode == 0 and s.get("nodeId") == "node-systemd-1",
            short(p.stdout + p.stderr))
    p = ct.sh("gpunodectl status", user="bob")
    print(f"#   bob: exit {p.returncode}: {short(p.stderr, 200)}", flush=True)
    c.check("the admin socket: bob (no group) is refused, exit 3", p.returncode == 3, p.stderr)
    p = ct.sh(f"systemd-analyze security --no-pager {UNIT}")
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", p.stdout)
    exposure = float(m.group(1)) if m else 99.0
    c.check(f"systemd-analyze security of the live unit: {exposure} <= {MAX_EXPOSURE}", exposure <= MAX_EXPOSURE,
            p.stdout[-300:] + p.stderr)


def check_reload(c, ct, config):
    pid = main_pid(ct)
    set_config(ct, config.replace("level: info", "level: loud", 1))
    mark = cursor(ct)
    p = ct.sh(f"systemctl reload {UNIT}", timeout=120)
    print(f"#   reload of an invalid file: exit {p.returncode}: {short(p.stderr, 200)}", flush=True)
    c.check("systemctl reload, invalid file: fails", p.returncode != 0, p.stdout + p.stderr)
    log = journal(ct, mark)
    line = next((l for l in log.splitlines() if "reload refused" in l), "")
    print(f"#   journal: {short(line, 200)}", flush=True)
    c.check("... the journal names the problem (log.level) and the refusal", "reload refused" in log and "log.level" in log, log[-600:])
    c.check("... the agent runs on, same PID", ct.sh(f"systemctl is-active {UNIT}").stdout.strip() == "active"
            and main_pid(ct) == pid, (pid, main_pid(ct)))
    set_config(ct, config.replace("level: info", "level: debug", 1))
    p = ct.sh(f"systemctl reload {UNIT}", timeout=120)
    c.eq("systemctl reload, valid file: exit 0", p.returncode, 0)
    c.eq("... same PID", main_pid(ct), pid)
    p = ct.sh("gpunode-agent reload")
    c.check("gpunode-agent reload as root: exit 0, reloaded", p.returncode == 0 and "reloaded" in p.stdout, p.stdout + p.stderr)


def under_load(ct, command, timeout=600):
    """Runs `command` in the container while two loops there keep asking: GET /healthz over HTTPS
    (curl, a new connection each: answered 200 or not) and gpunodectl --json status over the admin
    socket (answered or not). Returns (command's exit, HTTPS answers, HTTPS failures, admin answers,
    admin failures)."""
    script = f"""rm -f /tmp/load.stop
( while [ ! -e /tmp/load.stop ]; do code=$(curl -sk --max-time 10 -o /dev/null -w '%{{http_code}}' https://127.0.0.1:8443/healthz); if [ "$code" = 200 ]; then echo ok; else echo "refused $code"; fi; done > /tmp/load.tcp ) &
( while [ ! -e /tmp/load.stop ]; do if gpunodectl --json status >/dev/null 2>/tmp/load.err; then echo ok; else echo failed; cat /tmp/load.err; fi; done > /tmp/load.admin ) &
sleep 1
{command}
rc=$?
sleep 1
touch /tmp/load.stop
wait
echo "rc=$rc tcp=$(grep -c '^ok' /tmp/load.tcp) refused=$(grep -c '^refused' /tmp/load.tcp) admin=$(grep -c '^ok' /tmp/load.admin) failed=$(grep -c '^failed' /tmp/load.admin)"
grep -v '^ok' /tmp/load.admin | head -3
"""
    p = ct.sh(script, timeout=timeout)
    m = re.search(r"rc=(\d+) tcp=(\d+) refused=(\d+) admin=(\d+) failed=(\d+)", p.stdout)
    print(f"#   under load: {short(p.stdout[-400:], 400)}", flush=True)
    return tuple(int(x) for x in m.groups()) if m else (-1, 0, -1, 0, -1)


def check_restart_to_fixture(c, ct, config):
    """discovery.host_root to the bind-mounted fixture host (a key that needs a restart): the reload
    names it, the restart takes it, and a reservation is made to follow across what comes next."""
    fixture = config.replace("host_root: /", "host_root: /srv/gpunode-host", 1)
    set_config(ct, fixture)
    p = ct.sh("gpunode-agent reload")
    c.check("reload with discovery.host_root changed: exit 0, names it as needing a restart",
            p.returncode == 0 and "discovery.host_root" in p.stderr, p.stdout + p.stderr)
    pid = main_pid(ct)
    rc, tcp, refused, admin, failed = under_load(ct, f"systemctl restart {UNIT}", timeout=60)
    c.check("systemctl restart: exit 0, a new PID, active", rc == 0 and wait_active(ct) == "active"
            and main_pid(ct) != pid, (rc, pid, main_pid(ct)))
    c.check(f"... through gpunode-agent.socket: nothing refused or unanswered ({tcp} HTTPS /healthz answers, "
            f"{admin} admin-socket status answers meanwhile)", tcp > 0 and admin > 0 and refused == 0 and failed == 0,
            (tcp, refused, admin, failed))
    return fixture, reserve(c, ct, "gpunodectl reserve on the fixture's unit: made", "systemd-test")


def reserve(c, ct, label, note):
    """A reservation of the fixture host's first reservable unit, made with gpunodectl: its id."""
    p = ct.sh(f"gpunodectl --json reserve --units {L.RESERVABLE[0]} --audience org-a --ends +30d --note {note}")
    try:
        rid = json.loads(p.stdout).get("id", "")
    except (ValueError, AttributeError):
        rid = ""
    c.check(label, rid.startswith("rsv_"), short(p.stdout + p.stderr))
    return rid


def has_reservation(ct, rid):
    p = ct.sh(f"gpunodectl --json reservation {rid}")
    try:
        return json.loads(p.stdout).get("id") == rid
    except ValueError:
        return False


def check_watchdog(c, ct):
    os.makedirs(ct.path(f"/etc/systemd/system/{UNIT}.d"), exist_ok=True)
    with open(ct.path(f"/etc/systemd/system/{UNIT}.d/watchdog.conf"), "w") as f:
        f.write("[Service]\nWatchdogSec=3s\nRestartSec=1s\n")
    ct.sh(f"systemctl daemon-reload && systemctl restart {UNIT}", timeout=60)
    wait_active(ct)
    restarts = ct.sh(f"systemctl show -P NRestarts {UNIT}").stdout.strip()
    pid = main_pid(ct)
    ct.sh(f"kill -STOP {pid}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if main_pid(ct) not in (pid, "0") and ct.sh(f"systemctl is-active {UNIT}").stdout.strip() == "active":
            break
        time.sleep(0.5)
    log = journal(ct)
    c.check("watchdog: a frozen agent is killed by systemd and restarted (new PID, NRestarts grew)",
            main_pid(ct) not in (pid, "0") and ct.sh(f"systemctl show -P NRestarts {UNIT}").stdout.strip() != restarts,
            (pid, main_pid(ct), restarts))
    c.check("... the journal says watchdog timeout", "Watchdog timeout" in ct.sh("journalctl --no-pager -o cat").stdout, log[-400:])
    os.remove(ct.path(f"/etc/systemd/system/{UNIT}.d/watchdog.conf"))
    ct.sh(f"systemctl daemon-reload && systemctl restart {UNIT}", timeout=60)
    wait_active(ct)


def explain(ct, since=None):
    """The unit's state and the journal's last lines, after a check about them failed."""
    p = ct.sh(f"systemctl status --no-pager -n 0 {UNIT} gpunode-agent.socket")
    print("# systemctl status:\n" + "\n".join(f"#   {l}" for l in p.stdout.splitlines()[-20:]), flush=True)
    p = ct.sh(f"journalctl --no-pager -o short-monotonic {'--after-cursor=' + repr(since) if since else ''} | tail -40")
    print("# journal:\n" + "\n".join(f"#   {l}" for l in p.stdout.splitlines()), flush=True)


def check_upgrade(c, ct, deb_name, fixture, rid):
    pid = main_pid(ct)
    mark = cursor(ct)
    rc, tcp, refused, admin, failed = under_load(ct, f"apt-get install -y --reinstall /mnt/pkg/{deb_name} >/dev/null 2>&1")
    c.eq("apt-get install --reinstall over the running agent: exit 0", rc, 0)
    c.check(f"... nothing refused or unanswered meanwhile ({tcp} HTTPS /healthz answers, {admin} admin-socket "
            f"status answers)",
            tcp > 0 and admin > 0 and refused == 0 and failed == 0, (tcp, refused, admin, failed))
    if not c.check("... the agent was restarted (new PID) and is active",
                   wait_active(ct) == "active" and main_pid(ct) != pid, (pid, main_pid(ct))):
        explain(ct, mark)
    with open(ct.path("/etc/gpunode/agent.yaml"), encoding="utf-8") as f:
        c.check("... the edited agent.yaml is kept (a conffile)", f.read() == fixture, "")
    c.check(f"... the reservation {rid} is kept", wait_for(lambda: has_reservation(ct, rid), 10), rid)
    c.eq("... libvirt connected again", wait_libvirt(ct).get("libvirt"), "connected")


def check_upgrade_after_start_limit(c, ct, deb_name, rid):
    """The unit's start limit (5 starts in 2 minutes) counts the operator's restarts too: restarted
    until systemd refuses a start, the agent is down and its socket unit failed with it. An upgrade
    (here a reinstall) must start it again all the same."""
    result = ""
    for _ in range(10):
        if ct.sh(f"systemctl restart {UNIT}", timeout=60).returncode != 0:
            result = ct.sh(f"systemctl show -P Result {UNIT}; systemctl is-active gpunode-agent.socket").stdout.split()
            break
    print(f"#   restarted until refused: {result}", flush=True)
    c.check("restarts until systemd refuses one: the unit's start limit hit, the socket unit failed with it",
            result == ["start-limit-hit", "failed"], result)
    p = ct.sh(f"apt-get install -y --reinstall /mnt/pkg/{deb_name}", timeout=600)
    c.eq("... apt-get install --reinstall then: exit 0", p.returncode, 0)
    active = ct.sh(f"systemctl is-active gpunode-agent.socket {UNIT}").stdout.split()
    if not c.check("... the postinst started the agent again, and its socket unit", active == ["active", "active"]
                   and wait_active(ct) == "active", active):
        explain(ct)
    c.check(f"... the reservation {rid} is kept", wait_for(lambda: has_reservation(ct, rid), 10), rid)


def check_upgrade_from_socketless(c, ct, src, deb_name, rid):
    """The handover from 0.1.0, whose unit had no socket unit (the agent bound the HTTPS port and the
    admin socket itself): 0.1.0's unit (tests/packaging/fixtures) runs the agent, then this package
    is installed over it. Its postinst must stop that agent before the socket unit can bind."""
    with open(os.path.join(src, "tests", "packaging", "fixtures", "gpunode-agent-0.1.0.service"), encoding="utf-8") as f:
        old_unit = f.read()
    ct.sh(f"systemctl stop {UNIT} gpunode-agent.socket", timeout=60)
    with open(ct.path(f"/etc/systemd/system/{UNIT}"), "w", encoding="utf-8") as f:
        f.write(old_unit)
    ct.sh(f"systemctl daemon-reload && systemctl start {UNIT}", timeout=60)
    pid = main_pid(ct)
    bound = ct.sh("curl -sk https://127.0.0.1:8443/healthz; systemctl is-active gpunode-agent.socket").stdout
    c.check("0.1.0's unit: the agent binds its own sockets, the socket unit is not active",
            wait_active(ct) == "active" and '{"status":"ok"}' in bound and "inactive" in bound, bound)
    os.remove(ct.path(f"/etc/systemd/system/{UNIT}"))  # what dpkg does: the new package's unit replaces it
    rc, tcp, refused, admin, failed = under_load(ct, f"apt-get install -y --reinstall /mnt/pkg/{deb_name} >/dev/null 2>&1")
    c.eq("apt-get install over 0.1.0's running agent: exit 0", rc, 0)
    active = ct.sh(f"systemctl is-active gpunode-agent.socket {UNIT}").stdout.split()
    c.check("... the socket unit holds the sockets and the agent runs (new PID) from them",
            active == ["active", "active"] and main_pid(ct) != pid
            and "(systemd's socket)" in ct.sh(f"journalctl -u {UNIT} -o cat | tail -40").stdout, (active, pid, main_pid(ct)))
    c.check(f"... answered meanwhile ({tcp} HTTPS, {admin} admin socket; a gap this once: {refused + failed} not)",
            tcp > 0 and admin > 0, (tcp, refused, admin, failed))
    c.check(f"... the reservation {rid} is kept", wait_for(lambda: has_reservation(ct, rid), 10), rid)
    # The shipped hook asks through the socket unit's admin socket (its owner gpunode, the agent's
    # user; its directory root's 0755): the hook trusts it and the agent decides.
    for name, unit, want in (("ct-free", "u-0000-81-00-0", 0), ("ct-reserved", L.RESERVABLE[0], 1)):
        with open(ct.path(f"/var/tmp/{name}.xml"), "w", encoding="utf-8") as f:
            f.write(H.domain_xml(name, ("org-x", "on-demand"), [H.GPU[unit][0]]))
        p = ct.sh(f"{HOOK} {name} prepare begin - < /var/tmp/{name}.xml")
        c.check(f"the shipped hook through the socket unit's admin socket: org-x on-demand on {unit}: exit {want}",
                p.returncode == want and (want == 0 or "reserved" in p.stderr), short(p.stdout + p.stderr))
    rc, tcp, refused, admin, failed = under_load(ct, f"systemctl restart {UNIT}", timeout=60)
    c.check("... and from then on a restart refuses nothing", rc == 0 and refused == 0 and failed == 0 and tcp > 0,
            (rc, tcp, refused, admin, failed))


def check_remove(c, ct, rid):
    p = ct.sh("apt-get remove -y gpunode-agent", timeout=300)
    c.eq("apt-get remove: exit 0", p.returncode, 0)
    c.eq("... the agent is stopped", ct.sh(f"systemctl is-active {UNIT}").stdout.strip(), "inactive")
    c.check("... state.db and agent.yaml are kept",
            os.path.exists(ct.path("/var/lib/gpunode/state.db")) and os.path.exists(ct.path("/etc/gpunode/agent.yaml")), "")
    p = ct.sh("apt-get purge -y gpunode-agent", timeout=300)
    c.eq("apt-get purge: exit 0", p.returncode, 0)
    c.check("... /var/lib/gpunode, agent.yaml and the hook are gone",
            not os.path.exists(ct.path("/var/lib/gpunode")) and not os.path.exists(ct.path("/etc/gpunode/agent.yaml"))
            and not os.path.exists(ct.path(HOOK)), os.listdir(ct.path("/etc/gpunode")) if os.path.isdir(ct.path("/etc/gpunode")) else "")
    c.check("... the operator's TLS files stay", os.path.exists(ct.path("/etc/gpunode/tls/agent.key")), "")
    c.eq("... libvirtd still runs", ct.sh("systemctl is-active libvirtd").stdout.strip(), "active")


def needed(deb):
    """The shared libraries (DT_NEEDED) of the package's binaries and modules."""
    with tempfile.TemporaryDirectory(prefix="gpunode-needed-") as d:
        run(["dpkg-deb", "-x", deb, d], check=True)
        files = glob.glob(os.path.join(d, "usr/bin/*")) + glob.glob(os.path.join(d, "usr/lib/gpunode-agent/*.so"))
        text = run(["readelf", "-d", "-W", *files]).stdout
    return set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^]]+)\]", text))


def mapped(ct, pid, sonames):
    """Which of `sonames` the container's process `pid` has mapped (a library's file is its soname
    or the soname and more of the version: libfmt.so.9.1.0 for libfmt.so.9)."""
    text = ct.sh(f"cat /proc/{pid}/maps").stdout
    files = {os.path.basename(l.split()[-1]) for l in text.splitlines() if ".so" in l.split()[-1]}
    return {so for so in sonames if any(f == so or f.startswith(so + ".") for f in files)}


def check_upgrade_from_release(c, ct, lab, shipped, old_name, old_needed, new_name, new_needed):
    """A Debian 13 host that ran the Debian 12 package (as `apt full-upgrade` leaves it: the 12
    package and its libraries kept), configured and running with a reservation; the 13 package is
    installed over it."""
    p = ct.sh(f"apt-get install -y --no-install-recommends /mnt/old/{old_name}", timeout=600)
    c.eq(f"the Debian 12 package on the Debian 13 host: apt-get install ./{old_name}: exit 0", p.returncode, 0)
    if p.returncode != 0:
        print(f"# apt: {p.stdout[-1500:]}{p.stderr[-1500:]}", flush=True)
    config = check_configure(c, ct, lab, shipped)
    fixture = config.replace("host_root: /", "host_root: /srv/gpunode-host", 1).replace("level: info", "level: debug", 1)
    set_config(ct, fixture)
    p = ct.sh(f"systemctl start {UNIT}", timeout=60)
    status = wait_libvirt(ct)
    c.check("the 12 package's agent runs on the 13 host: active, libvirt connected",
            p.returncode == 0 and wait_active(ct) == "active" and status.get("libvirt") == "connected", status)
    rid = reserve(c, ct, "... a reservation made by it", "from-debian-12")
    pid = main_pid(ct)
    only_old = sorted(old_needed - new_needed)
    before = mapped(ct, pid, only_old)
    c.check(f"... it maps the 12 package's own libraries ({' '.join(only_old)})", before == set(only_old), sorted(before))
    rc, tcp, refused, admin, failed = under_load(ct, f"apt-get install -y /mnt/pkg/{new_name} >/tmp/apt.out 2>&1")
    print("#   apt: " + " | ".join(l for l in ct.sh("cat /tmp/apt.out").stdout.splitlines()
                                   if l.startswith(("Unpacking", "Setting up", "Preparing")))[:600], flush=True)
    c.eq(f"apt-get install ./{new_name} over the running 12 agent: exit 0", rc, 0)
    version = ct.sh("dpkg-query -W -f='${Version}' gpunode-agent").stdout.strip()
    c.check(f"... gpunode-agent is now {version}", new_name.split("_")[1] == version, version)
    c.check(f"... nothing refused or unanswered meanwhile ({tcp} HTTPS /healthz answers, {admin} admin-socket "
            f"status answers)", tcp > 0 and admin > 0 and refused == 0 and failed == 0, (tcp, refused, admin, failed))
    after_pid = main_pid(ct)
    if not c.check("... the agent was restarted (new PID) and is active",
                   wait_active(ct) == "active" and after_pid != pid, (pid, after_pid)):
        explain(ct)
    only_new = sorted(new_needed - old_needed)
    c.check(f"... on this release's libraries: {' '.join(only_new)} mapped, none of the 12 package's",
            mapped(ct, after_pid, only_new) == set(only_new) and not mapped(ct, after_pid, only_old),
            (sorted(mapped(ct, after_pid, only_new)), sorted(mapped(ct, after_pid, only_old))))
    with open(ct.path("/etc/gpunode/agent.yaml"), encoding="utf-8") as f:
        c.check("... the edited agent.yaml is kept (a conffile)", f.read() == fixture, "")
    c.check(f"... the reservation {rid} is kept", wait_for(lambda: has_reservation(ct, rid), 10), rid)
    p = ct.sh("gpunodectl audit verify")
    c.check("... the audit chain the 12 agent wrote verifies (gpunodectl audit verify: whole)",
            p.returncode == 0 and "whole" in p.stdout, short(p.stdout + p.stderr))
    c.eq("... libvirt connected", wait_libvirt(ct).get("libvirt"), "connected")


class Hosts:
    """What a test's containers share: its checks, a scratch directory (the TLS files and the
    issuer's key in lab/, the demo fixture host in host/, bound at /srv/gpunode-host), the shipped
    agent.yaml, the cached root of `suite`; one container booted at a time."""

    def __init__(self, c, suite, root, src, scratch, t0):
        self.c, self.suite, self.root, self.scratch, self.t0 = c, suite, root, scratch, t0
        self.ct = None
        self.lab = os.path.join(scratch, "lab")
        os.makedirs(self.lab)
        lab = self.lab
        L.sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
              "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
              "-keyout", os.path.join(lab, "agent.key"), "-out", os.path.join(lab, "agent.crt")])
        L.sh(["openssl", "genpkey", "-algorithm", "ed25519", "-out", os.path.join(lab, "issuer.pem")])
        L.sh(["openssl", "pkey", "-in", os.path.join(lab, "issuer.pem"), "-pubout", "-out", os.path.join(lab, "issuer.pub")])
        self.host = os.path.join(scratch, "host")
        L.sh([sys.executable, os.path.join(L.FIXTURES, "mkhost.py"), L.DEMO_HOST, self.host])
        with open(os.path.join(src, "packaging", "agent.yaml"), encoding="utf-8") as f:
            self.shipped = f.read()

    def boot(self, name, binds):
        """A fresh container `name` of the root (the one before it closed), with `binds` and the
        fixture host."""
        self.close()
        c = self.c
        self.ct = ct = Container(self.root, os.path.join(self.scratch, name), [*binds, (self.host, "/srv/gpunode-host")])
        state = ct.boot()
        versions = ct.sh("systemctl --version | head -1; dpkg-query -W -f='libvirt-daemon-system ${Version} ' "
                         "libvirt-daemon-system; dpkg-query -W -f='polkitd ${Version}' polkitd").stdout
        print(f"# {name}: booted ({state}) in {time.monotonic() - self.t0:.0f} s: {' '.join(versions.split())}",
              flush=True)
        release = debroot.os_release(ct.dir)
        c.eq(f"the container is Debian {debroot.RELEASES[self.suite]} ({self.suite})", release.get("VERSION_CODENAME"),
             self.suite)
        p = ct.sh("systemctl list-unit-files --no-legend 'libvirtd*' 'virtqemud*' | sort; "
                  "ls -l /run/libvirt/*sock* 2>/dev/null; ls /etc/polkit-1/rules.d /usr/share/polkit-1/rules.d")
        print("#   libvirt and polkit here:\n#     " + "\n#     ".join(p.stdout.strip().splitlines()), flush=True)
        return ct

    def close(self):
        if self.ct is not None:
            self.ct.close()
            self.ct = None


def run_hosts(title, suite, deb, old_deb, src, body):
    """`body(hosts)` over the cached root of `suite` (cached_root's `deb` and `old_deb`); a step
    that breaks is a failed check that says where, with the unit's state and the journal. Returns
    the exit status."""
    c = L.Checks(title)
    t0 = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="gpunode-systemd-", dir="/var/tmp")
    hosts = None
    try:
        hosts = Hosts(c, suite, cached_root(suite, deb, old_deb), src, scratch, t0)
        body(hosts)
    except Exception as e:  # a broken step: say where, with what the container said
        c.check(f"the run got through: {type(e).__name__}: {short(str(e), 1500)}", False)
        if hosts is not None and hosts.ct is not None and hosts.ct.leader is not None:
            explain(hosts.ct)
    finally:
        if hosts is not None:
            hosts.close()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"# {time.monotonic() - t0:.0f} s in all", flush=True)
    return c.finish()


def the_package(directory, suite):
    """The one gpunode-agent_*.deb in `directory`, built for `suite` (its revision ends ~debNNuM)."""
    debs = sorted(glob.glob(os.path.join(directory, "gpunode-agent_*.deb")))
    if len(debs) != 1:
        raise debroot.Error(f"want one gpunode-agent_*.deb in {directory}, found {debs}")
    version = run(["dpkg-deb", "-f", debs[0], "Version"], check=True).stdout.strip()
    if not re.search(rf"~deb{debroot.RELEASES[suite]}u\d+$", version):
        raise debroot.Error(f"{debs[0]}: Version {version} is not a package for Debian {debroot.RELEASES[suite]} "
                            f"({suite}): want ~deb{debroot.RELEASES[suite]}uN")
    return debs[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("src")
    ap.add_argument("--release", choices=sorted(debroot.RELEASES))
    ap.add_argument("--upgrade-from", metavar="DIR")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: booting a container with systemd-nspawn needs root")
        return 77
    for tool in ("systemd-nspawn", "mmdebstrap", "nsenter"):
        if shutil.which(tool) is None:
            print(f"FAIL: {tool} is missing (scripts/install-deps.sh installs it)")
            return 1
    try:
        suite = args.release or debroot.host_release()
        if args.upgrade_from and suite == UPGRADE_FROM:
            raise debroot.Error(f"--upgrade-from: a {suite} host is upgraded to, not from")
        deb = the_package(args.out, suite)
        old_deb = the_package(args.upgrade_from, UPGRADE_FROM) if args.upgrade_from else None
    except debroot.Error as e:
        print(f"FAIL: {e}")
        return 1
    packages = [(os.path.dirname(os.path.abspath(deb)), "/mnt/pkg")]
    name = os.path.basename(deb)

    def body(h):
        c = h.c
        ct = h.boot("ct", packages)
        check_install(c, ct, name)
        config = check_configure(c, ct, h.lab, h.shipped)
        check_running(c, ct)
        check_reload(c, ct, config)
        fixture, rid = check_restart_to_fixture(c, ct, config.replace("level: info", "level: debug", 1))
        check_watchdog(c, ct)
        c.check(f"the reservation {rid} survived the watchdog's restart", has_reservation(ct, rid), rid)
        check_upgrade(c, ct, name, fixture, rid)
        check_upgrade_after_start_limit(c, ct, name, rid)
        check_upgrade_from_socketless(c, ct, args.src, name, rid)
        check_remove(c, ct, rid)
        if old_deb is not None:
            print(f"# the upgrade from the Debian {debroot.RELEASES[UPGRADE_FROM]} package on a fresh "
                  f"{suite} host", flush=True)
            ct = h.boot("ct-upgrade", [*packages, (os.path.dirname(os.path.abspath(old_deb)), "/mnt/old")])
            check_upgrade_from_release(c, ct, h.lab, h.shipped, os.path.basename(old_deb), needed(old_deb), name,
                                       needed(deb))
    return run_hosts(f"package.systemd ({suite})", suite, deb, old_deb, args.src, body)

if __name__ == "__main__":
    sys.exit(main())
