#!/usr/bin/env python3
"""Reload that says whether it took, and the files a config names (CONTRACT §1, §11):

- `gpunode-agent reload` and `POST /v1/admin/reload` on the admin socket: 0 / 200 with
  `restartNeeded` when it took, 1 / 422 `reload-refused` with every problem when the new config (or a
  file it names) is refused and the running one is kept, 3 when nobody answers; not a route of HTTPS;
- a reload that narrows access closes the connections already open that lost it (CONTRACT §10):
  uid 65534 of a removed admin.allowed_group, HTTPS clients without a certificate a new client CA
  accepts; the connections still admitted are kept;
- `check-config --files`: each file the config names that the calling user cannot use, as
  `FILE:LINE:COLUMN: PATH: why` at the value's own position (missing, permission, a directory, not a
  PEM of the right kind, a key of another certificate, a state.dir it cannot write); the agent's
  start refuses with the same lines.

Usage: reload_test.py PATH/TO/gpunode-agent
"""
import grp
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lab as L  # noqa: E402


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=90, **kw)


def position(text, needle):
    """LINE:COLUMN (1-based) of the first `needle` in text."""
    before = text[:text.index(needle)]
    return f"{before.count(chr(10)) + 1}:{len(before) - before.rfind(chr(10))}"


def reload_command(c, lab):
    agent, cfg = lab.agent, lab.cfg
    units = lab.npath("/units")
    admin = lab.admin()

    # Took: a new unsellable unit shows at once; the command says so and exits 0.
    unit = L.RESERVABLE[0]
    good = lab.config_text().replace("unsellable_units: []", f"unsellable_units: [{unit}]")
    lab.write_config(good)
    p = run([agent, "reload", "--config", cfg])
    c.eq("reload (a valid change): exit 0", p.returncode, 0)
    c.check("reload: says reloaded on stdout, nothing on stderr", "reloaded" in p.stdout and not p.stderr, p.stdout + p.stderr)
    listed = {u["id"]: u for u in lab.get(units, admin).json["units"]}
    c.check(f"reload took: {unit} is no longer reservable", listed[unit]["reservable"] is False, listed[unit])
    # The token keys, at the start and at each reload: their count and their kids (RFC 7638
    # thumbprints, 43 base64url characters), so that a rollover can be followed in the log.
    keys = [line for line in lab.log().splitlines() if "token keys: " in line]
    kid = re.compile(r"token keys: 1 loaded \(kid [A-Za-z0-9_-]{43}\)")
    c.check("the log names the token keys at the start and at the reload (1 key, its kid)",
            len(keys) == 2 and all(kid.search(line) for line in keys), keys)

    # Took, with a key that needs a restart: named, exit 0; the answer lists it.
    moved = good.replace(f'listen: "127.0.0.1:{lab.port}"', f'listen: "127.0.0.1:{L.free_port()}"')
    lab.write_config(moved)
    r = lab.call("POST", "/v1/admin/reload", unix=True, body={})
    c.status("POST /v1/admin/reload (api.listen changed) -> 200", r, 200)
    c.eq("... {reloaded: true, restartNeeded: [api.listen]}", r.json, {"reloaded": True, "restartNeeded": ["api.listen"]})
    p = run([agent, "reload", "--config", cfg])
    c.check("reload with api.listen changed: exit 0, stderr names api.listen",
            p.returncode == 0 and "api.listen" in p.stderr, p.stdout + p.stderr)
    c.status("... HTTPS still on the old port", lab.get("/healthz"), 200)

    # Refused: an invalid file. Exit 1, every problem with its position; the running config kept.
    bad = good.replace("level: info", "level: loud").replace("rescan_interval: 30s", "rescan_interval: soon")
    lab.write_config(bad)
    p = run([agent, "reload", "--config", cfg])
    c.eq("reload (invalid config): exit 1", p.returncode, 1)
    want = [f"{cfg}:{position(bad, 'soon')}:", f"{cfg}:{position(bad, 'loud')}:"]  # in file order
    c.check("reload refused: stderr names both problems at FILE:LINE:COLUMN",
            all(w in p.stderr for w in want) and "refused" in p.stderr, (want, p.stderr))
    r = lab.call("POST", "/v1/admin/reload", unix=True, body={})
    c.problem("POST /v1/admin/reload (invalid config) -> 422 reload-refused", r, 422, "reload-refused")
    fields = [e.get("field") for e in (r.json or {}).get("errors", [])]
    c.eq("... errors: one per problem, field FILE:LINE:COLUMN", fields, [w.rstrip(":") for w in want])
    c.check("refused: the log says so", lab.log_line("reload refused") != "", lab.tail(400))
    listed = {u["id"]: u for u in lab.get(units, admin).json["units"]}
    c.check("refused: the running config is kept (the unit is still unsellable)", listed[unit]["reservable"] is False, listed[unit])

    # Refused: a valid file naming a key that is not there.
    missing = good.replace(f"{lab.dir}/tls.key", f"{lab.dir}/gone.key")
    lab.write_config(missing)
    p = run([agent, "reload", "--config", cfg])
    c.check("reload (TLS key missing): exit 1 naming the key at its position",
            p.returncode == 1 and f"{cfg}:{position(missing, lab.dir + '/gone.key')}: {lab.dir}/gone.key: missing" in p.stderr,
            p.stderr)
    c.status("... HTTPS serves on with the old key", lab.get("/healthz"), 200)
    lab.write_config(good)

    # Not on HTTPS; not GET.
    r = lab.call("POST", "/v1/admin/reload", token=admin, body={})
    c.status("POST /v1/admin/reload over HTTPS (admin token) -> 404", r, 404)
    r = lab.call("POST", "/v1/admin/reload", body={})
    c.status("POST /v1/admin/reload over HTTPS without a token -> 401", r, 401)
    r = lab.call("GET", "/v1/admin/reload", unix=True)
    c.status("GET /v1/admin/reload on the admin socket -> 405", r, 405)
    c.eq("... Allow: POST", r.h("Allow"), "POST")

    # Unreachable: exit 3 and why.
    elsewhere = os.path.join(lab.dir, "elsewhere.yaml")
    with open(elsewhere, "w") as f:
        f.write(good.replace(lab.sock, os.path.join(lab.dir, "nobody.sock")))
    p = run([agent, "reload", "--config", elsewhere])
    c.check("reload with no agent on the socket: exit 3, names the socket",
            p.returncode == 3 and "nobody.sock" in p.stderr, p.stdout + p.stderr)
    p = run([agent, "reload", "--config", cfg])
    c.eq("reload of the good file again: exit 0", p.returncode, 0)


