#!/usr/bin/env python3
"""The libvirt hook end to end (CONTRACT §9): the real `gpunode-agent libvirt-hook` binary, run the
way libvirt runs an executable of /etc/libvirt/hooks/qemu.d/ (`NAME OPERATION SUB-OPERATION EXTRA`,
the domain XML on stdin), against a real agent on the demo host (lab.py) whose reservations are
made over the HTTPS API.

The domain XML is what libvirt hands a hook: a whole definition as `virsh dumpxml` prints it (q35
machine, disk, NIC, serial, graphics, the workload label of §5 in <metadata>, PCI <hostdev>s with
their host address in <source> and their guest address beside it), one per case.

Covered: every row of §4's entitlement table (on-demand on a free and a reserved unit, reserved in
and out of the audience, on a released unit and on no reservation, spot on released and unreleased
units, unlabelled), a domain spanning two units (one refused), a GPU of no unit, a hostdev that is
no PCI function of the node, a unit that is not sellable, a NIC-only domain, a domain without
hostdevs (exit 0 with the agent stopped: never asks), the operations that do not ask (start begin,
started begin, stopped end, release end, reconnect begin), migrate and restore begin, the three
modes switched by SIGHUP (enforce: exit 1 and one stderr line per reason; audit: exit 0, a warning
log line and an event; off: allowed without deciding), the agent down both ways (deny and allow),
--socket over the config's socket and the socket taken from --config, the workload.refused events
in the agent's outbox, and the create race (a start let through holds its unit against a create).

Prints one line per check, then the table of cases with their outcomes and the hook's wall time.

    hook_test.py PATH/TO/gpunode-agent
"""
import glob
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
import uuid as uuidlib

sys.dont_write_bytecode = True
import lab as L  # noqa: E402

U23, U24, U43, U81 = "u-0000-23-00-0", "u-0000-24-00-0", "u-0000-43-00-0", "u-0000-81-00-0"
GPU = {U23: ["0000:23:00.0"], U24: ["0000:24:00.0"], U43: ["0000:43:00.0", "0000:44:00.0"],
       U81: ["0000:81:00.0"]}
NOT_SELLABLE_GPU = "0000:c1:00.0"   # u-0000-c1-00-0: mixed drivers, class none
BMC_VGA = "0000:62:00.0"            # ASPEED VGA: a display-class function that is no unit
NIC = "0000:e2:00.0"                # ConnectX-6 Dx: not a GPU, not the agent's to judge
NO_SUCH = "0000:99:00.0"            # no PCI function of the node
AUD, MGR, OUTSIDER = "org-aud", "org-mgr", "org-x"


def hostdev(addr, n):
    dom, bus, rest = addr.split(":")
    slot, fn = rest.split(".")
    return f"""    <hostdev mode='subsystem' type='pci' managed='yes'>
      <driver name='vfio'/>
      <source>
        <address domain='0x{dom}' bus='0x{bus}' slot='0x{slot}' function='0x{fn}'/>
      </source>
      <alias name='hostdev{n}'/>
      <address type='pci' domain='0x0000' bus='0x{n + 6:02x}' slot='0x00' function='0x0'/>
    </hostdev>
"""


def padded(xml, size=2 * 1024 * 1024):
    """The domain with `size` bytes of metadata of another application (CONTRACT §9: up to 16 MiB)."""
    pad = f"<pad:blob xmlns:pad='urn:example:pad'>{'A' * size}</pad:blob>"
    if "<metadata>" in xml:
        return xml.replace("<metadata>", "<metadata>" + pad, 1)
    return xml.replace("<memory ", f"<metadata>{pad}</metadata>\n  <memory ", 1)


