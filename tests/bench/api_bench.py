#!/usr/bin/env python3
"""The API benchmark: the agent's HTTPS API on loopback, beside a bare SQLite commit and nginx.

    python3 tests/bench/api_bench.py BUILD_DIR

Sets up a lab the way the integration tests do (tests/integration/lab.py: the demo host, a
self-signed P-256 certificate, an Ed25519 token issuer, agent.yaml, a state dir under $TMPDIR or
/tmp), starts `BUILD_DIR/gpunode-agent run` with its default threads, mints a platform-admin
token, and runs BUILD_DIR/tests/bench/api_bench (the C++ client) for:

  1. GET /v1/nodes/{node}/units over TLS with keep-alive: p50/p99 on one connection, and
     requests/s from CONNS connections at once;
  2. POST /v1/nodes/{node}/reservations, in ROUNDS rounds: creates of consecutive one-hour terms a
     year ahead; creates of terms that start now, each then ended (POST .../end), on a second agent
     with libvirt's test driver (the occupancy check lists the domains); p50/p99 of each, and of an
     authenticated 404 asked between them on the same connection (create minus it: the commit's share);
  3. the reference for 2, in each round right after its creates: a bare SQLite WAL +
     synchronous=FULL commit of one 700-byte row, and of three (reservation + audit + outbox), in the
     lab dir, on the same filesystem as the state dir. Each round's ratio is its own share over its
     own bare commit; the table gives the median of the rounds' ratios;
  4. the agent's VmRSS / VmHWM at idle after start-up and after the load;
  5. nginx serving the same bytes as GET units (saved from the agent's answer) over TLS with
     keep-alive, status 200 (one worker, the same certificate, the same client): the anchor of 1.
     Both serve at once, and the 32-connection runs alternate, nginx first and last (GET_ROUNDS
     agent runs, each between two nginx runs): each agent run's ratio is over the mean of the two
     nginx runs around it, and the table gives the median of those ratios.

Its headline figures end as SUMMARY lines (tests/bench/summary.py), one row each of make bench's table.

Prints each figure as it comes and a table at the end. Loopback only; bounded counts; about half
a minute. Not a test: it asserts nothing beyond every answer having the expected status, and
is never run by ctest. Counts: GET_REQUESTS, CONNS, PER_CONN, CREATES, COMMITS, ROUNDS, GET_ROUNDS
(environment).
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "tests", "integration"))

import lab as labmod  # noqa: E402  (tests/integration/lab.py)
import summary  # noqa: E402  (tests/bench/summary.py)

UNIT = labmod.VFIO_UNITS[0]


def env_int(name, default):
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


GET_REQUESTS = env_int("GET_REQUESTS", 2000)
CONNS = env_int("CONNS", 32)  # as wrk -c32 would
PER_CONN = env_int("PER_CONN", 500)
CREATES = env_int("CREATES", 300)
COMMITS = env_int("COMMITS", 300)
# The creates and the bare commits run in ROUNDS alternating blocks (creates, then commits, then
# creates...), each ratio taken within its round: the disk's fsync time drifts from minute to
# minute, and only blocks run side by side see the same disk (docs/benchmarks.md).
ROUNDS = env_int("ROUNDS", 5)
# GET units beside nginx: GET_ROUNDS agent runs, each between two nginx runs (the same drift).
GET_ROUNDS = env_int("GET_ROUNDS", 3)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return (xs[n // 2] + xs[(n - 1) // 2]) / 2 if n else float("nan")


def post_args(lab, requests):
    token_file = os.path.join(lab.dir, "admin.token")
    if not os.path.exists(token_file):
        with open(token_file, "w") as f:
            f.write(lab.admin())
    return ["--port", lab.port, "--ca", f"{lab.dir}/tls.crt", "--path", lab.npath("/reservations"),
            "--token-file", token_file, "--unit", UNIT, "--requests", requests]


def creates_and_commits(client, lab, agent):
    """ROUNDS rounds, each: creates starting later, creates starting now (each then ended), and bare
    SQLite commits, on the same filesystem. Per round, each kind's commit share: its p50 minus the
    p50 of the authenticated 404 asked between them on the same connection. A create starting now
    checks the unit's occupancy, which needs libvirt: a second agent, on libvirt's test driver
    (which sends no events, so each such create lists the domains), answers those."""
    per, bare = max(1, CREATES // ROUNDS), max(1, COMMITS // ROUNDS)
    lab_now = labmod.Lab(agent)
    out = []
    try:
        lab_now.write_config(lab_now.config_text())
        lab_now.start()
        for k in range(ROUNDS):
            out.append(one_round(client, lab, lab_now, per, bare, k))
    finally:
        lab_now.close()
    return out


def one_round(client, lab, lab_now, per, bare, k):
    def share(run, key="create"):
        return run[key]["p50_us"] - run["absent_get"]["p50_us"]

    later = run_client(client, "post", *post_args(lab, per), "--offset", k * (per + 20))
    now = run_client(client, "post", *post_args(lab_now, per), "--kind", "now")
    # The reference as issue 40 set it (back to back), and again at the later creates' pace.
    pace = round(later["create_every"]["p50_us"])
    ref = run_client(client, "commit", "--dir", lab.dir, "--transactions", bare, "--pace-us", pace)
    paced = ref.get("three_rows_paced")  # none when a round had a single create (no pace)
    return {"run": later, "bare": ref, "bare3": ref["three_rows"]["p50_us"],
            "bare3_paced": paced["p50_us"] if paced else None, "pace": pace,
            "later": share(later), "now": share(now), "end": share(now, "end")}


def say(*a):
    print(*a, flush=True)


def proc_status(pid):
    """VmRSS, VmHWM, RssAnon, RssFile (KiB) and Threads from /proc/PID/status; Pss from smaps_rollup."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0])
            elif k == "Threads":
                out[k] = int(v.strip())
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    out["Pss"] = int(line.split()[1])
    except OSError:
        out["Pss"] = 0
    return out


