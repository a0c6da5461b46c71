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

The first three run where the package was built: on this machine for its own release, in the
other release's build root (scripts/packages.py) for the other, with systemd-nspawn and no network.
Prints each step's output, then a table of the steps with their result and time; exits 1 when one
failed, 77 when none failed but one skipped (a skip is a hole in the proof: make fails on it too).

Usage: test_packages.py SOURCE_DIR PACKAGES_DIR [--release SUITE ...] [--step NAME ...]
"""
import argparse
import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SRC, "scripts"))
sys.dont_write_bytecode = True
import debroot  # noqa: E402
import packages  # noqa: E402

STEPS = ("contents", "lintian", "install", "systemd")
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("packages")
    ap.add_argument("--release", action="append", choices=sorted(debroot.RELEASES))
    ap.add_argument("--step", action="append", choices=STEPS)
    args = ap.parse_args()
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
        if "systemd" in steps and "trixie" in suites and not glob.glob(os.path.join(out, UPGRADE_FROM, "*.deb")):
            raise debroot.Error(f"no {UPGRADE_FROM} package in {out}/{UPGRADE_FROM} for the upgrade on trixie: "
                                "run `make packages` first")
        if os.geteuid() != 0:
            raise debroot.Error("the packages are tested in Debian roots (mmdebstrap, systemd-nspawn): run as root")
    except debroot.Error as e:
        print(f"test-packages: {e}", file=sys.stderr)
        return 1
    for suite in suites:
        pkg = os.path.join(out, suite)
        root = None if suite == host else packages.cached_build_root(src, suite)
        for step in steps:
            t0 = time.monotonic()
            print(f"\n### {suite} {step}" + ("" if root is None else f" (in {os.path.basename(root)})"), flush=True)
            if step == "systemd":
                argv = [sys.executable, os.path.join(HERE, "systemd_test.py"), pkg, src, "--release", suite]
                if suite != UPGRADE_FROM:
                    argv += ["--upgrade-from", os.path.join(out, UPGRADE_FROM)]
                rc = run_step(argv)
            else:
                python = sys.executable if root is None else "python3"
                rc = run_step([python, os.path.join(HERE, "package_test.py"), step, pkg, src], root, src)
            results.append((suite, step, rc, time.monotonic() - t0))
    print("\n# test-packages:")
    for suite, step, rc, seconds in results:
        word = {0: "ok", 77: "SKIP"}.get(rc, f"FAIL (exit {rc})")
        print(f"#   {suite:<9} {step:<9} {word:<16} {seconds:6.0f} s")
    print(f"#   {time.monotonic() - t_all:.0f} s in all", flush=True)
    if any(rc not in (0, 77) for *_, rc, _ in results):
        return 1
    if any(rc == 77 for *_, rc, _ in results):
        print("#" * 70 + "\n# WARNING: test-packages SKIPPED steps: the packages are not proven\n" + "#" * 70)
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