def domain_xml(name, label=None, addrs=(), uid=None):
    """A domain as libvirt gives it to a hook (virsh dumpxml of a q35 guest). `label`: (org, tier)
    or None (unlabelled)."""
    meta = ""
    if label:
        org, tier = label
        meta = f"""  <metadata>
    <libosinfo:libosinfo xmlns:libosinfo="http://libosinfo.org/xmlns/libvirt/domain/1.0">
      <libosinfo:os id="http://ubuntu.com/ubuntu/22.04"/>
    </libosinfo:libosinfo>
    <gw:workload xmlns:gw="urn:gpunode:workload:1" vm-id="vm-{name}" org="{org}" tier="{tier}"/>
  </metadata>
"""
    devs = "".join(hostdev(a, i) for i, a in enumerate(addrs))
    return f"""<domain type='kvm' id='7'>
  <name>{name}</name>
  <uuid>{uid or uuidlib.uuid4()}</uuid>
{meta}  <memory unit='KiB'>67108864</memory>
  <currentMemory unit='KiB'>67108864</currentMemory>
  <vcpu placement='static'>16</vcpu>
  <resource>
    <partition>/machine</partition>
  </resource>
  <os>
    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>
    <loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.fd</loader>
    <nvram>/var/lib/libvirt/qemu/nvram/{name}_VARS.fd</nvram>
    <boot dev='hd'/>
  </os>
  <features>
    <acpi/>
    <apic/>
    <ioapic driver='kvm'/>
  </features>
  <cpu mode='host-passthrough' check='none' migratable='on'/>
  <clock offset='utc'>
    <timer name='rtc' tickpolicy='catchup'/>
    <timer name='pit' tickpolicy='delay'/>
    <timer name='hpet' present='no'/>
  </clock>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' discard='unmap'/>
      <source file='/var/lib/libvirt/images/{name}.qcow2'/>
      <target dev='vda' bus='virtio'/>
      <alias name='virtio-disk0'/>
      <address type='pci' domain='0x0000' bus='0x04' slot='0x00' function='0x0'/>
    </disk>
    <controller type='usb' index='0' model='qemu-xhci' ports='15'>
      <address type='pci' domain='0x0000' bus='0x02' slot='0x00' function='0x0'/>
    </controller>
    <controller type='pci' index='0' model='pcie-root'/>
    <controller type='pci' index='1' model='pcie-root-port'>
      <model name='pcie-root-port'/>
      <target chassis='1' port='0x10'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x0' multifunction='on'/>
    </controller>
    <interface type='network'>
      <mac address='52:54:00:5a:1c:07'/>
      <source network='default'/>
      <model type='virtio'/>
      <address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>
    </interface>
    <serial type='pty'>
      <target type='isa-serial' port='0'>
        <model name='isa-serial'/>
      </target>
    </serial>
    <console type='pty'>
      <target type='serial' port='0'/>
    </console>
    <channel type='unix'>
      <target type='virtio' name='org.qemu.guest_agent.0'/>
      <address type='virtio-serial' controller='0' bus='0' port='1'/>
    </channel>
    <input type='mouse' bus='ps2'/>
    <input type='keyboard' bus='ps2'/>
    <graphics type='vnc' port='-1' autoport='yes' listen='127.0.0.1'>
      <listen type='address' address='127.0.0.1'/>
    </graphics>
    <video>
      <model type='virtio' heads='1' primary='yes'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x01' function='0x0'/>
    </video>
{devs}    <memballoon model='virtio'>
      <address type='pci' domain='0x0000' bus='0x05' slot='0x00' function='0x0'/>
    </memballoon>
  </devices>
  <seclabel type='dynamic' model='apparmor' relabel='yes'/>
</domain>
"""


def refused_events(lab):
    db = sqlite3.connect(f"file:{os.path.join(lab.state, 'state.db')}?mode=ro", uri=True)
    try:
        evs = [json.loads(e) for (e,) in db.execute("SELECT event FROM outbox ORDER BY seq")]
    finally:
        db.close()
    return [e for e in evs if e.get("type") == "workload.refused"]


class Hook:
    """Runs the hook binary and keeps the table of cases."""

    def __init__(self, c, agent, lab):
        self.c, self.agent, self.lab = c, agent, lab
        self.rows = []          # (case, call, expected, outcome, ok)
        self.allowed_ms = []    # wall time of asked-and-allowed runs

    def run(self, name, op, sub, xml, socket=None, config=None, extra="-", env=None):
        args = [self.agent, "libvirt-hook", "--config", config or self.lab.cfg, *(["--socket", socket] if socket else []),
                "--", name, op, sub, extra]
        t0 = time.perf_counter()
        p = subprocess.run(args, input=xml, capture_output=True, text=True, timeout=30,
                           env={"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", **(env or {})})
        ms = (time.perf_counter() - t0) * 1000
        return p.returncode, [l for l in p.stderr.splitlines() if l], ms

    def case(self, case, name, op, sub, xml, want_rc, want_lines=None, startswith=None, socket=None, config=None,
             asked_allowed=False):
        """One case: exit status and stderr lines (exactly `want_lines`, or one line starting
        with `startswith`)."""
        rc, lines, ms = self.run(name, op, sub, xml, socket=socket, config=config)
        ok = rc == want_rc
        if want_lines is not None:
            ok = ok and lines == want_lines
        if startswith is not None:
            ok = ok and len(lines) == 1 and lines[0].startswith(startswith)
        self.c.check(f"{case}: exit {want_rc}" + (f", {len(want_lines)} stderr line(s)" if want_lines is not None else ""),
                     ok, f"exit {rc}, stderr {lines}; want {want_lines if want_lines is not None else startswith}")
        if asked_allowed and rc == 0:
            self.allowed_ms.append(ms)
        outcome = f"exit {rc}" + (": " + " / ".join(lines) if lines else "")
        self.rows.append((case, f"{op} {sub}", outcome, f"{ms:.1f}", "ok" if ok else "FAIL"))
        return rc, lines

    def table(self):
        print("\n| case | call | outcome (exit, stderr) | ms | check |\n| --- | --- | --- | --- | --- |")
        for r in self.rows:
            print("| " + " | ".join(x.replace("|", "\\|") for x in r) + " |")
        if self.allowed_ms:
            s = sorted(self.allowed_ms)
            print(f"\n# allowed starts that asked the agent: {len(s)} runs, median {statistics.median(s):.1f} ms, "
                  f"max {s[-1]:.1f} ms (process start to exit, this machine)", flush=True)


