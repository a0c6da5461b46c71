#!/usr/bin/env python3
"""make test-packages: each release's package (what `make packages` left in build/packages/SUITE)
proven on its own release (CONTRACT §14):

  SUITE contents   package_test.py contents: paths, modes and owners against packaging/manifest.txt,
                   the control fields (Version V-1~debNNu1, Depends as that release's
                   dpkg-shlibdeps named them), stripped binaries, the dbgsym package, man pages...
  SUITE lintian    package_test.py lintian: that release's lintian, no error, every warning explained
  SUITE install    package_test.py install: the maintainer scripts in a scratch root, the packaged
                   agent serving gpunodectl
  SUITE systemd    systemd_test.py --release SUITE: booted on that release under its systemd with its
                   libvirtd and polkit; on trixie also the upgrade from the bookworm package
  SUITE repo       repo_test.py --release SUITE: the signed repository `make repo` made, added as
                   the README says, apt-get install from it, apt-get upgrade to a newer one, an
                   altered one refused

Before the first repo step, once: `repo newer` builds the newer packages (the same sources, the
revision 2~debNNu1: scripts/packages.py --revision 2) and their repository, signed by the same key
(scripts/repo.py, --key or the key made for the purpose in --key-home, as `make repo` took it);
`repo again` makes the repository again from build/packages and compares it with REPO_DIR: the same
pool and indices (only Release's Date and the signatures differ).

The first three run where the package was built: on this machine for its own release, in the
other release's build root (scripts/packages.py) for the other, with systemd-nspawn and no network.
Prints each step's output, then a table of the steps with their result and time; exits 1 when one
failed, 77 when none failed but one skipped (a skip is a hole in the proof: make fails on it too).

Usage: test_packages.py SOURCE_DIR PACKAGES_DIR [--release SUITE ...] [--step NAME ...]
         [--repo REPO_DIR] [--build BUILD_DIR] [--key NAME] [--key-home DIR] [--jobs N]
"""
import argparse
import filecmp
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "scripts"))
sys.dont_write_bytecode = True
import debroot  # noqa: E402
import packages  # noqa: E402

STEPS = ("contents", "lintian", "install", "systemd", "repo")
UPGRADE_FROM = "bookworm"