def check_files(c, lab):
    agent, d = lab.agent, lab.dir
    good = lab.config_text(client_ca=True)
    path = os.path.join(d, "files.yaml")

    def check(text, as_user=None):
        with open(path, "w") as f:
            f.write(text)
        return run([*(as_user or []), agent, "check-config", "--files", "--config", path])

    p = check(good)
    c.check("check-config --files, every file usable: exit 0, ok", p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr)
    p = run([agent, "check-config", "--config", path])
    c.eq("check-config without --files does not open them: exit 0", p.returncode, 0)

    shutil.copy(f"{d}/ed.pem", f"{d}/private.pem")
    os.makedirs(f"{d}/adir", exist_ok=True)
    with open(f"{d}/garbage.crt", "w") as f:
        f.write("not a certificate\n")
    cases = [
        ("api.tls.key missing", f"{d}/tls.key", f"{d}/nope.key", "missing"),
        ("api.tls.cert a directory", f"{d}/tls.crt", f"{d}/adir", "a directory, not a file"),
        ("api.tls.cert not PEM", f"{d}/tls.crt", f"{d}/garbage.crt", "not PEM certificates"),
        ("api.tls.key of another certificate", f"{d}/tls.key", f"{d}/ca.key", f"does not belong to the certificate in {d}/tls.crt"),
        ("auth.keys holding a private key", f"{d}/ed.pub", f"{d}/private.pem", "holds a private key"),
        ("api.tls.client_ca not PEM", f"{d}/ca.crt", f"{d}/garbage.crt", "not PEM certificates"),
    ]
    for label, old, new, why in cases:
        text = good.replace(old, new, 1)
        p = check(text)
        want = f"{path}:{position(text, new)}: {new}: {why}"
        c.check(f"--files, {label}: exit 1 and `{want[len(path):]}`",
                p.returncode == 1 and want in p.stderr.splitlines()[0] if p.stderr else False, p.stderr)

    text = good.replace(f"{d}/tls.key", f"{d}/nope.key").replace(f"{d}/ed.pub", f"{d}/nope.pub")
    p = check(text)
    lines = p.stderr.strip().splitlines()
    c.check("--files with two missing files: both, in file order", len(lines) == 2 and "nope.key" in lines[0]
            and "nope.pub" in lines[1], p.stderr)

    # The agent's start refuses with the same lines.
    lab.write_config(text)
    proc = run([agent, "run", "--config", lab.cfg])
    c.check("run with two missing files: refuses to start, naming both at their positions",
            proc.returncode == 1 and f"{lab.cfg}:{position(text, d + '/nope.key')}: {d}/nope.key: missing" in proc.stderr
            and f"{d}/nope.pub: missing" in proc.stderr, proc.stderr)
    lab.write_config()

    if os.geteuid() != 0:
        c.check("SKIP: permission checks need root (to run check-config as another user)", True)
        return
    # Permission: as nobody, a key only root may read is refused; state.dir it cannot write too.
    os.chmod(d, 0o755)
    for name in os.listdir(d):
        full = os.path.join(d, name)
        if os.path.isfile(full):
            os.chmod(full, 0o644)
    os.chmod(f"{d}/tls.key", 0o600)
    os.makedirs(lab.state, exist_ok=True)
    os.chmod(lab.state, 0o700)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    p = check(good, nobody)
    key_at = f"{path}:{position(good, d + '/tls.key')}: {d}/tls.key: permission denied: nobody (uid 65534) cannot read it"
    state_at = f"{path}:{position(good, lab.state)}: {lab.state}: permission denied: nobody (uid 65534) cannot write in it"
    c.check("--files as nobody: the 0600 root key is refused, naming the user", key_at in p.stderr, p.stderr)
    c.check("--files as nobody: the 0700 root state.dir is refused", state_at in p.stderr, p.stderr)
    c.eq("--files as nobody: exit 1", p.returncode, 1)
    p = check(good)
    c.eq("--files as root, the same files: exit 0", p.returncode, 0)
    os.chmod(f"{d}/tls.key", 0o600)


