#!/usr/bin/env python3
"""The signed apt repository, as a fleet uses it (issue 41, CONTRACT §14 "A repository, as fleets
install"), on a booted host of each release (the root systemd_test.py boots, a container of its
own).

The repositories are bind-mounted read-only under /srv/gpunode-repo/ and served as `file:` (the
container has no network): /srv/gpunode-repo-current, a link the test points at each in turn, is
what the host's apt source names, so that a newer repository is published at the same place, as
on a real server:

  1        what `make repo` made (REPO_DIR)
  2        a newer one, from the same sources with the revision bumped (2~debNNu1), signed by the
           same key (NEWER_DIR: test_packages.py builds it with scripts/packages.py --revision 2 and
           scripts/repo.py)
  altered  a copy of 2 as a tampering mirror would serve it: its Packages index offering version
           3~debNNu1 and InRelease altered to match (the indices' sizes and hashes), the signature
           left as it was

Checked and printed, as the README's install section says a host does it:

  source     the keyring taken from the repository (gpunode-archive-keyring.gpg) into
             /etc/apt/keyrings, the source added with signed-by= naming the host's own release
             (VERSION_CODENAME); Debian's own sources set aside (no network here)
  update     apt-get update verifies the signature: exit 0, no warning
  policy     apt-cache policy gpunode-agent: the candidate is this release's package, from the
             repository
  install    apt-get install gpunode-agent: that version installed; configured as the README says,
             the agent starts (active, /healthz, libvirt connected on qemu:///system), a reservation
  upgrade    the newer repository: apt-get update, the candidate is the newer version, apt-get
             upgrade takes it while HTTPS and admin-socket callers keep asking: none refused, the
             agent restarted (new PID) on its sockets, the edited agent.yaml, the reservation and the
             audit chain kept, libvirt connected
  altered    apt-get update refuses the altered InRelease (Err: the signature fails; "The repository
             is not updated": apt 2.6 and 3.0 both warn and exit 0) and keeps what it had verified:
             the candidate is still the newer version, not the tampered one

Usage: repo_test.py PACKAGE_DIR REPO_DIR NEWER_DIR SOURCE_DIR --release SUITE [--upgrade-from DIR]
  PACKAGE_DIR and --upgrade-from as systemd_test.py takes them (they name the root to boot)
"""
import argparse
import glob
import gzip
import hashlib
import lzma
import os
import re
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import systemd_test as S  # noqa: E402
from systemd_test import UNIT, debroot, short  # noqa: E402

MOUNT = "/srv/gpunode-repo"
KEYRING = "gpunode-archive-keyring.gpg"
SOURCE = "/etc/apt/sources.list.d/gpunode.list"


def alter(repo, dest, suite, version, tampered):
    """A copy of `repo` as a tampering mirror would serve it: SUITE's Packages index offering
    `tampered` in place of `version` (the same .deb), and InRelease altered to match it (the
    indices' sizes and hashes), its signature left as it was. Were apt to take it, the candidate
    would become `tampered`."""
    shutil.copytree(repo, dest, symlinks=True)
    dist = os.path.join(dest, "dists", suite)
    indices = {}
    for path in glob.glob(os.path.join(dist, "main", "binary-*", "Packages")):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if f"\nVersion: {version}\n" not in text:
            raise debroot.Error(f"{path}: no Version: {version} to tamper with")
        data = text.replace(f"\nVersion: {version}\n", f"\nVersion: {tampered}\n").encode()
        for name, blob in (("", data), (".gz", gzip.compress(data, mtime=0)), (".xz", lzma.compress(data))):
            with open(path + name, "wb") as f:
                f.write(blob)
            indices[os.path.relpath(path + name, dist)] = blob
    path = os.path.join(dist, "InRelease")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for name, blob in indices.items():
        for algo in ("md5", "sha1", "sha256"):
            digest = hashlib.new(algo, blob).hexdigest()
            text, n = re.subn(rf"^ [0-9a-f]{{{len(digest)}}} +\d+ {re.escape(name)}$", f" {digest} {len(blob)} {name}",
                              text, flags=re.M)
            if n != 1:
                raise debroot.Error(f"{path}: no {algo} line of {name} to alter")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def point(ct, name):
    """/srv/gpunode-repo/current -> NAME (the repository the host's source names)."""
    p = ct.sh(f"ln -sfn {MOUNT}/{name} {MOUNT}-current.new && mv -T {MOUNT}-current.new {MOUNT}-current")
    if p.returncode != 0:
        raise debroot.Error(f"pointing the source at {name}: {p.stderr}")