def rss_floor(build):
    """{mode: {VmRSS, RssAnon, RssFile, Pss}} of tests/bench/rss_floor: the mandated libraries alone."""
    exe = os.path.join(build, "tests", "bench", "rss_floor")
    out = {}
    for mode in ("linked", "initialised"):
        try:
            out[mode] = json.loads(subprocess.run([exe, mode], capture_output=True, text=True, check=True).stdout)
        except (OSError, subprocess.CalledProcessError, ValueError):
            return None
    return out


def mem(s):
    return f"{mib(s['VmRSS'])} (anon {mib(s['RssAnon'])}, files {mib(s['RssFile'])}, PSS {mib(s['Pss'])})"


def mib(kib):
    return f"{kib / 1024:.1f} MiB"


def run_client(client, mode, *args, timeout=120):
    cmd = [client, mode, *[str(a) for a in args]]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} failed ({p.returncode}): {p.stderr.strip()}")
    return json.loads(p.stdout)


def fs_of(path):
    try:
        kind = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, text=True).stdout.strip()
        dev = subprocess.run(["df", "--output=source", path], capture_output=True, text=True).stdout.split()[-1]
        return f"{kind} ({dev})"
    except (OSError, IndexError):
        return "?"


def get_args(port, ca, path, token_file=None, requests=GET_REQUESTS, conns=CONNS, per_conn=PER_CONN):
    a = ["--port", port, "--ca", ca, "--path", path, "--requests", requests, "--conns", conns, "--per-conn", per_conn]
    if token_file:
        a += ["--token-file", token_file]
    return a


def show_get(label, r):
    o, l = r["one_conn"], r["loaded"]
    say(f"{label}: {r['body_bytes']} B body, {r['tls']}")
    say(f"  1 connection, {o['n']} requests:  p50 {o['p50_us']:.0f} µs  p99 {o['p99_us']:.0f} µs  max {o['max_us']:.0f} µs")
    say(f"  {r['conns']} connections x {r['per_conn']}:     {r['rps']:.0f} req/s  (p50 {l['p50_us']:.0f} µs  "
        f"p99 {l['p99_us']:.0f} µs under load, {r['seconds']:.2f} s)")