def refused(name, unit, code):
    return f"gpunode: domain {name} refused: {unit}: {code}: "


def lines_like(lines, prefixes):
    return len(lines) == len(prefixes) and all(l.startswith(p) for l, p in zip(lines, prefixes))


def reload(lab, mode, when_down="deny"):
    """Rewrites agent.yaml with enforcement.mode MODE and SIGHUPs the agent; waits for its reload line."""
    before = len(lab.log())
    lab.write_config(config_text(lab, mode, when_down))
    lab.signal(signal.SIGHUP)
    deadline = time.time() + 10
    while time.time() < deadline:
        if "reloaded:" in lab.log()[before:]:
            return True
        time.sleep(0.05)
    return False


def config_text(lab, mode="enforce", when_down="deny", socket=None):
    text = lab.config_text() + f"enforcement:\n  mode: {mode}\n  when_agent_down: {when_down}\n"
    if socket:
        text = text.replace(f"socket: {lab.sock}", f"socket: {socket}")
    return text


# A stand-in for the agent that allows everything: the server a hostile local user would put at the
# socket. It binds, drops to UID if given (SO_PEERCRED reports who called listen()), then answers.
FAKE_AGENT = r"""
import os, socket, sys
path, uid = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
s.bind(path)
os.chmod(path, 0o777)
if uid >= 0:
    os.setgroups([]); os.setgid(uid); os.setuid(uid)
s.listen(16)
body = b'{"allowed": true, "mode": "enforce", "unitIds": [], "reasons": []}'
while True:
    conn, _ = s.accept()
    conn.recv(1 << 20)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    conn.close()
"""


def fake_agent(path, uid=-1):
    proc = subprocess.Popen([sys.executable, "-c", FAKE_AGENT, path, str(uid)])
    deadline = time.time() + 10
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)  # listen() follows the bind
    return proc


def shipped_hook(lab, agent):
    """packaging/libvirt/50-gpunode, naming this build's binary and the lab's socket and config."""
    with open(os.path.join(os.path.dirname(L.HERE), "..", "packaging", "libvirt", "50-gpunode")) as f:
        text = f.read()
    assert 'exec /usr/bin/gpunode-agent libvirt-hook -- "$@"' in text, "the shipped hook changed its exec line"
    text = (text.replace("/usr/bin/gpunode-agent libvirt-hook --", f"{agent} libvirt-hook --socket {lab.sock} --config {lab.cfg} --")
            .replace("/usr/bin/gpunode-agent", agent))
    path = os.path.join(lab.dir, "50-gpunode")
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


def loaded_objects(h, name, xml, config):
    """Runs the hook once with ld.so's LD_DEBUG=files: its exit and the shared objects it loaded."""
    out = os.path.join(h.lab.dir, f"ld-debug-{name}")
    rc, _, _ = h.run(name, "prepare", "begin", xml, config=config, env={"LD_DEBUG": "files", "LD_DEBUG_OUTPUT": out})
    names = set()
    for path in glob.glob(out + ".*"):
        with open(path, errors="replace") as f:
            names |= {os.path.basename(m) for m in re.findall(r"file=(\S+)", f.read())}
        os.unlink(path)
    return rc, names


def sanitized(executable):
    """Whether the executable was built with ASan or TSan: their runtimes' entry points are in it
    (clang's static ASan) or named among its dynamic symbols (GCC's shared runtimes)."""
    with open(executable, "rb") as f:
        body = f.read()
    return b"__asan_init" in body or b"__tsan_init" in body


