#!/usr/bin/env python3
"""make packages: the Debian package for each release it is built for (CONTRACT §14), each built in
that release, with its compiler and its libraries:

  build/packages/bookworm/   gpunode-agent_V-1~deb12u1_ARCH.deb (+ the -dbgsym .ddeb)
  build/packages/trixie/     gpunode-agent_V-1~deb13u1_ARCH.deb (+ the -dbgsym .ddeb)

This machine's release comes from its own build (BUILD, the release preset `make build` made);
each other release from a build in that release's build root: a cached mmdebstrap root (see
scripts/debroot.py) whose build dependencies `scripts/install-deps.sh package` installed when the
root was made, run with systemd-nspawn without network, the source tree read-only and the
release's build tree writable (the release preset's settings, the tests not built). That tree is
kept beside the build root, in $GPUNODE_TEST_CACHE/out-SUITE-KEY (KEY: the source tree's path), not
under build/: every build/NAME/gpunode-agent runs on this machine, and a Debian 13 binary does not
(it needs glibc 2.38). `Depends` is what
dpkg-shlibdeps finds in each release.

Usage: packages.py SOURCE_DIR BUILD_DIR OUT_DIR [--jobs N] [--revision N] [--release SUITE ...] [--roots-only]
  --revision N   the packages' revision is N~debNNu1 (default 1; the repository test builds 2)
  --release      only these releases (default: all)
  --roots-only   only make (or find) the build roots of the releases not this machine's, and stop:
                 .ci/run has them made while `make test` runs
Needs root (mmdebstrap, systemd-nspawn), and the network the first time a build root is made.
"""
import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
import debroot  # noqa: E402

BUILD_ROOT_FORMAT = "1"  # bump when the way the build root is made changes


def say(text):
    print(text, flush=True)


def step(argv, what, **kw):
    """Runs argv with its output shown; an Error naming `what` if it fails."""
    say("+ " + " ".join(argv))
    p = subprocess.run(argv, **kw)
    if p.returncode != 0:
        raise debroot.Error(f"{what}: exit {p.returncode}")


def revision(serial, suite):
    return f"{serial}~deb{debroot.RELEASES[suite]}u1"


def cached_build_root(src, suite):
    """The build root of `suite`: Debian's apt variant, then `scripts/install-deps.sh package` run in
    it (with the network, while mmdebstrap makes it)."""
    with open(os.path.join(src, "scripts", "install-deps.sh"), "rb") as f:
        deps = f.read()
    hooks = ['cp "$GPUNODE_ROOT_INPUTS/install-deps.sh" "$1/tmp/install-deps.sh"',
             'chroot "$1" bash /tmp/install-deps.sh package',
             'rm -f "$1/tmp/install-deps.sh"; chroot "$1" apt-get clean']
    return debroot.cached_root("build", suite, [], hooks=hooks, inputs=[("install-deps.sh", deps)],
                               fmt=BUILD_ROOT_FORMAT, log=say)


def package_native(build, out, rev):
    """cpack over this machine's release build with the revision set in its cache, then unset again
    (`make test`'s package is the default's, which is --revision 1's)."""
    def set_revision(value):
        step(["cmake", f"-DGPUNODE_PACKAGE_REVISION={value}", build], "cmake (the revision)", stdout=subprocess.DEVNULL)
        step(["cmake", "--build", build, "--target", "gpunode_package_docs"], "the package's generated files",
             stdout=subprocess.DEVNULL)
    set_revision(rev)
    try:
        step(["cpack", "-G", "DEB", "--config", os.path.join(build, "CPackConfig.cmake"), "-B", out], "cpack")
    finally:
        set_revision("")


