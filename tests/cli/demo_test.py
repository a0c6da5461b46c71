#!/usr/bin/env python3
"""`make demo` run twice must not delete the first, running agent's live state (CONTRACT §7
"One agent per state directory").

    demo_test.py AGENT TOP

Runs a copy of scripts/demo.sh from a scratch top directory (its build/demo is the scratch one,
never the checkout's; tests/ is linked to TOP/tests), so a demo someone is running is not touched.
Prints one line per check and ends with `N passed, M failed`; exit 1 if anything failed."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True   # keep the source tree clean
from checks import Checks  # noqa: E402

AGENT, TOP = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
check = Checks()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return f"<{e}>"


def answers(path):
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(path)
            return True
        except OSError:
            return False


HOLD_LOCK = """import fcntl, os, sys, time
f = open(sys.argv[1], "a+")
fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)   # flock(2), as StateLock takes it
f.truncate(0); f.write(f"{os.getpid()}\\n"); f.flush()
print("locked", flush=True)
time.sleep(120)
"""

with tempfile.TemporaryDirectory(prefix="gpunode-demo-") as top:
    os.makedirs(os.path.join(top, "scripts"))
    shutil.copy(os.path.join(TOP, "scripts", "demo.sh"), os.path.join(top, "scripts", "demo.sh"))
    os.symlink(os.path.join(TOP, "tests"), os.path.join(top, "tests"))
    demo = os.path.join(top, "build", "demo")
    state = os.path.join(demo, "state")
    marker = os.path.join(state, "state.db")

    # A fake agent for the steps that only need one to exist: `run` returns at once.
    fake = os.path.join(top, "fake-agent")
    with open(fake, "w") as f:
        f.write(f'#!/bin/sh\n[ "$1" = run ] && exit 0\nexec {AGENT} "$@"\n')
    os.chmod(fake, 0o755)

    def demo_sh(agent, port, **kw):
        env = dict(os.environ, DEMO_PORT=str(port))
        return subprocess.Popen(["bash", os.path.join(top, "scripts", "demo.sh"), agent], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)

    def demo_once(agent, port):
        p = demo_sh(agent, port)
        out, err = p.communicate(timeout=60)
        return p.returncode, out, err

    def previous_demo(port):
        """What a running demo leaves: its config, its state, its socket."""
        shutil.rmtree(demo, ignore_errors=True)
        os.makedirs(state)
        with open(os.path.join(demo, "agent.yaml"), "w") as f:
            f.write(f'api:\n  listen: "127.0.0.1:{port}"\n')
        with open(marker, "w") as f:
            f.write("live state\n")

    # 1. Another process holds the state directory's lock: refused, nothing deleted.
    previous_demo(9555)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, os.path.join(state, "lock")], stdout=subprocess.PIPE,
                              text=True)
    try:
        check("the holder took the lock", holder.stdout.readline().strip() == "locked")
        rc, out, err = demo_once(fake, 9666)
        check("a held state directory: exit 1, nothing on stdout", rc == 1 and out == "", (rc, out[:200], err))
        check("the refusal names the state directory, the holder's pid and port, and how to stop it",
              f"state directory {state} is in use" in err and f"(pid {holder.pid})" in err and
              "https://127.0.0.1:9555" in err and f"kill {holder.pid}" in err, err)
        check("the live state is left as it was", read(marker) == "live state\n", read(marker))
    finally:
        holder.kill()
        holder.wait()

    # 2. No lock, but an agent answers on the demo's admin socket: refused too.
    previous_demo(9555)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(os.path.join(demo, "admin.sock"))
    listener.listen()
    try:
        rc, out, err = demo_once(fake, 9666)
        check("a live admin socket: exit 1, the socket named, the state kept",
              rc == 1 and f"an agent answers on {demo}/admin.sock" in err and os.path.exists(marker), (rc, err))
    finally:
        listener.close()

    # 3. What a dead agent left (its lock file with its pid, its socket): the demo starts afresh.
    previous_demo(9555)
    with open(os.path.join(state, "lock"), "w") as f:
        f.write("999999\n")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(os.path.join(demo, "admin.sock"))
    stale.close()
    rc, out, err = demo_once(fake, 9666)
    check("a dead agent's leftovers: the demo starts (exit 0) with a fresh state directory",
          rc == 0 and not os.path.exists(marker) and "127.0.0.1:9666" in read(os.path.join(demo, "agent.yaml")),
          (rc, err[-500:]))

    # 4. The real thing: a demo agent runs; `make demo` again (on another port) is refused and the
    #    running agent's state directory is untouched.
    shutil.rmtree(demo, ignore_errors=True)
    port = free_port()
    first = demo_sh(AGENT, port, start_new_session=True)
    try:
        sock = os.path.join(demo, "admin.sock")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and first.poll() is None and not answers(sock):
            time.sleep(0.1)
        up = answers(sock)
        check("the first demo's agent is up", up, first.poll())
        if up:
            before = sorted(os.listdir(state))
            rc, out, err = demo_once(fake, free_port())
            check("a second make demo while it runs: exit 1, names the state directory and its port",
                  rc == 1 and f"state directory {state} is in use" in err and f"https://127.0.0.1:{port}" in err,
                  (rc, err))
            check("the running agent's state directory is untouched and it still answers",
                  sorted(os.listdir(state)) == before and "state.db" in before and answers(sock), (before, os.listdir(state)))
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGTERM)
        try:
            first.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate()

check.finish()
