"""A fake central API for the reporter's tests (CONTRACT §6): real HTTPS with mTLS (the client
certificate must chain to a given CA, else the handshake fails and no HTTP answer is given),
`POST /v1/nodes/{nodeId}/events` answered `{"ackedSeq": N}` and `POST .../heartbeat`, both recorded.

Used as a Python module (stdlib only):

    fc = FakeCentral(cert, key, client_ca)      # listens on 127.0.0.1, a free port
    fc.url                                      # https://127.0.0.1:PORT
    fc.fail("500", times=2)                     # the next 2 event requests answer 500, then normal
    fc.set_mode("stall")                        # every event request from now on: read, never answer
    fc.down(); fc.up()                          # stop listening (connection refused) / listen again
    fc.events                                   # {seq: event} stored, fc.arrivals: seqs as received

Event modes (fail(mode, times) for a number of requests, set_mode(mode) until changed):
  ok          store every event, ack the highest seq stored contiguously from 1
  500         answer 500
  429         answer 429 with Retry-After: retry_after (default 1)
  400         answer 400 with Retry-After: retry_after (the agent honours it; without it, it
              would wait its 5 minutes)
  stall       read the request and never answer (the connection is closed at down()/close())
  stall-body  read the request, send the answer's status line, headers and half its body
              (nothing stored, so nothing acknowledged), then stall like `stall`
  drop        read the headers and half of the body, then close the connection
  partial:K   store only the first K events of the batch and ack through them
The heartbeat endpoint has its own mode (hb_mode: ok | stall | 500).

Every request is checked against the contract's shape; what is wrong goes to `problems`.
"""
import json
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EVENT_KEYS = {"seq", "id", "type", "at", "data"}
HEARTBEAT_KEYS = {"nodeId", "at", "version", "revision", "outboxDepth", "oldestUndeliveredAt", "libvirt"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, central):
        self.central = central
        super().__init__(addr, _Handler)

    def finish_request(self, request, client_address):
        # The handshake runs on the connection's own thread: a client that stalls it stalls no one.
        c = self.central
        request.settimeout(10)
        try:
            tls = c.ctx.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            with c.lock:
                c.handshake_failures.append(str(e))
            return
        with c.lock:
            c.open_sockets.add(tls)
        try:
            peer = tls.getpeercert() or {}
            cn = next((v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName"), None)
            tls.client_cn = cn
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            with c.lock:
                c.open_sockets.discard(tls)
            try:
                tls.close()
            except OSError:
                pass

    def handle_error(self, request, client_address):
        pass  # a client that went away mid-request is part of the tests


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _answer(self, status, body=b"", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        c = self.server.central
        cn = getattr(self.connection, "client_cn", None)
        n = int(self.headers.get("Content-Length") or 0)
        node = c.node_id
        if self.path == f"/v1/nodes/{node}/heartbeat":
            return self._heartbeat(c, cn, n)
        if self.path != f"/v1/nodes/{node}/events":
            self.rfile.read(n)
            c.problem(f"unexpected path {self.path}")
            return self._answer(404, b'{"code":"not-found"}')
        mode = c.take_mode()
        c.note_attempt(mode, cn)
        if mode == "drop":
            self.rfile.read(max(1, n // 2))
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        raw = self.rfile.read(n)
        if mode in ("stall", "stall-body"):
            if mode == "stall-body":
                body = json.dumps({"ackedSeq": c.acked()}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:len(body) // 2])
                self.wfile.flush()
            c.ev_release.wait()  # until the mode changes, down() or close()
            self.close_connection = True
            return
        if mode == "500":
            return self._answer(500, b'{"error":"injected"}')
        if mode == "429":
            return self._answer(429, b'{"error":"slow down"}', [("Retry-After", str(c.retry_after))])
        if mode == "400":
            return self._answer(400, b'{"error":"injected refusal"}', [("Retry-After", str(c.retry_after))])
        keep = None
        if mode.startswith("partial:"):
            keep = int(mode.split(":", 1)[1])
        try:
            body = json.loads(raw)
        except ValueError as e:
            c.problem(f"events body is not JSON: {e}")
            return self._answer(400, b'{"error":"not json"}')
        acked = c.store(body, keep, self.headers.get("Content-Type"), cn)
        return self._answer(200, json.dumps({"ackedSeq": acked, "note": "unknown keys are ignored"}).encode())

    def _heartbeat(self, c, cn, n):
        raw = self.rfile.read(n)
        with c.lock:
            mode = c.hb_mode
        if mode == "stall":
            c.hb_release.wait()
            self.close_connection = True
            return
        try:
            hb = json.loads(raw)
        except ValueError as e:
            c.problem(f"heartbeat is not JSON: {e}")
            return self._answer(400)
        if not isinstance(hb, dict) or not HEARTBEAT_KEYS <= set(hb):
            c.problem(f"heartbeat lacks keys: {hb!r}")
        with c.lock:
            c.heartbeats.append({"t": time.time(), "cn": cn, "body": hb})
        if mode == "500":
            return self._answer(500)
        return self._answer(200, b"{}")


class FakeCentral:
    def __init__(self, cert, key, client_ca, node_id, port=0):
        self.node_id = node_id
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self.ctx.load_cert_chain(cert, key)
        self.ctx.verify_mode = ssl.CERT_REQUIRED
        self.ctx.load_verify_locations(client_ca)
        self.lock = threading.Lock()
        self.events = {}          # seq -> event, as first stored
        self.arrivals = []        # every seq received, in order, duplicates included
        self.batches = []         # [(time, [seqs], client cn)]
        self.attempts = []        # [(time, mode, client cn)] of every events request
        self.heartbeats = []      # [{"t", "cn", "body"}]
        self.handshake_failures = []
        self.problems = []
        self.open_sockets = set()
        self.mode, self.queue, self.hb_mode, self.retry_after = "ok", [], "ok", 1
        self.ev_release = threading.Event()  # set: stalled event requests end (unanswered)
        self.hb_release = threading.Event()  # the same for stalled heartbeats
        self.port = port
        self.server = None
        self.up()

    # -- control -----------------------------------------------------------------------------
    @property
    def url(self):
        return f"https://127.0.0.1:{self.port}"

    def up(self):
        assert self.server is None
        self.ev_release.clear()
        self.hb_release.clear()
        self.server = _Server(("127.0.0.1", self.port), self)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def down(self):
        """Stop listening and close every connection: the agent sees refused connections."""
        if self.server is None:
            return
        self.ev_release.set()
        self.hb_release.set()
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            socks = list(self.open_sockets)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.server = None

    def close(self):
        self.down()

    def set_mode(self, mode):
        with self.lock:
            self.mode, self.queue = mode, []
            if mode not in ("stall", "stall-body"):
                self.ev_release.set()
            else:
                self.ev_release.clear()

    def fail(self, mode, times=1):
        """The next `times` event requests get `mode`; then the standing mode again."""
        with self.lock:
            self.queue += [mode] * times

    def set_hb_mode(self, mode):
        with self.lock:
            self.hb_mode = mode
            if mode == "stall":
                self.hb_release.clear()
            else:
                self.hb_release.set()

    def take_mode(self):
        with self.lock:
            return self.queue.pop(0) if self.queue else self.mode

    def note_attempt(self, mode, cn):
        with self.lock:
            self.attempts.append((time.time(), mode, cn))

    def problem(self, text):
        with self.lock:
            self.problems.append(text)

    # -- the API's side ----------------------------------------------------------------------
    def store(self, body, keep, content_type, cn):
        if not (content_type or "").startswith("application/json"):
            self.problem(f"events Content-Type {content_type!r}")
        if not isinstance(body, dict) or body.get("nodeId") != self.node_id or not isinstance(body.get("events"), list):
            self.problem(f"events body shape: {str(body)[:200]}")
            return self.acked()
        evs = body["events"]
        seqs = [e.get("seq") if isinstance(e, dict) else None for e in evs]
        with self.lock:
            self.batches.append((time.time(), seqs, cn))
            if seqs != sorted(seqs) or any(b - a != 1 for a, b in zip(seqs, seqs[1:])):
                self.problems.append(f"a batch out of order or with a gap: {seqs}")
            for i, e in enumerate(evs):
                if keep is not None and i >= keep:
                    break
                if not isinstance(e, dict) or set(e) != EVENT_KEYS:
                    self.problems.append(f"event keys: {str(e)[:200]}")
                    continue
                s = e["seq"]
                self.arrivals.append(s)
                if s in self.events and self.events[s] != e:
                    self.problems.append(f"seq {s} sent twice with different content")
                self.events.setdefault(s, e)
            return self._acked_locked()

    def _acked_locked(self):
        n = 0
        while n + 1 in self.events:
            n += 1
        return n

    def acked(self):
        with self.lock:
            return self._acked_locked()

    def wait_for(self, cond, timeout, step=0.05):
        """Polls cond() until true or timeout; returns the last value."""
        deadline = time.time() + timeout
        while True:
            v = cond()
            if v or time.time() > deadline:
                return v
            time.sleep(step)
