#!/usr/bin/env python3
"""Reload that says whether it took, and the files a config names (CONTRACT §1, §11):

- `gpunode-agent reload` and `POST /v1/admin/reload` on the admin socket: 0 / 200 with
  `restartNeeded` when it took, 1 / 422 `reload-refused` with every problem when the new config (or a
  file it names) is refused and the running one is kept, 3 when nobody answers; not a route of HTTPS;
- `check-config --files`: each file the config names that the calling user cannot use, as
  `FILE:LINE:COLUMN: PATH: why` at the value's own position (missing, permission, a directory, not a
  PEM of the right kind, a key of another certificate, a state.dir it cannot write); the agent's
  start refuses with the same lines.

Usage: reload_test.py PATH/TO/gpunode-agent
"""
import os
import re
import shutil
import subprocess
import sys

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


def main(c, agent):
    with L.Lab(agent) as lab:
        lab.start()
        reload_command(c, lab)
        rc, _ = lab.stop()
        c.eq("SIGTERM after the reloads: exit 0", rc, 0)
        check_files(c, lab)


if __name__ == "__main__":
    sys.exit(L.run_main("reload", main))