# ---- nginx ------------------------------------------------------------------------------------

def nginx_conf(d, port, crt, key):
    user = ""
    if os.getuid() == 0:  # workers would switch to nobody, who cannot read the lab's files
        user = "user root root;\n"
    return f"""{user}worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
    uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
    keepalive_requests 1000000;
    keepalive_timeout 60s;
    sendfile on;
    tcp_nodelay on;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {crt};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        root {d}/www;
        location / {{ default_type application/octet-stream; }}
    }}
}}
"""


def wait_port(port, proc, wait=10):
    deadline = time.time() + wait
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


class Nginx:
    """nginx serving `body_file` (GET units' own bytes) at /units.json while the `with` lasts:
    `port` and `version`, or `why` it is not there (not installed, did not start)."""

    def __init__(self, lab, body_file):
        self.lab, self.body_file = lab, body_file
        self.proc, self.log, self.port, self.version, self.why = None, None, None, "", None

    def __enter__(self):
        nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
        if not nginx:
            self.why = "nginx is not installed (apt-get install nginx-light); no nginx figures"
            return self
        d = os.path.join(self.lab.dir, "nginx")
        os.makedirs(os.path.join(d, "www"))
        os.makedirs(os.path.join(d, "tmp"))
        shutil.copyfile(self.body_file, os.path.join(d, "www", "units.json"))
        port = labmod.free_port()
        with open(os.path.join(d, "nginx.conf"), "w") as f:
            f.write(nginx_conf(d, port, f"{self.lab.dir}/tls.crt", f"{self.lab.dir}/tls.key"))
        self.version = subprocess.run([nginx, "-v"], capture_output=True, text=True).stderr.strip().split("/")[-1]
        self.log = open(os.path.join(d, "stderr.log"), "wb")
        self.proc = subprocess.Popen([nginx, "-p", d, "-c", os.path.join(d, "nginx.conf")], stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        if wait_port(port, self.proc):
            self.port = port
        else:
            with open(os.path.join(d, "stderr.log"), "rb") as f:
                self.why = f"nginx {self.version} did not start: " + f.read().decode(errors="replace").strip()[-300:]
        return self

    def get(self, client):
        r = run_client(client, "get", *get_args(self.port, f"{self.lab.dir}/tls.crt", "/units.json"))
        r["version"] = self.version
        return r

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)  # nginx's fast shutdown; the worker follows the master
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.log:
            self.log.close()
        return False


def units_beside_nginx(client, lab, units_path, token_file, body_file):
    """GET units and nginx's same bytes, alternating: nginx, agent, nginx, ... nginx (GET_ROUNDS agent
    runs). (the agent's runs, nginx's runs, each agent run's req/s over the mean of the two nginx runs
    around it), or the agent's runs alone and why there is no nginx."""
    agent_args = get_args(lab.port, f"{lab.dir}/tls.crt", units_path, token_file)
    with Nginx(lab, body_file) as ng:
        if not ng.port:
            return [run_client(client, "get", *agent_args)], [], [], ng.why
        ngs, gs = [ng.get(client)], []
        for _ in range(max(1, GET_ROUNDS)):
            gs.append(run_client(client, "get", *agent_args))
            ngs.append(ng.get(client))
        ratios = [g["rps"] / ((a["rps"] + b["rps"]) / 2) for g, a, b in zip(gs, ngs, ngs[1:])]
        return gs, ngs, ratios, None


# ---- main -------------------------------------------------------------------------------------

