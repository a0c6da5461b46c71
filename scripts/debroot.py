"""Debian roots for the releases the package is built for (CONTRACT §14): cached mmdebstrap roots and
commands run in them with systemd-nspawn. Used by `make packages` (scripts/packages.py: the build
root of a release other than this machine's) and by the package's tests (tests/packaging: the
booted roots of systemd_test.py, lintian in each release's own build root).

A root is made once from this machine's apt sources that name Debian's archive, with the suite
switched to the release wanted (bookworm, bookworm-updates and bookworm-security become trixie,
trixie-updates and trixie-security), and kept in $GPUNODE_TEST_CACHE (default
/var/cache/gpunode-tests) under `KIND-SUITE-HASH`, the hash of everything it was made from (the
package list, the sources, the scripts run in it). It is never written to after: each use runs on
an overlay of it. Building one needs root, mmdebstrap and the network; using one needs neither
network nor anything but root and systemd-nspawn. Older roots of the same kind and suite are
removed when a new one is made.
"""
import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

CACHE = os.environ.get("GPUNODE_TEST_CACHE", "/var/cache/gpunode-tests")
# The releases the package is built for, by codename: Debian's version number (the `~debNNu1` of
# the package's revision).
RELEASES = {"bookworm": "12", "trixie": "13"}


class Error(Exception):
    """A root cannot be made or used: the message says what and where."""


def run(cmd, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 300)
    return subprocess.run(cmd, **kw)


