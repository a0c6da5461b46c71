#!/usr/bin/env python3
"""The Debian package (issue #13): built by cpack from the build tree, compared with the checked-in
manifest, judged by lintian, and installed into a scratch root where its maintainer scripts run
and its agent serves gpunodectl. Nothing outside the scratch directories is touched.

    package_test.py build    BUILD_DIR OUT_DIR      cpack -G DEB into OUT_DIR (the fixture)
    package_test.py contents OUT_DIR SOURCE_DIR     paths, modes, owners (packaging/manifest.txt),
                                                    control fields and files, stripped binaries,
                                                    the dbgsym package, man pages, docs,
                                                    copyright (Apache-2.0), the alert rules
                                                    (promtool test rules) and the dashboard
    package_test.py lintian  OUT_DIR SOURCE_DIR     no error; each warning listed in
                                                    packaging/lintian.txt with its reason
    package_test.py install  OUT_DIR SOURCE_DIR     a scratch root: postinst (users, groups,
                                                    directories, enablement), the start gate,
                                                    systemd-analyze verify and security, the
                                                    shipped config, the agent serving
                                                    `gpunodectl status`, prerm and postrm

Each check prints one line; the last line is `N passed, M failed`."""
import glob
import gzip
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts"))
sys.dont_write_bytecode = True
import debroot  # noqa: E402  (scripts/debroot.py: os_release)
import lab as L  # noqa: E402

UNIT = "gpunode-agent.service"
SOCKET = "gpunode-agent.socket"  # CONTRACT §11: the HTTPS port and the admin socket, held across restarts
HOOK = "/etc/libvirt/hooks/qemu.d/50-gpunode"
MAX_EXPOSURE = 2.0
# The libraries dpkg-shlibdeps names in the package of each Debian release (CONTRACT §14), by
# VERSION_ID: each release's own (Boost 1.81 and 1.83, fmt 9 and 10, yaml-cpp 0.7 and 0.8, and
# OpenSSL's libssl3, renamed libssl3t64 in 13 by the 64-bit time_t transition).
LIBRARIES = {
    "12": ("libc6", "libstdc++6", "libgcc-s1", "libpci3", "libsqlite3-0", "libxml2", "libssl3", "libfmt9",
           "libyaml-cpp0.7", "libboost-json1.81.0", "libboost-url1.81.0"),
    "13": ("libc6", "libstdc++6", "libgcc-s1", "libpci3", "libsqlite3-0", "libxml2", "libssl3t64", "libfmt10",
           "libyaml-cpp0.8", "libboost-json1.83.0", "libboost-url1.83.0"),
}


def run(cmd, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 300)
    return subprocess.run(cmd, **kw)


def the_deb(out):
    debs = sorted(glob.glob(os.path.join(out, "gpunode-agent_*.deb")))
    if len(debs) != 1:
        raise SystemExit(f"want one gpunode-agent_*.deb in {out}, found {debs}")
    return debs[0]


def listing(deb):
    """dpkg-deb -c as {path: (mode, owner)}; a symlink's path is followed by its target."""
    entries = {}
    for line in run(["dpkg-deb", "-c", deb], check=True).stdout.splitlines():
        parts = line.split(None, 5)
        mode, owner, path = parts[0], parts[1], parts[5]
        entries[path] = (mode, owner)
    return entries