def policy(ct):
    p = ct.sh("apt-cache policy gpunode-agent")
    m = re.search(r"Candidate: (\S+)", p.stdout)
    return p.stdout.rstrip(), m.group(1) if m else None


def apt_update(ct):
    p = ct.sh("apt-get update 2>&1", timeout=300)
    return p.returncode, p.stdout.rstrip()


def check_source(c, ct, suite):
    # No network in the container: Debian's own sources would only fail; set them aside.
    ct.sh("mkdir -p /root/debian-sources && for f in /etc/apt/sources.list /etc/apt/sources.list.d/*; do "
          "[ ! -e \"$f\" ] || mv \"$f\" /root/debian-sources/; done")
    # The README's two lines, the keyring from the repository (served here as a file).
    script = (f"install -D -m 0644 {MOUNT}-current/{KEYRING} /etc/apt/keyrings/{KEYRING} && "
              f"echo \"deb [signed-by=/etc/apt/keyrings/{KEYRING}] file:{MOUNT}-current "
              f"$(. /etc/os-release && echo \"$VERSION_CODENAME\") main\" > {SOURCE} && cat {SOURCE}")
    p = ct.sh(script)
    print(f"#   {SOURCE}: {p.stdout.strip()}", flush=True)
    c.check(f"the source added as the README says: signed-by=, this host's release ({suite})",
            p.returncode == 0 and f"signed-by=/etc/apt/keyrings/{KEYRING}] file:{MOUNT}-current {suite} main"
            in p.stdout, short(p.stdout + p.stderr))


def check_install(c, ct, suite, want, lab, shipped):
    rc, out = apt_update(ct)
    print("#   apt-get update:\n" + "\n".join(f"#     {l}" for l in out.splitlines()), flush=True)
    c.check("apt-get update verifies the repository's signature: exit 0, no warning or error",
            rc == 0 and not re.search(r"^(W|E|Err):", out, re.M), out[-800:])
    text, candidate = policy(ct)
    print("#   apt-cache policy gpunode-agent:\n" + "\n".join(f"#     {l}" for l in text.splitlines()), flush=True)
    c.check(f"the candidate is this release's package {want}, from the repository",
            candidate == want and f"file:{MOUNT}-current {suite}/main" in text, text)
    p = ct.sh("apt-get install -y gpunode-agent 2>&1", timeout=600)
    c.eq("apt-get install gpunode-agent: exit 0", p.returncode, 0)
    c.eq("... installed: the candidate", ct.sh("dpkg-query -W -f='${Version}' gpunode-agent").stdout.strip(), want)
    config = S.check_configure(c, ct, lab, shipped)
    fixture = config.replace("host_root: /", "host_root: /srv/gpunode-host", 1)
    S.set_config(ct, fixture)
    p = ct.sh(f"systemctl start {UNIT}", timeout=60)
    status = S.wait_libvirt(ct)
    healthz = ct.sh("curl -sk https://127.0.0.1:8443/healthz").stdout.strip()
    c.check("the agent starts: active, /healthz answers, libvirt connected on qemu:///system",
            p.returncode == 0 and S.wait_active(ct) == "active" and healthz == '{"status":"ok"}'
            and status.get("libvirt") == "connected", (p.returncode, healthz, status))
    return fixture, S.reserve(c, ct, "... a reservation made", "from-the-repo")