class Held:
    """One HTTP/1.1 connection kept open across a reload, with requests written on it by hand."""

    def __init__(self, sock):
        self.sock = sock
        self.sock.settimeout(10)
        self.buf = b""

    def ask(self, method, target, body=None, token=None):
        """The status of the answer on this connection, or None when the agent closed it instead."""
        data = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {target} HTTP/1.1\r\nHost: node\r\nContent-Length: {len(data)}\r\n"
        if data:
            head += "Content-Type: application/json\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        try:
            self.sock.sendall(head.encode() + b"\r\n" + data)
            while b"\r\n\r\n" not in self.buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return None
                self.buf += chunk
            head, _, rest = self.buf.partition(b"\r\n\r\n")
            m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            length = int(m.group(1)) if m else 0
            while len(rest) < length:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return None
                rest += chunk
            self.buf = rest[length:]
            return int(head.split(b" ", 2)[1])
        except (ConnectionError, ssl.SSLError, OSError):
            return None

    def close(self):
        self.sock.close()


def connect_as(uid, gid, path):
    """A connection to the admin socket made by a process of uid:gid (no supplementary groups), handed
    to this one: SO_PEERCRED names its maker."""
    parent, child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            socket.send_fds(child, [b"x"], [s.fileno()])
            code = 0
        finally:
            os._exit(code)
    os.waitpid(pid, 0)
    _, fds, _, _ = socket.recv_fds(parent, 1, 1)
    parent.close()
    child.close()
    return Held(socket.socket(fileno=fds[0]))