def settings_cache(c, h, lab, dom):
    """hook_settings.hpp: the hook takes admin.socket and when_agent_down from a cache of agent.yaml
    keyed by the file's bytes; each version of the file is obeyed at once, and a hit maps neither
    the agent's config reader (gpunode-agent-tools.so) nor yaml-cpp. Run with the agent down, so
    when_agent_down is the answer."""
    flip = os.path.join(lab.dir, "hook-flip.yaml")
    xml = dom("flip", (OUTSIDER, "on-demand"), [U24])

    def write_in_place(when):
        with open(flip, "w") as f:
            f.write(config_text(lab, when_down=when))

    def write_by_rename(when):
        with open(flip + ".new", "w") as f:
            f.write(config_text(lab, when_down=when))
        os.replace(flip + ".new", flip)

    cached = os.geteuid() == 0  # /run/gpunode-hook is made by root (the hook runs as root under libvirtd)
    write_in_place("deny")
    rc, objs = loaded_objects(h, "flip", xml, flip)
    c.check("settings cache: deny, first read (a miss) loads the agent's config reader",
            rc == 1 and "gpunode-agent-tools.so" in objs, (rc, sorted(objs)))
    rc, objs = loaded_objects(h, "flip", xml, flip)
    if cached:
        c.check("settings cache: deny again, from the cache: neither the config reader nor yaml-cpp is mapped",
                rc == 1 and "gpunode-agent-tools.so" not in objs and not any("yaml" in o for o in objs), (rc, sorted(objs)))
        # The hook maps libc alone (module_abi.hpp); a sanitizer build keeps the shared C++ runtime
        # (and libvirt, vmctl/CMakeLists.txt). Told by the executable itself: clang links ASan's
        # runtime statically, so no sanitizer library shows among the objects mapped.
        if sanitized(h.agent):
            print(f"# a sanitizer build keeps the shared C++ runtime: the hook maps {sorted(objs)}", flush=True)
        else:
            c.check("settings cache: a call that asks maps no C++ runtime or library of its own",
                    not (objs - {"libc.so.6"}), sorted(objs))
    else:
        print("# not root: /run/gpunode-hook cannot be made, every call reads agent.yaml", flush=True)
    write_in_place("allow")  # the same file, rewritten at once
    rc, _ = loaded_objects(h, "flip", xml, flip)
    c.check("settings cache: the file rewritten in place to allow: obeyed at once", rc == 0, rc)
    rc2, objs = loaded_objects(h, "flip", xml, flip)
    c.check("settings cache: allow, cached: still allow, from the cache", rc2 == 0 and
            (not cached or "gpunode-agent-tools.so" not in objs), (rc2, sorted(objs)))
    write_by_rename("deny")  # a new file put in its place, as configuration tools write
    rc, _ = loaded_objects(h, "flip", xml, flip)
    c.check("settings cache: a new file renamed into place saying deny: obeyed at once", rc == 1, rc)
    with open(flip, "a") as f:
        f.write("enforcement: [\n")  # now invalid YAML
    rc, lines, _ = h.run("flip", "prepare", "begin", xml, config=flip)
    c.check("settings cache: the file made invalid: refused, naming it", rc == 1 and len(lines) == 1 and
            lines[0].startswith(f"gpunode: domain flip refused: {flip} is invalid: "), (rc, lines))
    if cached:
        entries = os.listdir("/run/gpunode-hook")
        mode = os.stat("/run/gpunode-hook").st_mode & 0o777
        c.check(f"settings cache: /run/gpunode-hook is 0700 and holds at most 16 entries ({len(entries)})",
                mode == 0o700 and 0 < len(entries) <= 16 and all(e.startswith("settings-") for e in entries), (oct(mode), entries))


def fails_closed(c, lab, agent, dom):
    """CONTRACT §9: an error of the hook's own before an answer refuses: stdin it cannot read, the
    config reader it cannot load (a half-installed package). A call that never asks still exits 0."""
    xml = dom("closed", (OUTSIDER, "on-demand"), [U24])
    args = [agent, "libvirt-hook", "--config", lab.cfg, "--", "closed", "prepare", "begin", "-"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=30,
                       preexec_fn=lambda: os.close(0))
    c.check("stdin closed: refused (exit 1), naming why", p.returncode == 1 and
            "cannot read the domain XML on stdin" in p.stderr, (p.returncode, p.stderr))
    alone = os.path.join(lab.dir, "alone")
    os.makedirs(alone, exist_ok=True)
    shutil.copy2(agent, os.path.join(alone, "gpunode-agent"))  # no modules beside it, none in ../lib
    # The hook is the executable itself: with its settings cached (by the runs above; only root has
    # the cache), it loads nothing and answers as the installed one does.
    if os.geteuid() == 0:
        ref = subprocess.run(args, input=xml, capture_output=True, text=True, timeout=30)
        p = subprocess.run([os.path.join(alone, "gpunode-agent"), *args[1:]], input=xml, capture_output=True,
                           text=True, timeout=30)
        c.check("no module installed, the settings cached: the hook answers as the installed one does",
                p.returncode == ref.returncode and ".so" not in p.stderr, (p.returncode, p.stderr, ref.returncode))
    else:
        print("# not root: no settings cache, so the module-less hook's cached answer is not tried", flush=True)
    # A config it has not read before (other bytes: a miss) needs the agent's config reader, in a module.
    fresh = os.path.join(lab.dir, "hook-fresh.yaml")
    with open(fresh, "w") as f:
        f.write(config_text(lab, when_down="allow") + "# not cached yet\n")
    p = subprocess.run([os.path.join(alone, "gpunode-agent"), "libvirt-hook", "--config", fresh, *args[4:]],
                       input=xml, capture_output=True, text=True, timeout=30)
    c.check("the config reader's module missing on a cache miss: refused (exit 1), naming it, whatever "
            "when_agent_down says", p.returncode == 1 and "gpunode-agent-tools.so" in p.stderr and "refused" in p.stderr,
            (p.returncode, p.stderr))
    p = subprocess.run([os.path.join(alone, "gpunode-agent"), *args[1:-3], "stopped", "end", "-"], input=xml,
                       capture_output=True, text=True, timeout=30)
    c.check("no module installed, a call that never asks: exit 0", p.returncode == 0, (p.returncode, p.stderr))