def manifest(src):
    """packaging/manifest.txt: `MODE OWNER PATH` lines; `#` starts a comment."""
    entries = {}
    with open(os.path.join(src, "packaging", "manifest.txt"), encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                mode, owner, path = line.split(None, 2)
                entries[path] = (mode, owner)
    return entries


def control(deb):
    fields, key = {}, None
    for line in run(["dpkg-deb", "-f", deb], check=True).stdout.splitlines():
        if line.startswith(" ") and key:
            fields[key] += "\n" + line
        else:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


# ---------------------------------------------------------------------------------------------

def cmd_build(build, out):
    c = L.Checks("package.build")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    t0 = time.monotonic()
    p = run(["cpack", "-G", "DEB", "--config", os.path.join(build, "CPackConfig.cmake"), "-B", out], timeout=900)
    print(p.stdout[-3000:], p.stderr[-3000:], sep="\n")
    c.eq("cpack -G DEB exits 0", p.returncode, 0)
    debs = glob.glob(os.path.join(out, "gpunode-agent_*.deb"))
    arch = run(["dpkg", "--print-architecture"]).stdout.strip()
    c.check(f"one gpunode-agent_VERSION_{arch}.deb ({time.monotonic() - t0:.0f}s)",
            len(debs) == 1 and debs[0].endswith(f"_{arch}.deb"), debs)
    shutil.rmtree(os.path.join(out, "_CPack_Packages"), ignore_errors=True)
    return c.finish()


def cmd_contents(out, src):
    c = L.Checks("package.contents")
    deb = the_deb(out)
    got, want = listing(deb), manifest(src)
    for path in sorted(set(got) | set(want)):
        if path not in want:
            c.check(f"{path} is in the manifest", False, f"{got[path]} in the package only")
        elif path not in got:
            c.check(f"{path} is in the package", False, f"{want[path]} in the manifest only")
        else:
            c.eq(f"{path} {want[path][0]} {want[path][1]}", got[path], want[path])

    f = control(deb)
    c.eq("Package", f.get("Package"), "gpunode-agent")
    # Built for the release this runs in (its own, or its build root: CONTRACT §14): V-1~debNNu1.
    release = debroot.os_release()
    ours = release.get("VERSION_ID") if release.get("ID") == "debian" else None
    if ours in LIBRARIES:
        c.check(f"Version is VERSION-N~deb{ours}uM (built for Debian {ours}, {release.get('VERSION_CODENAME')})",
                re.fullmatch(rf"\d+\.\d+\.\d+-\d+~deb{ours}u\d+", f.get("Version", "")), f.get("Version"))
    else:
        c.check("Version is VERSION-REVISION", re.fullmatch(r"\d+\.\d+\.\d+-\d+", f.get("Version", "")), f.get("Version"))
    c.eq("Architecture", f.get("Architecture"), run(["dpkg", "--print-architecture"]).stdout.strip())
    depends = f.get("Depends", "")
    named = {re.split(r"[\s(]", e.strip())[0] for e in depends.split(",") if e.strip()}
    for lib in ["libvirt0", *LIBRARIES.get(ours, ("libc6", "libstdc++6", "libpci3", "libsqlite3-0"))]:
        c.check(f"Depends names {lib} (dpkg-shlibdeps; libvirt0 also by name, for dlopen)", lib in named, depends)
    if ours in LIBRARIES:
        others = {lib for v, libs in LIBRARIES.items() if v != ours for lib in libs} - set(LIBRARIES[ours])
        c.eq("Depends names no other release's library", sorted(named & others), [])
    for dep in ("systemd", "init-system-helpers", "pci.ids"):
        c.check(f"Depends names {dep}", dep in depends, depends)

    with tempfile.TemporaryDirectory(prefix="gpunode-pkg-") as d:
        ctl = os.path.join(d, "DEBIAN")
        run(["dpkg-deb", "-e", deb, ctl], check=True)
        for name, mode in (("postinst", 0o755), ("prerm", 0o755), ("postrm", 0o755), ("conffiles", 0o644)):
            st = os.stat(os.path.join(ctl, name))
            c.eq(f"control file {name} is {mode:o}", st.st_mode & 0o7777, mode)
        with open(os.path.join(ctl, "conffiles"), encoding="utf-8") as cf:
            c.eq("conffiles", cf.read().split(), ["/etc/gpunode/agent.yaml", "/etc/libvirt/hooks/qemu.d/50-gpunode"])

        root = os.path.join(d, "root")
        run(["dpkg-deb", "-x", deb, root], check=True)
        for exe in ("usr/bin/gpunode-agent", "usr/bin/gpunodectl"):
            sections = run(["readelf", "-S", "-W", os.path.join(root, exe)]).stdout
            c.check(f"{exe} is stripped (no .symtab, no .debug_*)",
                    ".symtab" not in sections and ".debug_" not in sections, "sections left")
        with open(os.path.join(root, HOOK.lstrip("/")), encoding="utf-8") as hf:
            hook = hf.read()
        c.check(f"{HOOK} is a sh script that execs gpunode-agent libvirt-hook with libvirt's arguments",
                hook.startswith("#!/bin/sh\n") and 'exec /usr/bin/gpunode-agent libvirt-hook -- "$@"\n' in hook, hook[-200:])
        for page in ("usr/share/man/man8/gpunode-agent.8.gz", "usr/share/man/man1/gpunodectl.1.gz",
                     "usr/share/man/man5/agent.yaml.5.gz"):
            with gzip.open(os.path.join(root, page), "rt", encoding="utf-8") as g:
                text = g.read()
            c.check(f"{page} is gzipped roff with the version", text.startswith(".TH ") and "@VERSION@" not in text, text[:80])
            w = run(["man", "--warnings", "-l", "-Tutf8", "-Z", os.path.join(root, page)],
                    env=dict(os.environ, LC_ALL="C.UTF-8", MANWIDTH="80"))
            c.eq(f"{page}: groff has no warning", w.stderr.strip(), "")
        with open(os.path.join(root, "usr/share/doc/gpunode-agent/copyright"), encoding="utf-8") as cp:
            copyright_text = cp.read()
        check_copyright(c, copyright_text, src)
        check_monitoring(c, root)
        with gzip.open(os.path.join(root, "usr/share/doc/gpunode-agent/changelog.Debian.gz"), "rt", encoding="utf-8") as ch:
            first = ch.readline()
        c.check("changelog.Debian.gz opens with this version",
                first.startswith(f"gpunode-agent ({f.get('Version')}) "), first)

        # Debug symbols: split out into the -dbgsym package when the build has them.
        ddebs = glob.glob(os.path.join(out, "gpunode-agent-dbgsym_*.ddeb"))
        cache = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(out))), "CMakeCache.txt")
        build_type = ""
        for line in open(cache, encoding="utf-8") if os.path.exists(cache) else []:
            if line.startswith("CMAKE_BUILD_TYPE:"):
                build_type = line.split("=", 1)[1].strip()
        if build_type in ("RelWithDebInfo", "Debug") or ddebs:
            c.eq(f"one gpunode-agent-dbgsym .ddeb ({build_type or 'build type unknown'})", len(ddebs), 1)
            if ddebs:
                dbg = os.path.join(d, "dbg")
                run(["dpkg-deb", "-x", ddebs[0], dbg], check=True)
                for exe in ("usr/bin/gpunode-agent", "usr/bin/gpunodectl"):
                    note = run(["readelf", "-n", os.path.join(root, exe)]).stdout
                    m = re.search(r"Build ID: ([0-9a-f]+)", note)
                    bid = m.group(1) if m else ""
                    path = os.path.join(dbg, "usr/lib/debug/.build-id", bid[:2], bid[2:] + ".debug")
                    has = bool(bid) and os.path.exists(path) and ".debug_info" in run(["readelf", "-S", "-W", path]).stdout
                    c.check(f"{exe}'s debug info is in the dbgsym package (build id {bid[:12]}...)", has, path)
        else:
            print(f"# build type {build_type}: no debug information to split out", flush=True)
    return c.finish()