def release_build_dir(src, suite):
    """`suite`'s build tree for the source tree `src`, kept between runs (a revision bump is a cpack,
    not a build). One per source tree, named by its path (written in SOURCE inside); the trees of
    source trees that are gone are removed here, so they do not pile up."""
    src = os.path.realpath(src)
    shutil.rmtree(os.path.join(src, "build", suite), ignore_errors=True)  # where make packages kept it before 0.4.0
    for old in glob.glob(os.path.join(debroot.CACHE, f"out-{suite}-*")):
        try:
            with open(os.path.join(old, "SOURCE"), encoding="utf-8") as f:
                gone = not os.path.isfile(os.path.join(f.read(), "CMakeLists.txt"))
        except OSError:
            gone = True
        if gone:
            shutil.rmtree(old, ignore_errors=True)
    build = os.path.join(debroot.CACHE, f"out-{suite}-{hashlib.sha256(src.encode()).hexdigest()[:16]}")
    os.makedirs(build, exist_ok=True)
    with open(os.path.join(build, "SOURCE"), "w", encoding="utf-8") as f:
        f.write(src)
    return build


def package_in_root(src, suite, out, rev, jobs):
    """The release preset's package targets built in `suite`'s build root, then cpack there."""
    root = cached_build_root(src, suite)
    build = release_build_dir(src, suite)
    inner_out = os.path.join(build, "deb")
    script = f"""set -e
. /etc/os-release; echo "# in $PRETTY_NAME: $(gcc --version | head -1), $(cmake --version | head -1)"
cmake --preset release -B {build} -DBUILD_TESTING=OFF -DGPUNODE_PACKAGE_REVISION={rev} >/dev/null
cmake --build {build} -j {jobs}
rm -rf {inner_out}
cpack -G DEB --config {build}/CPackConfig.cmake -B {inner_out}
rm -rf {inner_out}/_CPack_Packages
"""
    t0 = time.monotonic()
    p = debroot.nspawn(root, ["/bin/sh", "-c", script], binds=[(build, build)], ro_binds=[(src, src)], chdir=src,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"},
                       capture_output=False)
    if p.returncode != 0:
        raise debroot.Error(f"the {suite} build in {root} failed (exit {p.returncode}): its output is above")
    for f in glob.glob(os.path.join(inner_out, "*.deb")) + glob.glob(os.path.join(inner_out, "*.ddeb")):
        shutil.copy2(f, out)
    say(f"# {suite}: built in its build root in {time.monotonic() - t0:.0f} s")


def describe(out, suite, rev):
    debs = sorted(glob.glob(os.path.join(out, "gpunode-agent_*.deb")))
    if len(debs) != 1:
        raise debroot.Error(f"{out}: want one gpunode-agent_*.deb, found {[os.path.basename(d) for d in debs]}")
    fields = {}
    for name in ("Version", "Depends"):
        fields[name] = subprocess.run(["dpkg-deb", "-f", debs[0], name], capture_output=True, text=True,
                                      check=True).stdout.strip()
    if not fields["Version"].endswith("-" + rev):
        raise debroot.Error(f"{debs[0]}: Version {fields['Version']}, want the revision {rev}")
    say(f"# {suite}: {os.path.relpath(debs[0])}\n#   Version: {fields['Version']}\n#   Depends: {fields['Depends']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source")
    ap.add_argument("build")
    ap.add_argument("out")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--revision", type=int, default=1)
    ap.add_argument("--release", action="append", choices=sorted(debroot.RELEASES))
    ap.add_argument("--roots-only", action="store_true")
    args = ap.parse_args()
    src, build, out = (os.path.abspath(p) for p in (args.source, args.build, args.out))
    try:
        host = debroot.host_release()
        if args.roots_only:
            for suite in args.release or list(debroot.RELEASES):
                if suite != host:
                    cached_build_root(src, suite)
            return 0
        for suite in args.release or list(debroot.RELEASES):
            t0 = time.monotonic()
            rev = revision(args.revision, suite)
            dest = os.path.join(out, suite)
            shutil.rmtree(dest, ignore_errors=True)
            os.makedirs(dest)
            if suite == host:
                package_native(build, dest, rev)
            else:
                if os.geteuid() != 0:
                    raise debroot.Error(f"the {suite} package is built in a {suite} root (mmdebstrap, systemd-nspawn): "
                                        "run as root")
                package_in_root(src, suite, dest, rev, args.jobs)
            shutil.rmtree(os.path.join(dest, "_CPack_Packages"), ignore_errors=True)
            describe(dest, suite, rev)
            say(f"# {suite}: {time.monotonic() - t0:.0f} s")
    except (debroot.Error, subprocess.TimeoutExpired) as e:
        print(f"packages: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