def check_upgrade(c, ct, newer, fixture, rid):
    point(ct, "2")
    rc, out = apt_update(ct)
    c.check("the newer repository at the same place: apt-get update verifies it, exit 0",
            rc == 0 and not re.search(r"^(W|E|Err):", out, re.M), out[-800:])
    text, candidate = policy(ct)
    print("#   apt-cache policy gpunode-agent:\n" + "\n".join(f"#     {l}" for l in text.splitlines()), flush=True)
    c.eq("... the candidate is the newer version", candidate, newer)
    pid = S.main_pid(ct)
    rc, tcp, refused, admin, failed = S.under_load(ct, "apt-get upgrade -y >/tmp/upgrade.out 2>&1")
    out = ct.sh("cat /tmp/upgrade.out").stdout
    print("#   apt-get upgrade -y:\n" + "\n".join(f"#     {l}" for l in out.splitlines()
                                                if not l.startswith(("(Reading", "Reading", "Building"))), flush=True)
    c.check("apt-get upgrade takes it: exit 0, gpunode-agent upgraded",
            rc == 0 and re.search(r"The following packages will be upgraded:\s+gpunode-agent", out), out[-800:])
    c.eq("... installed: the newer version", ct.sh("dpkg-query -W -f='${Version}' gpunode-agent").stdout.strip(), newer)
    c.check(f"... nothing refused or unanswered meanwhile ({tcp} HTTPS /healthz answers, {admin} admin-socket "
            f"status answers)", tcp > 0 and admin > 0 and refused == 0 and failed == 0, (tcp, refused, admin, failed))
    after = S.main_pid(ct)
    active = ct.sh(f"systemctl is-active gpunode-agent.socket {UNIT}").stdout.split()
    if not c.check("... the agent restarted (new PID) on its sockets (gpunode-agent.socket active throughout)",
                   active == ["active", "active"] and after not in (pid, "0")
                   and "(systemd's socket)" in ct.sh(f"journalctl -u {UNIT} -o cat | tail -40").stdout,
                   (active, pid, after)):
        S.explain(ct)
    with open(ct.path("/etc/gpunode/agent.yaml"), encoding="utf-8") as f:
        c.check("... the edited agent.yaml is kept (a conffile)", f.read() == fixture, "")
    c.check(f"... the reservation {rid} is kept", S.wait_for(lambda: S.has_reservation(ct, rid), 10), rid)
    p = ct.sh("gpunodectl audit verify")
    c.check("... the audit chain verifies (gpunodectl audit verify: whole)", p.returncode == 0 and "whole" in p.stdout,
            short(p.stdout + p.stderr))
    c.eq("... libvirt connected", S.wait_libvirt(ct).get("libvirt"), "connected")


def check_altered(c, ct, newer, tampered):
    point(ct, "altered")
    rc, out = apt_update(ct)
    print(f"#   apt-get update, InRelease altered to list a tampered index (offering {tampered}), exit {rc}:\n"
          + "\n".join(f"#     {l}" for l in out.splitlines()), flush=True)
    c.check("apt-get update refuses the altered InRelease: its signature fails (Err), the repository not updated",
            re.search(r"^Err:\S* file:\S+ \S+ InRelease\n\s+.*(BADSIG|signatures were invalid|manipulated)", out, re.M)
            and "The repository is not updated" in out, out[-800:])
    _, candidate = policy(ct)
    c.eq(f"... apt keeps what it had verified: the candidate is still {newer}, not the tampered {tampered}",
         candidate, newer)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("repo")
    ap.add_argument("newer")
    ap.add_argument("src")
    ap.add_argument("--release", required=True, choices=sorted(debroot.RELEASES))
    ap.add_argument("--upgrade-from", metavar="DIR")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: booting a container with systemd-nspawn needs root")
        return 77
    suite = args.release
    try:
        deb = S.the_package(args.out, suite)
        old_deb = S.the_package(args.upgrade_from, S.UPGRADE_FROM) if args.upgrade_from else None
        for repo in (args.repo, args.newer):
            if not os.path.exists(os.path.join(repo, "dists", suite, "InRelease")):
                raise debroot.Error(f"no {repo}/dists/{suite}/InRelease (make repo makes it)")
    except debroot.Error as e:
        print(f"FAIL: {e}")
        return 1
    want = S.run(["dpkg-deb", "-f", deb, "Version"], check=True).stdout.strip()
    newer = want.replace("-1~", "-2~", 1)
    tampered = want.replace("-1~", "-3~", 1)

    def body(h):
        altered = os.path.join(h.scratch, "altered")
        alter(args.newer, altered, suite, newer, tampered)
        ct = h.boot("ct-repo", [(os.path.abspath(args.repo), f"{MOUNT}/1"), (os.path.abspath(args.newer), f"{MOUNT}/2"),
                                (altered, f"{MOUNT}/altered")])
        point(ct, "1")
        check_source(h.c, ct, suite)
        fixture, rid = check_install(h.c, ct, suite, want, h.lab, h.shipped)
        check_upgrade(h.c, ct, newer, fixture, rid)
        check_altered(h.c, ct, newer, tampered)
    return S.run_hosts(f"package.repo ({suite})", suite, deb, old_deb, args.src, body)

if __name__ == "__main__":
    sys.exit(main())