APACHE = "/usr/share/common-licenses/Apache-2.0"


def dep5_paragraphs(text):
    """A DEP-5 file as a list of {field: value} (continuation lines joined with newlines)."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", text.strip()):
        fields, key = {}, None
        for line in block.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += "\n" + line.strip()
            else:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        paragraphs.append(fields)
    return paragraphs


def check_copyright(c, text, src):
    """The copyright file is DEP-5 and says Apache-2.0 (the project's LICENSE) for gpunode's files."""
    paragraphs = dep5_paragraphs(text)
    c.eq("copyright is machine-readable (DEP-5)", paragraphs[0].get("Format"),
         "https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/")
    c.eq("copyright: Upstream-Name", paragraphs[0].get("Upstream-Name"), "gpunode")
    everything = [p for p in paragraphs if p.get("Files") == "*"]
    c.check("copyright: Files: * is Apache-2.0, 2026 the gpunode authors",
            len(everything) == 1 and everything[0].get("License") == "Apache-2.0"
            and everything[0].get("Copyright") == "2026 the gpunode authors", everything)
    licence = [p for p in paragraphs if "Files" not in p and p.get("License", "").startswith("Apache-2.0\n")]
    c.check(f"copyright: an Apache-2.0 License paragraph that points at {APACHE}",
            len(licence) == 1 and f'"{APACHE}"' in licence[0]["License"], licence)
    c.check("copyright: no proprietary licence left", "proprietary" not in text and "No license" not in text, "")
    for p in (p for p in paragraphs if "Files" in p):
        name = p.get("License", "").split("\n", 1)[0]
        c.check(f"copyright: Files: {p['Files']}: licence {name} has its text (in place or a paragraph of its own)",
                "\n" in p.get("License", "") or any(q.get("License", "").startswith(name + "\n") for q in paragraphs), p)
    if os.path.exists(APACHE):
        with open(os.path.join(src, "LICENSE"), encoding="utf-8") as mine, open(APACHE, encoding="utf-8") as debian:
            c.check(f"LICENSE at the source root is the Apache License 2.0 ({APACHE})", mine.read() == debian.read(), "")


def check_monitoring(c, root):
    """The alerting rules pass their promtool tests where the package puts them, and the dashboard
    is JSON (integration.alerts checks both against the agent's metrics)."""
    share = os.path.join(root, "usr/share/gpunode-agent")
    promtool = shutil.which("promtool")
    if c.check("promtool is installed (Debian package prometheus; scripts/install-deps.sh)", promtool, "not on PATH"):
        p = run([promtool, "test", "rules", os.path.join(share, "prometheus/gpunode-alerts.test.yaml")])
        c.check("/usr/share/gpunode-agent/prometheus/gpunode-alerts.yaml passes its promtool tests as installed",
                p.returncode == 0, p.stdout + p.stderr)
    with open(os.path.join(share, "grafana/gpunode.json"), encoding="utf-8") as f:
        try:
            dash = json.load(f)
        except ValueError as e:
            dash = {"error": str(e)}
    c.check("/usr/share/gpunode-agent/grafana/gpunode.json is a Grafana dashboard (JSON with panels)",
            dash.get("panels") and dash.get("schemaVersion"), dash.get("error"))


def cmd_lintian(out, src):
    c = L.Checks("package.lintian")
    deb = the_deb(out)
    version = run(["lintian", "--version"]).stdout.strip()
    release = debroot.os_release().get("PRETTY_NAME", "?")
    p = run(["lintian", "--no-tag-display-limit", "--display-info", deb], timeout=600)
    print(f"# {version} of {release}, output:", flush=True)
    for line in p.stdout.splitlines():
        print(f"#   {line}", flush=True)
    print(p.stderr, end="", flush=True)
    c.check("lintian ran", p.returncode in (0, 1) and "not found" not in p.stderr, p.stderr)
    tags = [line for line in p.stdout.splitlines() if re.match(r"^[EWIPX]: ", line)]
    errors = [t for t in tags if t.startswith("E: ")]
    c.eq("lintian reports no error", errors, [])
    explained = set()
    with open(os.path.join(src, "packaging", "lintian.txt"), encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^([WI]): (\S+)", line)
            if m:
                explained.add((m.group(1), m.group(2)))
    for t in tags:
        if t.startswith(("W: ", "I: ")):
            kind, tag = t[0], t.split()[2]
            c.check(f"{kind}: {tag} is explained in packaging/lintian.txt", (kind, tag) in explained, t)
    return c.finish()


# ---------------------------------------------------------------------------------------------

def write_stub(bindir, name, log):
    path = os.path.join(bindir, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f'#!/bin/sh\necho "{name} $*" >> "{log}"\n')
    os.chmod(path, 0o755)


def read_lines(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def passwd_entry(root, file, name):
    for line in read_lines(os.path.join(root, "etc", file)):
        fields = line.split(":")
        if fields[0] == name:
            return fields
    return None


def wait_for(pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def cmd_install(out, src):
    c = L.Checks("package.install")
    deb = the_deb(out)
    scratch = tempfile.mkdtemp(prefix="gpunode-pkg-install-")
    agent_proc = None
    try:
        root = os.path.join(scratch, "root")
        ctl_dir = os.path.join(scratch, "DEBIAN")
        run(["dpkg-deb", "-x", deb, root], check=True)
        run(["dpkg-deb", "-e", deb, ctl_dir], check=True)
        want = manifest(src)

        # Modes as the manifest says (owners: dpkg-deb -x keeps them only as root).
        for path, (mode, _) in sorted(want.items()):
            full = os.path.join(root, path.lstrip("./"))
            st = os.lstat(full)
            c.eq(f"installed {path} is {mode}", stat_mode(st.st_mode), mode)

        # Maintainer scripts run against the scratch root: DPKG_ROOT, as for a bootstrap (the real
        # systemd-sysusers, systemd-tmpfiles and deb-systemd-helper act on that root). systemctl and
        # deb-systemd-invoke, which would talk to the host's systemd, are stand-ins that only record
        # their calls.
        bindir = os.path.join(scratch, "bin")
        os.makedirs(bindir)
        calls = os.path.join(scratch, "calls.log")
        for name in ("systemctl", "deb-systemd-invoke"):
            write_stub(bindir, name, calls)
        # `systemctl --quiet is-active UNIT` answers from ACTIVE, the units "running" here.
        active = os.path.join(scratch, "active")
        with open(os.path.join(bindir, "systemctl"), "a", encoding="utf-8") as f:
            f.write(f'[ "$1 $2" = "--quiet is-active" ] && exec grep -qsx "$3" "{active}"\nexit 0\n')

        def actions():
            """The calls that change something (not the is-active questions)."""
            return [l for l in read_lines(calls) if " is-active " not in l]
        env = dict(os.environ, DPKG_ROOT=root, PATH=f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}")

        def script(name, *args):
            # As dpkg runs them: deb-systemd-helper refuses to act without DPKG_MAINTSCRIPT_*.
            p = run([os.path.join(ctl_dir, name), *args],
                    env=dict(env, DPKG_MAINTSCRIPT_PACKAGE="gpunode-agent", DPKG_MAINTSCRIPT_NAME=name))
            c.eq(f"{name} {' '.join(args)} exits 0", p.returncode, 0)
            if p.returncode != 0 or p.stderr:
                print(f"# {name}: {p.stdout}{p.stderr}", flush=True)
            return p

        script("postinst", "configure")
        user = passwd_entry(root, "passwd", "gpunode")
        c.check("postinst: user gpunode exists (sysusers), no login, home /var/lib/gpunode",
                user is not None and user[5] == "/var/lib/gpunode" and user[6].endswith("nologin"), user)
        c.check("postinst: user gpunode is a system user (uid < 1000)", user is not None and int(user[2]) < 1000, user)
        for group in ("gpunode", "gpunode-admin", "libvirt"):
            c.check(f"postinst: group {group} exists", passwd_entry(root, "group", group) is not None, group)
        libvirt_group = passwd_entry(root, "group", "libvirt")
        c.check("postinst: gpunode is a member of libvirt in /etc/group (polkit decides qemu:///system by it)",
                libvirt_group is not None and "gpunode" in libvirt_group[3].split(","), libvirt_group)
        tls = os.path.join(root, "etc/gpunode/tls")
        st = os.stat(tls) if os.path.isdir(tls) else None
        gid = int(passwd_entry(root, "group", "gpunode")[2]) if passwd_entry(root, "group", "gpunode") else -1
        c.check("postinst: /etc/gpunode/tls 0750 root:gpunode (tmpfiles)",
                st is not None and stat_mode(st.st_mode) == "drwxr-x---" and st.st_uid == 0 and st.st_gid == gid,
                st and (oct(st.st_mode), st.st_uid, st.st_gid, gid))
        link = os.path.join(root, "etc/systemd/system/multi-user.target.wants", UNIT)
        c.check("postinst: the unit is enabled (multi-user.target.wants)",
                os.path.islink(link) and os.readlink(link) == f"/usr/lib/systemd/system/{UNIT}",
                os.path.islink(link) and os.readlink(link))
        link = os.path.join(root, "etc/systemd/system/sockets.target.wants", SOCKET)
        c.check("postinst: the socket unit is enabled (sockets.target.wants)",
                os.path.islink(link) and os.readlink(link) == f"/usr/lib/systemd/system/{SOCKET}",
                os.path.islink(link) and os.readlink(link))
        c.eq("postinst: systemd not asked anything where it does not run", read_lines(calls), [])
        hook_file = os.path.join(root, HOOK.lstrip("/"))
        if not os.path.exists("/usr/bin/gpunode-agent"):
            p = run(["sh", hook_file, "vm", "prepare", "begin", "-"], input="<domain><devices><hostdev type='pci'/></devices></domain>")
            c.eq("the hook with no /usr/bin/gpunode-agent (removed, not purged): exit 0, silent",
                 (p.returncode, p.stdout, p.stderr), (0, "", ""))

        # The start gate: with systemd running there, an unconfigured node is not started.
        os.makedirs(os.path.join(root, "run/systemd/system"))
        p = script("postinst", "configure")
        c.eq("postinst, not configured: daemon-reload, no start; libvirtd not running: not touched", actions(),
             ["systemctl --system daemon-reload"])
        c.eq("postinst: asks whether libvirtd and virtqemud run", [l for l in read_lines(calls) if " is-active " in l],
             ["systemctl --quiet is-active libvirtd.service", "systemctl --quiet is-active virtqemud.service"])
        c.check("postinst, not configured: says what to fill in", "node.id and node.owner_org" in p.stderr, p.stderr)
        conf = os.path.join(root, "etc/gpunode/agent.yaml")
        with open(conf, encoding="utf-8") as f:
            shipped = f.read()
        filled = shipped.replace('id: ""', "id: node-pkg-1", 1).replace('owner_org: ""', "owner_org: org-pkg-owner", 1)

        # The gate opens every file the config names as the service's user (check-config --files,
        # CONTRACT §11): with the TLS key only root may read, the agent is not started.
        lab = os.path.join(scratch, "lab")
        os.makedirs(lab)
        L.sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
              "-subj", "/CN=127.0.0.1", "-keyout", os.path.join(lab, "tls.key"), "-out", os.path.join(lab, "tls.crt")])
        L.sh(["openssl", "genpkey", "-algorithm", "ed25519", "-out", os.path.join(lab, "issuer.pem")])
        L.sh(["openssl", "pkey", "-in", os.path.join(lab, "issuer.pem"), "-pubout", "-out", os.path.join(lab, "issuer.pub")])
        for path in (scratch, lab, os.path.join(lab, "tls.crt"), os.path.join(lab, "issuer.pub")):
            os.chmod(path, 0o755 if os.path.isdir(path) else 0o644)
        os.chmod(os.path.join(lab, "tls.key"), 0o600)
        gated = (filled.replace("/etc/gpunode/tls/agent.crt", os.path.join(lab, "tls.crt"))
                 .replace("/etc/gpunode/tls/agent.key", os.path.join(lab, "tls.key"))
                 .replace("/etc/gpunode/issuer.pub", os.path.join(lab, "issuer.pub")))
        with open(conf, "w", encoding="utf-8") as f:
            f.write(gated)
        os.remove(calls)
        p = script("postinst", "configure")
        c.eq("postinst, configured but the TLS key 0600 root: not started", actions(), ["systemctl --system daemon-reload"])
        if os.geteuid() == 0:
            c.check("... and it says why, as check-config --files as gpunode: the key, permission denied",
                    f"{lab}/tls.key: permission denied" in p.stderr and "not ready to run" in p.stderr, p.stderr)
            os.chown(os.path.join(lab, "tls.key"), 0, gid)
            os.chmod(os.path.join(lab, "tls.key"), 0o640)
            os.remove(calls)
            script("postinst", "configure")
            c.eq("postinst, configured, the key 0640 root:gpunode (first install): the sockets, then the agent started",
                 actions(), ["systemctl --system daemon-reload", f"deb-systemd-invoke start {SOCKET}",
                             f"deb-systemd-invoke start {UNIT}"])
        else:
            c.check("SKIP: the gate's as-gpunode run needs root (setpriv): a non-root run never starts", True)
        with open(conf, "w", encoding="utf-8") as f:
            f.write(filled)
        os.remove(calls)
        with open(active, "w", encoding="utf-8") as f:
            f.write("libvirtd.service\n")
        with open(conf, "w", encoding="utf-8") as f:
            f.write(gated)
        script("postinst", "configure", "0.1.0-1")
        want = ([f"deb-systemd-invoke stop {UNIT}", f"deb-systemd-invoke reset-failed {UNIT} {SOCKET}",
                 f"deb-systemd-invoke start {SOCKET}", f"deb-systemd-invoke restart {UNIT}"] if os.geteuid() == 0 else [])
        c.eq("postinst, configured (upgrade from a package without the socket unit): the agent stopped, so that "
             "the socket unit can bind, the start limit reset, then started; libvirtd reloaded (not restarted)",
             actions(),
             ["systemctl --system daemon-reload", *want, "deb-systemd-invoke reload libvirtd.service"])
        os.remove(calls)
        with open(active, "a", encoding="utf-8") as f:
            f.write(f"{SOCKET}\n")
        script("postinst", "configure", "0.2.0-1")
        want = ([f"deb-systemd-invoke reset-failed {UNIT} {SOCKET}", f"deb-systemd-invoke start {SOCKET}",
                 f"deb-systemd-invoke restart {UNIT}"] if os.geteuid() == 0 else [])
        c.eq("postinst, configured (upgrade, the socket unit active): the start limit reset, the agent alone "
             "restarted, its sockets kept",
             actions(), ["systemctl --system daemon-reload", *want, "deb-systemd-invoke reload libvirtd.service"])
        with open(conf, "w", encoding="utf-8") as f:
            f.write(filled)

        # The shipped config: invalid only for want of node.id and node.owner_org.
        agent = os.path.join(root, "usr/bin/gpunode-agent")
        ctlbin = os.path.join(root, "usr/bin/gpunodectl")
        shipped_file = os.path.join(scratch, "shipped.yaml")
        with open(shipped_file, "w", encoding="utf-8") as f:
            f.write(shipped)
        p = run([agent, "check-config", "--config", shipped_file])
        c.check("the shipped config as is: check-config names exactly node.id and node.owner_org",
                p.returncode == 1 and len(p.stderr.strip().splitlines()) == 2 and "node.id" in p.stderr
                and "node.owner_org" in p.stderr, p.stderr)
        p = run([agent, "check-config", "--config", conf])
        c.check("the shipped config, node.id and owner_org filled in: check-config accepts it", p.returncode == 0, p.stderr)

        # systemd-analyze on the packaged unit. verify needs ExecStart to exist: a scratch copy
        # naming the packaged binary where it lies here; its man pages are found there too.
        unit_src = os.path.join(root, "usr/lib/systemd/system", UNIT)
        units = os.path.join(scratch, "units")
        os.makedirs(units)
        with open(unit_src, encoding="utf-8") as f:
            text = f.read()
        c.check("the unit starts /usr/bin/gpunode-agent run --config /etc/gpunode/agent.yaml",
                "\nExecStart=/usr/bin/gpunode-agent run --config /etc/gpunode/agent.yaml\n" in text, "")
        with open(os.path.join(units, UNIT), "w", encoding="utf-8") as f:
            f.write(text.replace("/usr/bin/gpunode-agent", agent))
        with open(os.path.join(root, "usr/lib/systemd/system", SOCKET), encoding="utf-8") as f:
            socket_text = f.read()
        c.check("the socket unit holds api.listen's and admin.socket's defaults",
                "\nListenStream=0.0.0.0:8443\n" in socket_text and "\nListenStream=/run/gpunode/admin.sock\n" in socket_text
                and 'listen: "0.0.0.0:8443"' in shipped and "socket: /run/gpunode/admin.sock" in shipped, socket_text)
        with open(os.path.join(units, SOCKET), "w", encoding="utf-8") as f:
            f.write(socket_text)
        p = run(["systemd-analyze", "verify", os.path.join(units, UNIT), os.path.join(units, SOCKET)],
                env=dict(os.environ, MANPATH=os.path.join(root, "usr/share/man")))
        c.check("systemd-analyze verify: no complaint", p.returncode == 0 and not p.stderr.strip(), p.stdout + p.stderr)
        p = run(["systemd-analyze", "security", "--offline=yes", "--no-pager", unit_src])
        m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", p.stdout)
        exposure = float(m.group(1)) if m else 99.0
        print("# systemd-analyze security, every line above 0:", flush=True)
        for line in p.stdout.splitlines():
            if re.search(r"\s\d\.\d$", line) and not re.search(r"\s0\.0$", line):
                print(f"#   {line.rstrip()}", flush=True)
        c.check(f"systemd-analyze security --offline=yes: exposure {exposure} <= {MAX_EXPOSURE}",
                exposure <= MAX_EXPOSURE, p.stdout[-300:] + p.stderr)

        # The packaged agent from the filled-in config, its host, state and socket in the scratch
        # area, libvirt's test driver; under systemd's notify protocol.
        host = os.path.join(lab, "host")
        run([sys.executable, os.path.join(L.FIXTURES, "mkhost.py"), L.DEMO_HOST, host], check=True)
        state = os.path.join(root, "var/lib/gpunode")
        sock = os.path.join(root, "run/gpunode/admin.sock")
        c.check("postinst: /run/gpunode made root's, 0755 (tmpfiles; the hook trusts a socket there)",
                os.path.isdir(os.path.dirname(sock)) and (os.geteuid() != 0 or os.stat(os.path.dirname(sock)).st_uid == 0)
                and stat_mode(os.stat(os.path.dirname(sock)).st_mode) == "drwxr-xr-x", os.path.dirname(sock))
        port = L.free_port()
        cfg = (filled.replace("host_root: /", f"host_root: {host}", 1)
               .replace('listen: "0.0.0.0:8443"', f'listen: "127.0.0.1:{port}"', 1)
               .replace("/etc/gpunode/tls/agent.crt", os.path.join(lab, "tls.crt"))
               .replace("/etc/gpunode/tls/agent.key", os.path.join(lab, "tls.key"))
               .replace("/etc/gpunode/issuer.pub", os.path.join(lab, "issuer.pub"))
               .replace("/run/gpunode/admin.sock", sock)
               .replace("allowed_uids: [0]", f"allowed_uids: [{os.getuid()}]")
               .replace("uri: qemu:///system", "uri: test:///default")
               .replace("dir: /var/lib/gpunode", f"dir: {state}"))
        cfg_file = os.path.join(lab, "agent.yaml")
        with open(cfg_file, "w", encoding="utf-8") as f:
            f.write(cfg)
        changed = sum(1 for a, b in zip(filled.splitlines(), cfg.splitlines()) if a != b)
        c.check(f"the run config is the shipped one but for {changed} lines that place it here (at most 9)",
                0 < changed <= 9, changed)

        # As root, the agent runs as the unit runs it: the package's gpunode user (its uid in the
        # scratch root), no capability, no new privileges, and a supplementary group it gives the
        # admin socket to (nogroup standing in for gpunode-admin, which the host does not know).
        as_unit = []
        if os.geteuid() == 0:
            uid, gid = int(user[2]), int(user[3])
            for path in (scratch, lab, os.path.join(root, "var"), os.path.join(root, "var/lib"), os.path.join(root, "run")):
                os.chmod(path, 0o755)
            os.makedirs(state, exist_ok=True)
            for path in (state, os.path.dirname(sock)):
                os.chown(path, uid, gid)
            os.chmod(os.path.join(lab, "tls.key"), 0o644)
            with open(cfg_file, "w", encoding="utf-8") as f:
                f.write(cfg.replace("allowed_group: gpunode-admin", "allowed_group: nogroup"))
            as_unit = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--groups=65534", "--inh-caps=-all",
                       "--bounding-set=-all", "--no-new-privs"]

        notify_path = os.path.join(lab, "notify")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        os.chmod(notify_path, 0o666)  # the agent may run as another user (above)
        notify.settimeout(20)
        log = open(os.path.join(lab, "agent.log"), "wb")
        agent_proc = subprocess.Popen([*as_unit, agent, "run", "--config", cfg_file], stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True,
                                      env=dict(os.environ, NOTIFY_SOCKET=notify_path, WATCHDOG_USEC="2000000",
                                               WATCHDOG_PID=""))
        messages = []
        deadline = time.time() + 20
        while time.time() < deadline and "READY=1" not in messages and agent_proc.poll() is None:
            try:
                messages.append(notify.recv(4096).decode())
            except socket.timeout:
                break
        c.check("the packaged agent tells systemd READY=1", "READY=1" in messages, f"{messages} {tail(lab)}")
        s = os.stat(sock) if os.path.exists(sock) else None
        c.check("its admin socket is 0660", s is not None and stat_mode(s.st_mode) == "srw-rw----", s and oct(s.st_mode))
        if as_unit:
            c.check(f"as uid {uid} without capabilities, it gave the socket to its supplementary group",
                    s is not None and s.st_uid == uid and s.st_gid == 65534, s and (s.st_uid, s.st_gid))
        p = run([ctlbin, "--socket", sock, "status"], timeout=60)
        c.check("the packaged gpunodectl status answers over the admin socket",
                p.returncode == 0 and "node-pkg-1" in p.stdout, f"rc={p.returncode} {p.stdout[:400]} {p.stderr[:400]}")
        version = run([agent, "version"]).stdout.split()[-1]
        c.check(f"status shows the packaged agent's version {version}", version in p.stdout, p.stdout[:400])
        p = run([ctlbin, "--socket", sock, "--json", "units"], timeout=60)
        units = L.Resp(200, {}, p.stdout.encode()).json or {}
        c.eq("gpunodectl --json units lists the demo host's units", sorted(u.get("id") for u in units.get("units", [])),
             L.ALL_UNITS)
        # The packaged hook, pointed at the packaged binary, asks the packaged agent (CONTRACT §9).
        hook_run = os.path.join(lab, "50-gpunode")
        with open(hook_file, encoding="utf-8") as f:
            text = (f.read().replace("/usr/bin/gpunode-agent", agent)
                    .replace(f"{agent} libvirt-hook --", f"{agent} libvirt-hook --socket {sock} --config {cfg_file} --"))
        with open(hook_run, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(hook_run, 0o755)
        xml = ("<domain type='kvm'><name>pkg-vm</name><devices><hostdev mode='subsystem' type='pci'><source>"
               "<address domain='0x0000' bus='0x62' slot='0x00' function='0x0'/></source></hostdev></devices></domain>")
        p = run([hook_run, "pkg-vm", "prepare", "begin", "-"], input=xml, timeout=30)
        c.check("the packaged hook asks the packaged agent: a GPU of no unit is refused (exit 1, unknown-unit)",
                p.returncode == 1 and p.stderr.startswith("gpunode: domain pkg-vm refused: -: unknown-unit: "),
                f"rc={p.returncode} {p.stderr}")
        c.check("WATCHDOG=1 follows within the watchdog interval",
                wait_for(lambda: pet(notify, messages), 3), messages)
        agent_proc.terminate()
        rc = agent_proc.wait(30)
        c.eq("SIGTERM stops it with status 0", rc, 0)
        notify.settimeout(1)
        c.check("and it said STOPPING=1", pet(notify, messages, "STOPPING=1") or "STOPPING=1" in messages, messages)
        agent_proc = None
        notify.close()
        log.close()

        # Removal: stopped on remove, state kept; on purge the state goes.
        os.remove(calls)
        script("prerm", "upgrade", "0.2.0-1")
        c.eq("prerm upgrade: not stopped (postinst restarts it)", read_lines(calls), [])
        script("prerm", "remove")
        c.eq("prerm remove: stopped, the sockets too", read_lines(calls), [f"deb-systemd-invoke stop {SOCKET} {UNIT}"])
        script("postrm", "remove")
        c.check("postrm remove: the state is kept", os.path.exists(os.path.join(state, "state.db")), os.listdir(root))
        os.remove(calls)
        hook_cache = os.path.join(root, "run", "gpunode-hook")
        os.makedirs(hook_cache, mode=0o700, exist_ok=True)
        with open(os.path.join(hook_cache, "settings-3.json"), "w") as f:
            f.write("{}")
        script("postrm", "purge")
        c.eq("postrm purge, libvirtd running: reloaded (forgets the hook dpkg deleted)", actions(),
             ["deb-systemd-invoke reload libvirtd.service"])
        c.check("postrm purge: the state is gone", not os.path.exists(state), state)
        c.check("postrm purge: the enablement is gone", not os.path.lexists(link), link)
        c.check("postrm purge: the hook's settings cache is gone", not os.path.exists(hook_cache), hook_cache)
    finally:
        if agent_proc is not None and agent_proc.poll() is None:
            agent_proc.kill()
            agent_proc.wait(10)
        L.remove_tree(scratch, "package install scratch root")
    return c.finish()


def pet(notify, messages, want="WATCHDOG=1"):
    try:
        messages.append(notify.recv(4096).decode())
    except (socket.timeout, BlockingIOError):
        return False
    return want in messages


def tail(lab):
    try:
        with open(os.path.join(lab, "agent.log"), encoding="utf-8", errors="replace") as f:
            return f.read()[-2000:]
    except OSError:
        return ""


def stat_mode(mode):
    import stat
    return stat.filemode(mode)


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    what, a, b = sys.argv[1:]
    return {"build": cmd_build, "contents": cmd_contents, "lintian": cmd_lintian, "install": cmd_install}[what](a, b)


if __name__ == "__main__":
    sys.exit(main())