def os_release(root="/"):
    """/etc/os-release of `root` as a dict (quotes removed)."""
    fields = {}
    for name in ("etc/os-release", "usr/lib/os-release"):
        path = os.path.join(root, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    key, sep, value = line.strip().partition("=")
                    if sep:
                        fields[key] = value.strip().strip("\"'")
            break
    return fields


def host_release():
    """This machine's release codename, when it is one the package is built for; else an Error that
    names what the machine is."""
    info = os_release()
    codename = info.get("VERSION_CODENAME", "")
    if info.get("ID") != "debian" or codename not in RELEASES:
        raise Error(f"/etc/os-release: {info.get('PRETTY_NAME', 'no PRETTY_NAME')}: the packages are built on "
                    f"Debian {' or '.join(f'{v} ({k})' for k, v in RELEASES.items())}")
    return codename


def debian_sources():
    """This machine's apt sources that name Debian's archive (third-party ones would need their
    keys), as [(path, text)]."""
    found = []
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list")),
                 *sorted(glob.glob("/etc/apt/sources.list.d/*.sources"))]:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        live = [l for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")]
        if any("debian.org" in l or "debian-archive-keyring" in l for l in live):
            found.append((path, text))
    if not found:
        raise Error("no apt source of Debian's archive on this machine (/etc/apt/sources.list, "
                    "/etc/apt/sources.list.d/*.list, *.sources)")
    return found


def switch_suite(text, host, suite):
    """An apt sources file's text with every suite of release `host` (`host`, `host-updates`,
    `host-security`, ...) made the same suite of `suite`: the one-line form's third word, deb822's
    `Suites:` field."""
    if host == suite:
        return text
    word = re.compile(rf"(?<![\w.-]){re.escape(host)}(?=$|-[\w-]+$)")

    def suites(words):
        return " ".join(word.sub(suite, w) for w in words.split(" "))
    out = []
    for line in text.splitlines(keepends=True):
        m = re.match(r"^(\s*Suites:\s*)(.*?)(\s*)$", line, re.S)
        if m:
            line = m.group(1) + suites(m.group(2)) + m.group(3)
        else:
            m = re.match(r"^(\s*deb(?:-src)?\s+(?:\[[^]]*\]\s+)?\S+\s+)(\S+)(.*)$", line, re.S)
            if m:
                line = m.group(1) + word.sub(suite, m.group(2)) + m.group(3)
        out.append(line)
    return "".join(out)


def sources_for(suite, directory):
    """This machine's Debian sources switched to `suite`, written into `directory` (the names and
    forms kept: mmdebstrap reads a `.list` as one-line entries and a `.sources` as deb822). Returns
    (paths, texts)."""
    host = host_release()
    paths, texts = [], []
    for i, (path, text) in enumerate(debian_sources()):
        switched = switch_suite(text, host, suite)
        if suite != host and switched == text:
            raise Error(f"{path}: no suite of {host} to switch to {suite}")
        dest = os.path.join(directory, f"{i:02d}-{os.path.basename(path)}")
        with open(dest, "w", encoding="utf-8") as f:
            f.write(switched)
        paths.append(dest)
        texts.append(switched)
    return paths, texts


def cached_root(kind, suite, packages, hooks=(), inputs=(), fmt="1", log=print):
    """The cached root `KIND-SUITE-HASH`: mmdebstrap's apt variant of `suite` with `packages`, then
    each of `hooks` (mmdebstrap --customize-hook commands, run with the root as "$1" and the
    network); `inputs` are [(name, bytes)], files the hooks find in "$GPUNODE_ROOT_INPUTS" (part of
    the hash by their contents, not their paths). One builder of a kind and suite at a time: others
    wait and take its root."""
    if os.geteuid() != 0:
        raise Error("making a Debian root (mmdebstrap --mode=root) needs root")
    for tool in ("mmdebstrap",):
        if shutil.which(tool) is None:
            raise Error(f"{tool} is missing (scripts/install-deps.sh installs it)")
    os.makedirs(CACHE, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f".sources-{suite}-", dir=CACHE)
    try:
        paths, texts = sources_for(suite, scratch)
        packages = sorted(set(packages))
        digest = hashlib.sha256(json.dumps([fmt, kind, suite, packages, texts, list(hooks)]).encode())
        staging = os.path.join(scratch, "inputs")
        os.makedirs(staging)
        for name, data in inputs:
            digest.update(name.encode() + b"\0" + data)
            with open(os.path.join(staging, name), "wb") as f:
                f.write(data)
        key = digest.hexdigest()[:16]
        root = os.path.join(CACHE, f"{kind}-{suite}-{key}")
        # One builder of a kind and suite at a time (the others wait and reuse its root); roots of
        # other kinds are made meanwhile (.ci/run makes the build root while make test boots its own).
        with open(os.path.join(CACHE, f".lock-{kind}-{suite}"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.path.exists(os.path.join(root, ".complete")):
                log(f"# root: cached {root}")
                return root
            building = tempfile.mkdtemp(prefix=f".{kind}-{suite}-", dir=CACHE)
            try:
                t0 = time.monotonic()
                args = ["mmdebstrap", "--mode=root", "--variant=apt"]
                args += ["--include=" + ",".join(packages)] if packages else []
                args += [f"--customize-hook={h}" for h in hooks]
                p = run([*args, suite, building, *paths], timeout=1800,
                        env=dict(os.environ, GPUNODE_ROOT_INPUTS=staging))
                if p.returncode != 0:
                    raise Error(f"mmdebstrap {suite} ({kind}) failed ({p.returncode}): {p.stderr[-3000:]}")
                with open(os.path.join(building, ".complete"), "w") as f:
                    f.write(" ".join(packages) + "\n")
                os.rename(building, root)
                log(f"# root: built {root} in {time.monotonic() - t0:.0f} s ({len(packages)} packages named)")
            finally:
                if os.path.exists(building):
                    shutil.rmtree(building, ignore_errors=True)
            # The cache keeps one root of a kind and suite: one made from other inputs is stale.
            for old in glob.glob(os.path.join(CACHE, f"{kind}-{suite}-*")):
                if old != root:
                    shutil.rmtree(old, ignore_errors=True)
            return root
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def nspawn(root, argv, binds=(), ro_binds=(), chdir=None, env=None, timeout=3600, **kw):
    """`argv` in `root` under systemd-nspawn, not booted: the root read-only under a tmpfs overlay
    (--volatile=overlay: the cached root is never written), no network (--private-network), as
    root; `binds` and `ro_binds` are [(outside, inside)]. Returns the CompletedProcess."""
    if shutil.which("systemd-nspawn") is None:
        raise Error("systemd-nspawn is missing (Debian package systemd-container; scripts/install-deps.sh)")
    args = ["systemd-nspawn", "--quiet", "-D", root, "--register=no", "--keep-unit", "--private-network",
            "--volatile=overlay", "--as-pid2", "--console=pipe", "--resolv-conf=off", "--timezone=off", "--link-journal=no"]
    args += [f"--bind={a}:{b}" for a, b in binds] + [f"--bind-ro={a}:{b}" for a, b in ro_binds]
    if chdir:
        args.append(f"--chdir={chdir}")
    for k, v in (env or {}).items():
        args.append(f"--setenv={k}={v}")
    return run([*args, "--", *argv], timeout=timeout, **kw)