def binaries(argv):
    """(build dir, the agent, the C++ client) from `SCRIPT BUILD_DIR`, or an exit code (usage, not built)."""
    name = os.path.basename(argv[0])
    if len(argv) != 2:
        print(f"usage: {argv[0]} BUILD_DIR", file=sys.stderr)
        return 2
    build = os.path.abspath(argv[1])
    agent = os.path.join(build, "gpunode-agent")
    client = os.path.join(build, "tests", "bench", "api_bench")
    for f in (agent, client):
        if not os.access(f, os.X_OK):
            print(f"{name}: {f} is not built", file=sys.stderr)
            return 1
    return build, agent, client


def main():
    found = binaries(sys.argv)
    if isinstance(found, int):
        return found
    build, agent, client = found

    t_start = time.time()
    say(f"== API bench: gpunode-agent on loopback, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.2f}, kernel {os.uname().release} ==")
    lab = labmod.Lab(agent)
    try:
        # The production URI, as rss_floor uses it (without a libvirtd here, the attempt is the cost).
        lab.write_config(lab.config_text().replace("uri: test:///default", "uri: qemu:///system"))
        lab.start()
        pid = lab.pid
        time.sleep(1.0)
        idle0 = proc_status(pid)
        say(f"agent pid {pid}, {idle0['Threads']} threads; state dir on {fs_of(lab.state)}")
        say(f"idle after start-up: VmRSS {mem(idle0)}, VmHWM {mib(idle0['VmHWM'])}")

        token_file = os.path.join(lab.dir, "admin.token")
        with open(token_file, "w") as f:
            f.write(lab.admin())
        ca = f"{lab.dir}/tls.crt"
        units_path = lab.npath("/units")

        h = run_client(client, "get", *get_args(lab.port, ca, "/healthz", per_conn=1000))
        show_get("GET /healthz (no token: the server, TLS and the hop to the state thread)", h)

        body_file = os.path.join(lab.dir, "units.json")
        run_client(client, "get", *get_args(lab.port, ca, units_path, token_file, requests=1, conns=1, per_conn=1),
                   "--save-body", body_file)
        gs, ngs, get_ratios, why = units_beside_nginx(client, lab, units_path, token_file, body_file)
        for k, g in enumerate(gs):
            if k < len(ngs):
                show_get(f"nginx {ngs[k]['version']} GET /units.json, the same bytes (1 worker, same cert)", ngs[k])
            show_get(f"GET {units_path} (admin), run {k + 1}", g)
        if ngs:
            show_get(f"nginx {ngs[-1]['version']} GET /units.json, the same bytes (1 worker, same cert)", ngs[-1])
        g = gs[0]
        ng = {"version": ngs[0]["version"], "one_conn": ngs[0]["one_conn"],
              "rps": median([x["rps"] for x in ngs])} if ngs else None

        rounds = creates_and_commits(client, lab, agent)
        p, ref = rounds[0]["run"], rounds[0]["bare"]
        c, a404 = p["create"], p["absent_get"]
        say(f"POST {lab.npath('/reservations')}: {c['n']} creates on {UNIT} (round 1): p50 {c['p50_us']:.0f} µs  "
            f"p90 {c['p90_us']:.0f} µs  p99 {c['p99_us']:.0f} µs  mean {c['mean_us']:.0f} µs  max {c['max_us']:.0f} µs")
        say(f"  between them, on the same connection, an authenticated GET of an absent reservation (404): "
            f"p50 {a404['p50_us']:.0f} µs  p99 {a404['p99_us']:.0f} µs")

        g2 = run_client(client, "get", *get_args(lab.port, ca, units_path, token_file, requests=1000, per_conn=500))
        show_get(f"GET units again, with {CREATES + 10} reservations on {UNIT}", g2)

        time.sleep(1.0)
        idle1 = proc_status(pid)
        say(f"idle after the load: VmRSS {mem(idle1)}, VmHWM {mib(idle1['VmHWM'])}")
        rc, took = lab.stop()
        say(f"agent stopped (exit {rc}, {took:.2f} s)")

        r1, r3 = ref["one_row"], ref["three_rows"]
        say(f"bare SQLite {ref['sqlite']} commit (journal_mode={ref['journal_mode']}, synchronous={ref['synchronous']}"
            f" (2=FULL)) on {fs_of(lab.dir)}:")
        size = f"{ref['row_bytes']} B"
        for label, r in ((f"1 row of {size}: ", r1), (f"3 rows of {size}:", r3)):
            say(f"  {label} p50 {r['p50_us']:.0f} µs  p90 {r['p90_us']:.0f} µs  p99 {r['p99_us']:.0f} µs  "
                f"mean {r['mean_us']:.0f} µs")
        if why:
            say(why)
    finally:
        lab.close()

    # ---- the table ----
    floor = rss_floor(build)
    share_us = c["p50_us"] - a404["p50_us"]
    ratio1 = c["p50_us"] / r1["p50_us"] if r1["p50_us"] else float("nan")
    ratio3 = c["p50_us"] / r3["p50_us"] if r3["p50_us"] else float("nan")
    rows = [
        ("GET /healthz, 1 conn, p50 / p99", f"{h['one_conn']['p50_us']:.0f} / {h['one_conn']['p99_us']:.0f} µs",
         f"{CONNS} conns: {h['rps']:.0f} req/s"),
        ("GET units, 1 conn, p50 / p99", f"{g['one_conn']['p50_us']:.0f} / {g['one_conn']['p99_us']:.0f} µs",
         f"nginx, same bytes: {ng['one_conn']['p50_us']:.0f} / {ng['one_conn']['p99_us']:.0f} µs" if ng else "nginx: n/a"),
        (f"GET units, {CONNS} conns (median of {len(gs)} runs)", f"{median([x['rps'] for x in gs]):.0f} req/s",
         f"nginx, same bytes: {ng['rps']:.0f} req/s (median of {len(ngs)} runs around them)" if ng else "nginx: n/a"),
        (f"GET units, after {CREATES + 10} creates", f"{g2['one_conn']['p50_us']:.0f} / {g2['one_conn']['p99_us']:.0f} µs, "
         f"{g2['rps']:.0f} req/s", f"body {g['body_bytes']} -> {g2['body_bytes']} B"),
        ("POST reservation, p50 / p99 / mean", f"{c['p50_us']:.0f} / {c['p99_us']:.0f} / {c['mean_us']:.0f} µs",
         f"SQLite FULL commit 3 rows: {r3['p50_us']:.0f} / {r3['p99_us']:.0f} / {r3['mean_us']:.0f} µs"),
        ("", "", f"SQLite FULL commit 1 row:  {r1['p50_us']:.0f} / {r1['p99_us']:.0f} / {r1['mean_us']:.0f} µs"),
        ("POST p50 / bare commit p50", f"{ratio3:.2f}x (3 rows)", f"{ratio1:.2f}x (1 row)"),
        ("POST mean / bare commit mean", f"{c['mean_us'] / r3['mean_us']:.2f}x (3 rows)",
         f"{c['mean_us'] / r1['mean_us']:.2f}x (1 row)"),
        # The transport (TLS, HTTP, the hop to the state thread) is what /healthz costs; the rest of
        # a POST is the reservation's work and its commit.
        ("POST p50 - authenticated 404 GET p50 (the commit's share)", f"{share_us:.0f} µs",
         f"{share_us / r3['p50_us']:.2f}x a bare 3-row commit" if r3["p50_us"] else ""),
        ("agent RSS idle after start", mem(idle0),
         f"libvirt+OpenSSL+SQLite linked only: {mem(floor['linked'])}" if floor else "(rss_floor not built)"),
        ("agent RSS idle after load", mem(idle1),
         f"... and initialised:               {mem(floor['initialised'])}" if floor else ""),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    say("")
    say(f"{'API bench':<{w0}}  {'gpunode-agent':<{w1}}  reference")
    for a, b, r in rows:
        say(f"{a:<{w0}}  {b:<{w1}}  {r}")
    if not ng:
        say(f"({why})")
    say(f"({time.time() - t_start:.0f} s in all; load average {os.getloadavg()[0]:.2f} at the end)")

    units_bytes = g["body_bytes"]
    g_rps = median([x["rps"] for x in gs])
    if ng:
        r = median(get_ratios)
        agent_rps = ", ".join(f"{x['rps']:.0f}" for x in gs)
        nginx_rps = ", ".join(f"{x['rps']:.0f}" for x in ngs)
        say(f"GET units on {CONNS} connections by run (req/s): {agent_rps}; nginx before, between and after: "
            f"{nginx_rps}; each over the mean of the two around it: {', '.join(f'{v:.2f}x' for v in get_ratios)}")
        summary.row(f"GET units ({units_bytes} B), keep-alive TLS, {CONNS} conns, median of {len(gs)} runs each "
                    f"between two nginx runs", f"{g_rps:.0f} req/s",
                    f"nginx {ng['version']}, same bytes: {ng['rps']:.0f} req/s", r, "≥ 1.0", r >= 1.0)
    else:
        summary.row(f"GET units ({units_bytes} B), keep-alive TLS, {CONNS} conns", f"{g_rps:.0f} req/s", why)
    for kind, label in (("later", "a create starting later"), ("now", "a create starting now"), ("end", "an end")):
        shares = [x[kind] for x in rounds]
        ratios = [x[kind] / x["bare3"] for x in rounds]
        r = median(ratios)
        say(f"{label}'s commit share by round (µs): {', '.join(f'{v:.0f}' for v in shares)}; beside the bare "
            f"3-row commit of its round ({', '.join(str(round(x['bare3'])) for x in rounds)} µs): "
            f"{', '.join(f'{v:.2f}x' for v in ratios)}")
        summary.row(f"{label}: its commit share (p50 - authenticated 404 p50), median of {len(rounds)} rounds",
                    f"{median(shares):.0f} µs", f"bare SQLite WAL FULL 3-row commit of the same round: "
                    f"{median([x['bare3'] for x in rounds]):.0f} µs", r, "≤ 1.3", r <= 1.3)
    # The same share beside the bare commit made at the creates' pace: on a disk whose commit costs
    # more after an idle gap (docs/benchmarks.md), what the agent adds to a commit made as it makes
    # them. Shown beside the row above, never instead of it.
    paced = [x for x in rounds if x["bare3_paced"]]
    if paced:
        shares = [x["later"] for x in paced]
        ratios = [x["later"] / x["bare3_paced"] for x in paced]
        r = median(ratios)
        say(f"the bare 3-row commit by round, one every {', '.join(str(x['pace']) for x in paced)} µs (the "
            f"later creates' pace): {', '.join(str(round(x['bare3_paced'])) for x in paced)} µs; a create "
            f"starting later's share over it: {', '.join(f'{v:.2f}x' for v in ratios)}")
        summary.row(f"a create starting later: its commit share, beside a bare 3-row commit at the creates' pace, "
                    f"median of {len(paced)} rounds", f"{median(shares):.0f} µs",
                    f"bare commit, one every {median([x['pace'] for x in paced]):.0f} µs: "
                    f"{median([x['bare3_paced'] for x in paced]):.0f} µs", r, "", None)
    if floor:
        init = floor["initialised"]
        r = idle0["VmRSS"] / init["VmRSS"]
        summary.row("idle RSS after start-up", f"{mib(idle0['VmRSS'])} (PSS {mib(idle0['Pss'])})",
                    f"rss_floor initialised: {mib(init['VmRSS'])} (PSS {mib(init['Pss'])})", r, "≤ 1.4", r <= 1.4)
    grown = (idle1["VmRSS"] - idle0["VmRSS"]) / 1024
    summary.row(f"RSS growth after the load ({CREATES} creates and the GETs above)",
                f"{grown:+.1f} MiB", "idle after start-up", None, "≤ 4 MiB", grown <= 4)
    return 0


if __name__ == "__main__":
    sys.exit(main())