def open_connections(c, lab):
    """CONTRACT §10 "A reload takes away what it takes away": on connections already open."""
    if os.geteuid() != 0:
        c.check("SKIP: the admin socket's peers need root (a connection made as uid 65534)", True)
        return
    os.chmod(lab.dir, 0o711)  # uid 65534 reaches the admin socket through the lab's directory
    nogroup = grp.getgrnam("nogroup").gr_gid
    with_group = lab.config_text().replace("admin:\n", "admin:\n  allowed_group: nogroup\n")
    lab.write_config(with_group)
    lab.start()
    rsv = lab.npath("/reservations")
    held = connect_as(65534, nogroup, lab.sock)
    c.eq("uid 65534 of admin.allowed_group nogroup: GET reservations on its connection -> 200",
         held.ask("GET", rsv), 200)
    lab.write_config(lab.config_text())  # the group removed
    r = lab.call("POST", "/v1/admin/reload", unix=True, body={})
    c.status("POST /v1/admin/reload (admin.allowed_group removed) -> 200", r, 200)
    start = time.time() + 86400 * 40
    c.eq("the same connection, after the reload: GET reservations is not answered (closed)", held.ask("GET", rsv), None)
    created = held.ask("POST", rsv, body={"unitIds": [L.RESERVABLE[0]], "audienceOrgIds": ["org-a"],
                                          "startsAt": L.rfc3339(start), "endsAt": L.rfc3339(start + 3600)})
    c.eq("... nor a POST reservations (nothing created by local:65534)", created, None)
    c.check("... and no reservation of local:65534 exists",
            not [x for x in lab.audit_all() if x["actor"]["sub"] == "local:65534"], lab.audit_all()[-2:])
    held.close()
    c.check("the agent logs the connection it closed", lab.log_line("no longer admitted after a reload"), lab.tail())
    again = connect_as(65534, nogroup, lab.sock)
    c.eq("a new connection of uid 65534 is refused too", again.ask("GET", rsv), None)
    again.close()
    root = connect_as(os.getuid(), os.getgid(), lab.sock)
    lab.call("POST", "/v1/admin/reload", unix=True, body={})
    c.eq("root's connection, open across a second reload: still answered", root.ask("GET", rsv), 200)
    root.close()

    # HTTPS: a client CA added closes the connections whose client presented no certificate it accepts.
    token = lab.admin()
    bare = Held(lab.ctx.wrap_socket(socket.create_connection(("127.0.0.1", lab.port)), server_hostname="localhost"))
    c.eq("HTTPS without a client certificate (no client CA yet): GET units -> 200", bare.ask("GET", lab.npath("/units"), token=token), 200)
    lab.write_config(lab.config_text(client_ca=True))
    r = lab.call("POST", "/v1/admin/reload", unix=True, body={})
    c.status("POST /v1/admin/reload (api.tls.client_ca added) -> 200", r, 200)
    c.eq("the same HTTPS connection, after the reload: not answered (closed)", bare.ask("GET", lab.npath("/units"), token=token), None)
    bare.close()
    cert_ctx = lab.client_context(cert=True)
    with_cert = Held(cert_ctx.wrap_socket(socket.create_connection(("127.0.0.1", lab.port)), server_hostname="localhost"))
    c.eq("a new HTTPS connection with the CA's client certificate -> 200", with_cert.ask("GET", lab.npath("/units"), token=token), 200)
    r = lab.call("POST", "/v1/admin/reload", unix=True, body={})
    c.eq("... kept across a reload that keeps the client CA", (r.status, with_cert.ask("GET", lab.npath("/units"), token=token)), (200, 200))
    lab.make_ca("other-ca", "another client CA")
    lab.write_config(lab.config_text(client_ca=True).replace(f"{lab.dir}/ca.crt", f"{lab.dir}/other-ca.crt"))
    r = lab.call("POST", "/v1/admin/reload", unix=True, body={})
    c.eq("... closed by a reload to another client CA", (r.status, with_cert.ask("GET", lab.npath("/units"), token=token)), (200, None))
    with_cert.close()
    rc, _ = lab.stop()
    c.eq("SIGTERM after the reloads: exit 0", rc, 0)
    lab.write_config(lab.config_text())


def main(c, agent):
    with L.Lab(agent) as lab:
        lab.start()
        reload_command(c, lab)
        rc, _ = lab.stop()
        c.eq("SIGTERM after the reloads: exit 0", rc, 0)
        check_files(c, lab)
        open_connections(c, lab)


if __name__ == "__main__":
    sys.exit(L.run_main("reload", main))