def attacks(c, h, lab, agent, dom):
    """CONTRACT §9: a domain's name never switches enforcement off; an untrusted server is no agent."""
    fails_closed(c, lab, agent, dom)
    hook = shipped_hook(lab, agent)
    for name in ("--", "--help", "-h", "--socket=x", f"--config={lab.dir}/evil.yaml"):
        xml = dom(name, (OUTSIDER, "on-demand"), [U43])
        p = subprocess.run([hook, name, "prepare", "begin", "-"], input=xml, capture_output=True, text=True, timeout=30)
        c.check(f"the shipped 50-gpunode, a domain named {name!r} on a reserved unit: asked and refused (exit 1)",
                p.returncode == 1 and p.stderr.startswith(refused(name, U43, "unit-reserved")), (p.returncode, p.stderr))
        # An older 50-gpunode passed no `--`: the same names cannot shift the arguments; they refuse.
        p = subprocess.run([agent, "libvirt-hook", name, "prepare", "begin", "-"], input=xml, capture_output=True, text=True,
                           timeout=30)
        c.check(f"without '--', a domain named {name!r}: refused (exit 1, fails closed)",
                p.returncode == 1 and p.stderr.startswith("gpunode: "), (p.returncode, p.stderr))

    # A server in a directory anyone may write to (where a hostile user could have bound first).
    open_dir = os.path.join(lab.dir, "open")
    os.makedirs(open_dir)
    os.chmod(open_dir, 0o1777)
    sock = os.path.join(open_dir, "admin.sock")
    fake = fake_agent(sock)
    try:
        h.case("a server in a world-writable directory (it would allow): untrusted, deny", "untrusted-dir", "prepare", "begin",
               dom("untrusted-dir", (OUTSIDER, "on-demand"), [U43]), 1, socket=sock,
               startswith=f"gpunode: agent unreachable at {sock}: an untrusted server (its directory {open_dir} is writable by others")
    finally:
        fake.kill()
        fake.wait()
    if os.geteuid() != 0:
        c.check("SKIP: a server of another uid needs root", True)
        return
    # A server of another uid in root's directory.
    own_dir = os.path.join(lab.dir, "rootdir")
    os.makedirs(own_dir)
    os.chmod(own_dir, 0o755)
    sock = os.path.join(own_dir, "admin.sock")
    fake = fake_agent(sock, 65534)
    try:
        h.case("a server running as nobody in root's directory (it would allow): untrusted, deny", "untrusted-uid", "prepare",
               "begin", dom("untrusted-uid", (OUTSIDER, "on-demand"), [U43]), 1, socket=sock,
               startswith=f"gpunode: agent unreachable at {sock}: an untrusted server (it is served by uid 65534")
    finally:
        fake.kill()
        fake.wait()