def run_step(argv, root=None, src=None):
    """argv here, or in `root` (the source tree read-only at its own path); output shown as it
    comes. Returns the exit status."""
    print("+ " + " ".join(argv), flush=True)
    if root is None:
        return subprocess.run(argv).returncode
    p = debroot.nspawn(root, argv, ro_binds=[(src, src)], chdir=src, capture_output=False,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"})
    return p.returncode


def repo_files(repo):
    return sorted(os.path.relpath(p, repo) for p in glob.glob(os.path.join(repo, "**"), recursive=True)
                  if os.path.isfile(p))


def same_repository(a, b):
    """What differs between two repositories made from the same packages, besides the signatures
    and Release's Date (empty when nothing does)."""
    files = repo_files(a)
    if files != repo_files(b):
        return [f"the files differ: {sorted(set(files) ^ set(repo_files(b)))}"]
    differ = []
    for name in files:
        if name.endswith(("InRelease", "Release.gpg")):
            continue
        if name.endswith("Release") and name.count("/") == 2:  # dists/SUITE/Release: all but Date
            with open(os.path.join(a, name), encoding="utf-8") as fa, open(os.path.join(b, name), encoding="utf-8") as fb:
                if re.sub(r"^Date: .*\n", "", fa.read(), flags=re.M) != re.sub(r"^Date: .*\n", "", fb.read(), flags=re.M):
                    differ.append(name)
        elif not filecmp.cmp(os.path.join(a, name), os.path.join(b, name), shallow=False):
            differ.append(name)
    return differ


def key_args(args):
    return ["--key", args.key] if args.key else ["--key-home", args.key_home]


def newer_repository(args, src, scratch, suites):
    """The newer packages (revision 2) and their repository, signed as REPO_DIR was; its path, or
    None (what failed was printed)."""
    packages = os.path.join(scratch, "packages-2")
    rc = run_step([sys.executable, os.path.join(SRC, "scripts", "packages.py"), src, args.build, packages,
                     "--revision", "2", "--jobs", str(args.jobs), *[f"--release={s}" for s in suites]])
    newer = os.path.join(scratch, "repo-2")
    if rc == 0:
        rc = run_step([sys.executable, os.path.join(SRC, "scripts", "repo.py"), packages, newer, *key_args(args),
                         *[f"--release={s}" for s in suites]])
    if rc != 0:
        return None
    keyring = "gpunode-archive-keyring.gpg"
    if not filecmp.cmp(os.path.join(args.repo, keyring), os.path.join(newer, keyring), shallow=False):
        print(f"test-packages: {args.repo} and the newer repository are signed by different keys: run "
              "`make test-packages` with the REPO_KEY `make repo` had", flush=True)
        return None
    return newer


def host_builds_run(src):
    """0 when every build/NAME/gpunode-agent runs `version` on this machine: what `make packages` built
    for another release (a Debian 13 binary needs glibc 2.38) must not stand where a build of this
    machine's does (scripts/packages.py keeps it beside its build root)."""
    agents = sorted(glob.glob(os.path.join(src, "build", "*", "gpunode-agent")))
    if not agents:
        print("FAIL no build/NAME/gpunode-agent: the release build make packages uses is missing", flush=True)
        return 1
    rc = 0
    for agent in agents:
        p = subprocess.run([agent, "version"], capture_output=True, text=True, timeout=60)
        print(f"{'ok  ' if p.returncode == 0 else 'FAIL'} {os.path.relpath(agent, src)} version: exit {p.returncode}"
              f"{'' if p.returncode == 0 else ': ' + p.stderr.strip()[-300:]}", flush=True)
        rc |= 0 if p.returncode == 0 else 1
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("packages")
    ap.add_argument("--release", action="append", choices=sorted(debroot.RELEASES))
    ap.add_argument("--step", action="append", choices=STEPS)
    ap.add_argument("--repo", default="build/repo")
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--key", default=os.environ.get("REPO_KEY", ""))
    ap.add_argument("--key-home", default="repo-key")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    args.repo, args.build, args.key_home = (os.path.abspath(p) for p in (args.repo, args.build, args.key_home))
    src, out = os.path.abspath(args.source), os.path.abspath(args.packages)
    suites = args.release or list(debroot.RELEASES)
    steps = args.step or list(STEPS)
    results = []
    t_all = time.monotonic()
    try:
        host = debroot.host_release()
        for suite in suites:
            pkg = os.path.join(out, suite)
            if not glob.glob(os.path.join(pkg, "gpunode-agent_*.deb")):
                raise debroot.Error(f"no gpunode-agent_*.deb in {pkg}: run `make packages` first")
        if {"systemd", "repo"} & set(steps) and "trixie" in suites and not glob.glob(os.path.join(out, UPGRADE_FROM, "*.deb")):
            raise debroot.Error(f"no {UPGRADE_FROM} package in {out}/{UPGRADE_FROM} for the upgrade on trixie: "
                                "run `make packages` first")
        if "repo" in steps:
            for suite in suites:
                if not os.path.exists(os.path.join(args.repo, "dists", suite, "InRelease")):
                    raise debroot.Error(f"no {args.repo}/dists/{suite}/InRelease: run `make repo` first")
        if os.geteuid() != 0:
            raise debroot.Error("the packages are tested in Debian roots (mmdebstrap, systemd-nspawn): run as root")
    except debroot.Error as e:
        print(f"test-packages: {e}", file=sys.stderr)
        return 1
    scratch = tempfile.mkdtemp(prefix="gpunode-test-packages-", dir="/var/tmp")
    newer = None
    if "repo" in steps:
        t0 = time.monotonic()
        print("\n### repo newer: the same sources, revision 2, and their repository", flush=True)
        newer = newer_repository(args, src, scratch, suites)
        results.append(("all", "repo newer", 0 if newer else 1, time.monotonic() - t0))
        t0 = time.monotonic()
        print(f"\n### repo again: {args.repo} made again from {out}", flush=True)
        again = os.path.join(scratch, "repo-again")
        rc = run_step([sys.executable, os.path.join(SRC, "scripts", "repo.py"), out, again, *key_args(args),
                         *[f"--release={s}" for s in suites]])
        differ = same_repository(args.repo, again) if rc == 0 else ["not made"]
        print(f"# the same pool and indices as {args.repo}: {'yes' if not differ else 'no: ' + ', '.join(differ)}",
              flush=True)
        results.append(("all", "repo again", 1 if differ else 0, time.monotonic() - t0))
    for suite in suites:
        pkg = os.path.join(out, suite)
        root = None if suite == host else packages.cached_build_root(src, suite)
        for step in steps:
            t0 = time.monotonic()
            print(f"\n### {suite} {step}" + ("" if root is None else f" (in {os.path.basename(root)})"), flush=True)
            upgrade = [] if suite == UPGRADE_FROM else ["--upgrade-from", os.path.join(out, UPGRADE_FROM)]
            if step == "systemd":
                rc = run_step([sys.executable, os.path.join(HERE, "systemd_test.py"), pkg, src, "--release", suite,
                               *upgrade])
            elif step == "repo":
                rc = 1 if newer is None else run_step([sys.executable, os.path.join(HERE, "repo_test.py"), pkg,
                                                       args.repo, newer, src, "--release", suite, *upgrade])
            else:
                python = sys.executable if root is None else "python3"
                rc = run_step([python, os.path.join(HERE, "package_test.py"), step, pkg, src], root, src)
            results.append((suite, step, rc, time.monotonic() - t0))
    shutil.rmtree(scratch, ignore_errors=True)
    t0 = time.monotonic()
    print("\n### all host builds: every build/NAME/gpunode-agent runs here", flush=True)
    results.append(("all", "host builds", host_builds_run(src), time.monotonic() - t0))
    print("\n# test-packages:")
    for suite, step, rc, seconds in results:
        word = {0: "ok", 77: "SKIP"}.get(rc, f"FAIL (exit {rc})")
        print(f"#   {suite:<9} {step:<11} {word:<16} {seconds:6.0f} s")
    print(f"#   {time.monotonic() - t_all:.0f} s in all", flush=True)
    if any(rc not in (0, 77) for *_, rc, _ in results):
        return 1
    if any(rc == 77 for *_, rc, _ in results):
        print("#" * 70 + "\n# WARNING: test-packages SKIPPED steps: the packages are not proven\n" + "#" * 70)
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