def body(c, agent):
    with L.Lab(agent) as lab:
        lab.write_config(config_text(lab))
        lab.start()
        h = Hook(c, agent, lab)
        admin, mgr = lab.admin(), lab.token(org=MGR)

        # Reservations over the HTTPS API: 23 and 43 for org-aud (managed by org-mgr), 23 released
        # to the spot market; 81 reserved from tomorrow (scheduled: holds nothing yet); 24 free.
        end = L.rfc3339(time.time() + 86400 * 7)
        r = lab.create(admin, unitIds=[U23, U43], audienceOrgIds=[AUD], managingOrgIds=[MGR], endsAt=end)
        c.status("create the reservation of 23 and 43 for org-aud (HTTPS)", r, 201)
        rid = (r.json or {}).get("id", "")
        r = lab.call("POST", lab.npath(f"/reservations/{rid}/release"), token=mgr, body={"unitIds": [U23]})
        c.status("release 23 to the spot market as the manager (HTTPS)", r, 200)
        r = lab.create(admin, unitIds=[U81], audienceOrgIds=[AUD], startsAt=L.rfc3339(time.time() + 86400),
                       endsAt=end)
        c.status("create a scheduled reservation of 81 (starts tomorrow)", r, 201)

        ask = ("prepare", "begin")
        ev0 = len(refused_events(lab))

        # -- the entitlement table (§4), enforce mode, prepare begin ---------------------------
        def dom(name, label, units=(), extra=()):
            return domain_xml(name, label, [a for u in units for a in GPU[u]] + list(extra))

        rows = [
            ("on-demand, free unit", "od-free", (OUTSIDER, "on-demand"), [U24], 0, []),
            ("on-demand, reserved unit", "od-reserved", (OUTSIDER, "on-demand"), [U43], 1, [(U43, "unit-reserved")]),
            ("on-demand, unit of a scheduled reservation", "od-sched", (OUTSIDER, "on-demand"), [U81], 0, []),
            ("reserved, in the audience, held unit", "rsv-aud", (AUD, "reserved"), [U43], 0, []),
            ("reserved, outside the audience", "rsv-out", (OUTSIDER, "reserved"), [U43], 1, [(U43, "not-in-audience")]),
            ("reserved, in the audience, released unit", "rsv-rel", (AUD, "reserved"), [U23], 1, [(U23, "unit-released")]),
            ("reserved, unit of no reservation", "rsv-none", (AUD, "reserved"), [U24], 1, [(U24, "not-reserved")]),
            ("spot, released unit", "spot-rel", (OUTSIDER, "spot"), [U23], 0, []),
            ("spot, held unreleased unit", "spot-held", (OUTSIDER, "spot"), [U43], 1, [(U43, "not-released")]),
            ("spot, unit of no reservation", "spot-none", (OUTSIDER, "spot"), [U24], 1, [(U24, "not-released")]),
            ("unlabelled, free unit", "nolabel-free", None, [U24], 0, []),
            ("unlabelled, reserved unit", "nolabel-rsv", None, [U43], 1, [(U43, "unit-reserved")]),
            ("spanning two units, one refused (spot on 23 released + 43 held)", "span-one", (OUTSIDER, "spot"),
             [U23, U43], 1, [(U43, "not-released")]),
            ("spanning two units, both refused (on-demand on 23 + 43)", "span-two", (OUTSIDER, "on-demand"),
             [U23, U43], 1, [(U23, "unit-reserved"), (U43, "unit-reserved")]),
        ]
        refusals = 0
        for case, name, label, units, rc, reasons in rows:
            _, lines = h.case(case, name, *ask, dom(name, label, units), rc, asked_allowed=rc == 0)
            c.check(f"{case}: the lines name unit and code", lines_like(lines, [refused(name, u, code) for u, code in reasons]),
                    lines)
            refusals += 1 if reasons else 0

        # Devices that are no sellable unit.
        _, lines = h.case("a GPU of no unit (the BMC's VGA 62:00.0)", "gpu-nounit", *ask,
                          dom("gpu-nounit", (OUTSIDER, "on-demand"), extra=[BMC_VGA]), 1)
        c.check("... unknown-unit naming the address", lines_like(lines, [refused("gpu-nounit", "-", "unknown-unit")])
                and BMC_VGA in lines[0], lines)
        _, lines = h.case("a hostdev that is no PCI function of the node (99:00.0)", "no-such", *ask,
                          dom("no-such", (OUTSIDER, "on-demand"), extra=[NO_SUCH]), 1)
        c.check("... unknown-unit", lines_like(lines, [refused("no-such", "-", "unknown-unit")]), lines)
        _, lines = h.case("a GPU of a unit that is not sellable (c1:00.0)", "not-sellable", *ask,
                          dom("not-sellable", (OUTSIDER, "on-demand"), extra=[NOT_SELLABLE_GPU]), 1)
        c.check("... not-sellable", lines_like(lines, [refused("not-sellable", "u-0000-c1-00-0", "not-sellable")]), lines)
        h.case("a NIC hostdev only (e2:00.0, not a GPU)", "nic-only", *ask,
               dom("nic-only", (OUTSIDER, "on-demand"), extra=[NIC]), 0, [], asked_allowed=True)
        refusals += 3

        # migrate and restore begin ask too.
        for op in ("migrate", "restore"):
            _, lines = h.case(f"{op} begin, on-demand on a reserved unit", f"{op}-rsv", op, "begin",
                              dom(f"{op}-rsv", (OUTSIDER, "on-demand"), [U43]), 1)
            c.check(f"{op} begin: refused line", lines_like(lines, [refused(f"{op}-rsv", U43, "unit-reserved")]), lines)
            refusals += 1

        # --socket over the config's socket; the config's socket when there is no --socket.
        bogus_cfg = os.path.join(lab.dir, "hook-bogus-socket.yaml")
        bogus_sock = os.path.join(lab.dir, "nobody-here.sock")
        with open(bogus_cfg, "w") as f:
            f.write(config_text(lab, socket=bogus_sock))
        _, lines = h.case("--socket overrides the config's admin.socket (refused case)", "sock-flag", *ask,
                          dom("sock-flag", (OUTSIDER, "on-demand"), [U43]), 1, socket=lab.sock, config=bogus_cfg)
        c.check("--socket: the agent answered (the refusal, not unreachable)",
                lines_like(lines, [refused("sock-flag", U43, "unit-reserved")]), lines)
        refusals += 1
        h.case("admin.socket from --config (a socket nobody serves, deny)", "sock-config", *ask,
               dom("sock-config", (OUTSIDER, "on-demand"), [U24]), 1,
               startswith=f"gpunode: agent unreachable at {bogus_sock}: ", config=bogus_cfg)

        # The refusals so far are workload.refused events in the outbox, each with its reasons.
        evs = refused_events(lab)[ev0:]
        c.eq("outbox: one workload.refused event per refused ask (enforce)", len(evs), refusals)
        e = next((x.get("data") or {} for x in evs if (x.get("data") or {}).get("name") == "span-two"), {})
        c.eq("workload.refused of span-two: org, tier, vmId, units, codes, mode",
             (e.get("org"), e.get("tier"), e.get("vmId"), e.get("unitIds"),
              sorted((r.get("unitId"), r.get("code")) for r in e.get("reasons") or []), e.get("mode")),
             (OUTSIDER, "on-demand", "vm-span-two", [U23, U43], [(U23, "unit-reserved"), (U43, "unit-reserved")], "enforce"))
        e = next((x.get("data") or {} for x in evs if (x.get("data") or {}).get("name") == "nolabel-rsv"), {})
        c.eq("workload.refused of the unlabelled domain: no org, on-demand, no vmId",
             (e.get("org"), e.get("tier"), e.get("vmId")), (None, "on-demand", None))
        c.check("agent log: a warning line per refusal (DOMAIN=span-two)",
                bool(lab.log_line("warning", "DOMAIN=span-two")), lab.tail(600))

        attacks(c, h, lab, agent, dom)
        _, lines = h.case("enforce, 2 MiB of metadata: decided (refused), not 413", "big-enforce", *ask,
                          padded(dom("big-enforce", (OUTSIDER, "on-demand"), [U43])), 1)
        c.check("... the refusal line", lines_like(lines, [refused("big-enforce", U43, "unit-reserved")]), lines)
        h.case("enforce, 2 MiB of metadata on a free unit: allowed", "big-ok", *ask,
               padded(dom("big-ok", (OUTSIDER, "on-demand"), [U24])), 0, [])
        # Too large to be asked about: refused whatever when_agent_down says (the agent is not down,
        # and whoever defines the domain chooses its size), never judged on a part.
        big_allow = os.path.join(lab.dir, "hook-big-allow.yaml")
        with open(big_allow, "w") as f:
            f.write(config_text(lab, when_down="allow"))
        for cfg_label, cfg in (("deny", None), ("allow", big_allow)):
            _, lines = h.case(f"a domain's XML over 16 MiB (when_agent_down: {cfg_label}): refused", "huge", *ask,
                              padded(dom("huge", (OUTSIDER, "on-demand"), [U24]), 16 * 1024 * 1024 + 1), 1, config=cfg)
            c.check("... the line says the XML is over the 16777216 bytes the agent takes",
                    lines == ["gpunode: domain huge refused: its XML is larger, over the 16777216 bytes the agent takes"], lines)
            # Under 16 MiB of XML, but newlines double as JSON escapes: the request would be over.
            newlines = dom("huge-nl", (OUTSIDER, "on-demand"), [U24]).replace(
                "<memory ", "<description>" + "\n" * (9 * 1024 * 1024) + "</description>\n  <memory ", 1)
            _, lines = h.case(f"a domain whose admission request is over 16 MiB (when_agent_down: {cfg_label}): refused",
                              "huge-nl", *ask, newlines, 1, config=cfg)
            c.check("... the line names the request's size", len(lines) == 1 and
                    lines[0].startswith("gpunode: domain huge-nl refused: its admission request is ")
                    and lines[0].endswith("bytes, over the 16777216 bytes the agent takes"), lines)
        # A hostdev past the first 16 MiB is not missed: the XML is refused, not scanned in part.
        hidden = padded(dom("hidden", (OUTSIDER, "on-demand"), [U43]), 16 * 1024 * 1024 + 1)
        h.case("a PCI hostdev after 16 MiB of metadata (when_agent_down: allow): refused", "hidden", *ask, hidden, 1,
               config=big_allow)
        # Without any hostdev a domain never asks, at any size (§9): 17 MiB of metadata starts.
        h.case("17 MiB of metadata and no hostdev: never asks, exit 0", "plain-huge", *ask,
               padded(domain_xml("plain-huge", (OUTSIDER, "on-demand")), 17 * 1024 * 1024), 0, [])

        # -- the race: a start let through holds its unit against a create (up to 120 s) -------
        h.case("on-demand on free 24 (then a create on 24)", "race-24", *ask,
               dom("race-24", (OUTSIDER, "on-demand"), [U24]), 0, [], asked_allowed=True)
        r = lab.create(admin, unitIds=[U24], audienceOrgIds=[AUD], endsAt=end)
        c.problem("create on 24 while race-24 is starting (let through, not yet running): 409 unit-occupied",
                  r, 409, "unit-occupied")
        c.check("... naming the starting domain", "race-24" in json.dumps(r.json), r)

        # -- modes, switched by SIGHUP -----------------------------------------------------------
        c.check("SIGHUP with enforcement.mode: audit reloads", reload(lab, "audit"), lab.tail(400))
        before = len(lab.log())
        n0 = len(refused_events(lab))
        _, lines = h.case("audit mode: on-demand on a reserved unit", "audit-rsv", *ask,
                          dom("audit-rsv", (OUTSIDER, "on-demand"), [U43]), 0)
        c.check("audit: one stderr line saying it would be refused, let start",
                len(lines) == 1 and "would be refused" in lines[0] and "unit-reserved" in lines[0], lines)
        c.check("audit: the agent logs the refusal (audit mode: let start)",
                bool(lab.log_line("DOMAIN=audit-rsv", "audit mode", since=before)), lab.tail(600))
        evs = refused_events(lab)[n0:]
        c.eq("audit: one workload.refused event with mode audit", [(x["data"].get("name"), x["data"].get("mode")) for x in evs],
             [("audit-rsv", "audit")])
        _, lines = h.case("audit mode, 2 MiB of metadata: decided (would be refused), let start", "big-audit", *ask,
                          padded(dom("big-audit", (OUTSIDER, "on-demand"), [U43])), 0)
        c.check("... would be refused", len(lines) == 1 and "would be refused" in lines[0], lines)
        h.case("audit mode: spot on a released unit", "audit-ok", *ask, dom("audit-ok", (OUTSIDER, "spot"), [U23]), 0, [],
               asked_allowed=True)
        metrics = lab.call("GET", "/metrics", unix=True)
        line = next((l for l in metrics.body.decode(errors="replace").splitlines()
                     if l.startswith("gpunode_domain_admissions_total") and "audit-refused" in l), None)
        if line is None:
            print("# /metrics has no gpunode_domain_admissions_total yet (the metrics component serves it): "
                  "the audit count is not checked here", flush=True)
        else:
            c.check(f"audit: counted ({line})", line.split()[-1] not in ("0", "0.0"), line)

        c.check("SIGHUP with enforcement.mode: off reloads", reload(lab, "off"), lab.tail(400))
        n0 = len(refused_events(lab))
        h.case("off mode: on-demand on a reserved unit", "off-rsv", *ask, dom("off-rsv", (OUTSIDER, "on-demand"), [U43]), 0, [])
        h.case("off mode, 2 MiB of metadata: allowed", "big-off", *ask, padded(dom("big-off", (OUTSIDER, "on-demand"), [U43])), 0, [])
        h.case("off mode: a GPU of no unit", "off-nounit", *ask, dom("off-nounit", (OUTSIDER, "on-demand"), extra=[BMC_VGA]),
               0, [])
        c.eq("off: no workload.refused event", len(refused_events(lab)) - n0, 0)

        c.check("SIGHUP with enforcement.mode: enforce reloads", reload(lab, "enforce"), lab.tail(400))
        _, lines = h.case("enforce again: on-demand on a reserved unit", "enforce-rsv", *ask,
                          dom("enforce-rsv", (OUTSIDER, "on-demand"), [U43]), 1)
        c.check("enforce again: the refusal line", lines_like(lines, [refused("enforce-rsv", U43, "unit-reserved")]), lines)

        # -- never asking: the agent stopped, when_agent_down deny --------------------------------
        rc, _ = lab.stop()
        c.eq("the agent stops on SIGTERM", rc, 0)
        refused_xml = dom("quiet", (OUTSIDER, "on-demand"), [U43])
        h.case("no hostdev (agent stopped, deny): never asks", "no-hostdev", *ask, domain_xml("no-hostdev", (OUTSIDER, "spot")),
               0, [])
        h.case("no hostdev, unlabelled (agent stopped, deny)", "no-hostdev-2", *ask, domain_xml("no-hostdev-2"), 0, [])
        for op, sub in (("start", "begin"), ("started", "begin"), ("stopped", "end"), ("release", "end"),
                        ("reconnect", "begin"), ("prepare", "end"), ("migrate", "end")):
            h.case(f"{op} {sub} of a domain that would be refused (agent stopped)", "quiet", op, sub, refused_xml, 0, [])

        # -- the agent down, both ways --------------------------------------------------------------
        h.case("agent down, when_agent_down: deny", "down-deny", *ask, dom("down-deny", (OUTSIDER, "on-demand"), [U24]), 1,
               startswith=f"gpunode: agent unreachable at {lab.sock}: ")
        allow_cfg = os.path.join(lab.dir, "hook-allow.yaml")
        with open(allow_cfg, "w") as f:
            f.write(config_text(lab, when_down="allow"))
        _, lines = h.case("agent down, when_agent_down: allow", "down-allow", *ask,
                          dom("down-allow", (OUTSIDER, "on-demand"), [U43]), 0,
                          startswith=f"gpunode: agent unreachable at {lab.sock}: ", config=allow_cfg)
        c.check("allow: the line says it was allowed", bool(lines) and "allow" in lines[0], lines)
        settings_cache(c, h, lab, dom)

        h.table()


if __name__ == "__main__":
    sys.exit(L.run_main("hook", body))
