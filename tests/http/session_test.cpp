// One connection's session driven over a socketpair (session_harness.hpp): reading, limits,
// framing, keep-alive, the answers the session gives itself.
#include "session_harness.hpp"

using namespace session_test;  // NOLINT(google-build-using-namespace): the harness, test by test

TEST_CASE("session: a request is read whole, handed to the handler with its peer, and answered") {
  Harness h;
  auto c = h.connect();
  auto r = c->roundtrip(request("POST", "/echo?a=1&b", "hello", {"X-Foo: Bar", "X-Request-Id: req-1"}));
  REQUIRE(r);
  CHECK(r->result_int() == 200);
  CHECK(r->body() == R"({"path":"/echo"})");
  CHECK(header(*r, "Content-Length") == std::to_string(r->body().size()));
  CHECK(header(*r, "Content-Type") == "application/json");  // the default
  CHECK(header(*r, "X-Echo") == "yes");
  CHECK(header(*r, "X-Request-Id") == "req-1");  // the client's, not the handler's
  CHECK(header(*r, "Bad Name").empty());
  CHECK(header(*r, "X-Split").empty());
  CHECK(header(*r, "Injected").empty());
  CHECK(r->keep_alive());
  {
    std::lock_guard lock(h.mu);
    REQUIRE(h.requests.size() == 1);
    const auto& q = h.requests[0];
    CHECK(q.method == "POST");
    CHECK(q.target == "/echo?a=1&b");
    CHECK(q.path == "/echo");
    CHECK(q.query == "a=1&b");
    CHECK(q.body == "hello");
    CHECK(q.request_id == "req-1");
    CHECK(q.header("x-foo") == "Bar");
    CHECK(q.header("host") == "test");
    CHECK(q.headers.front() == std::pair<std::string, std::string>{"host", "test"});
    CHECK(q.peer.kind == Peer::Kind::unix_socket);
    CHECK(q.peer.address == "/run/gpunode/admin.sock");
    CHECK(q.peer.uid == 1000u);
    CHECK(q.peer.gid == 1001u);
    CHECK(q.peer.pid == 4242);
    CHECK(q.peer.groups == std::vector<gid_t>{1001, 27});
    REQUIRE(h.answered.size() == 1);
    CHECK(h.answered[0] == Seen{"POST", "/echo", 200, Peer::Kind::unix_socket});
  }

  r = c->roundtrip(request("GET", "/nocontent"));  // 204: no body, no Content-Type
  REQUIRE(r);
  CHECK(r->result_int() == 204);
  CHECK(r->body().empty());
  CHECK(header(*r, "Content-Type").empty());
  CHECK(header(*r, "X-Request-Id").size() == 36);
}

// Beast's fields hold a value of at most 65,533 bytes and throw beyond: a larger one the handler
// sets is dropped like any field that cannot be sent, and the answer goes out (answered on the
// connection's own thread, the throw would have lost it).
TEST_CASE("session: a response field too large for Beast is dropped, the answer sent, the connection kept") {
  Harness h;
  auto c = h.connect();
  auto r = c->roundtrip(request("GET", "/huge"));
  REQUIRE(r);
  CHECK(r->result_int() == 200);
  CHECK(header(*r, "X-Largest").size() == 65533);
  CHECK(header(*r, "X-Too-Large").empty());
  CHECK(r->keep_alive());
  auto next = c->roundtrip(request("GET", "/echo"));
  REQUIRE(next);
  CHECK(next->result_int() == 200);
}

TEST_CASE("session: keep-alive serves two requests on one connection; Connection: close ends it") {
  Harness h;
  auto c = h.connect();
  CHECK(h.open_unix() == 1);
  auto first = c->roundtrip(request("GET", "/echo"));
  REQUIRE(first);
  CHECK(first->result_int() == 200);
  CHECK(first->keep_alive());
  auto second = c->roundtrip(request("GET", "/nowhere"));
  REQUIRE(second);
  CHECK(second->result_int() == 404);
  CHECK(second->keep_alive());
  CHECK(header(*first, "X-Request-Id").size() == 36);  // generated, one per request
  CHECK(header(*second, "X-Request-Id").size() == 36);
  CHECK(header(*first, "X-Request-Id") != header(*second, "X-Request-Id"));
  CHECK(h.handled() == 2);
  CHECK(h.open_sessions() == 1);

  auto last = c->roundtrip(request("GET", "/echo", {}, {"Connection: close"}));
  REQUIRE(last);
  CHECK(last->result_int() == 200);
  CHECK_FALSE(last->keep_alive());
  CHECK(header(*last, "Connection") == "close");
  CHECK(c->closed_without_data());
  CHECK(Harness::eventually([&] { return h.open_sessions() == 0; }));
  CHECK(h.open_unix() == 0);  // the budget's place given back
}

// Most requests arrive whole in one read and are parsed from the buffer (no further read); one that
// arrives in pieces, each read by the session before the next is sent (Conn::send_piece), is read
// on until it is whole; requests sent back to back are each answered.
TEST_CASE("session: requests sent together are answered in order; one sent in pieces is read whole") {
  Harness h;
  auto c = h.connect();
  REQUIRE(c->send(request("POST", "/echo", "body-1") + request("GET", "/nowhere") +
                  request("POST", "/echo", "body-2")));
  auto first = c->response();
  auto second = c->response();
  auto third = c->response();
  REQUIRE(first);
  REQUIRE(second);
  REQUIRE(third);
  CHECK(first->result_int() == 200);
  CHECK(second->result_int() == 404);
  CHECK(third->result_int() == 200);
  {
    std::lock_guard lock(h.mu);
    REQUIRE(h.requests.size() == 3);
    CHECK(h.requests[0].body == "body-1");
    CHECK(h.requests[1].path == "/nowhere");
    CHECK(h.requests[2].body == "body-2");
  }

  // The request line, the rest of the header, then the body: each piece read by the session before
  // the next is sent, so each arrives in a read of its own; nothing is handled before the last.
  const auto whole = request("POST", "/echo", "pieces", {"X-Foo: Bar"});
  const auto header_end = whole.find("\r\n\r\n") + 4;
  REQUIRE(c->send_piece(whole.substr(0, 10)));
  REQUIRE(c->send_piece(whole.substr(10, header_end - 10)));
  h.settle();
  CHECK(h.handled() == 3);
  REQUIRE(c->send_piece(whole.substr(header_end)));
  auto pieced = c->response();
  REQUIRE(pieced);
  CHECK(pieced->result_int() == 200);
  std::lock_guard lock(h.mu);
  REQUIRE(h.requests.size() == 4);
  CHECK(h.requests[3].body == "pieces");
  CHECK(h.requests[3].header("x-foo") == "Bar");
}

// What arrives in pieces is read on (the session's reads, not the buffer's parse): a chunked body
// split inside a chunk and at a chunk's end, and header fields that pass the limit only in a later
// piece, which is 431 as when they come whole.
TEST_CASE("session: a chunked body and headers over the limit, each arriving in pieces") {
  Harness h;
  auto c = h.connect();
  const std::string head = "POST /echo HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n";
  // Each piece read by the session before the next is sent (a read of its own).
  REQUIRE(c->send_piece(head + "5\r\nchu"));
  REQUIRE(c->send_piece("nk\r\n"));
  h.settle();
  CHECK(h.handled() == 0);
  REQUIRE(c->send_piece("3\r\ned!\r\n0\r\n\r\n"));
  auto r = c->response();
  REQUIRE(r);
  CHECK(r->result_int() == 200);
  {
    std::lock_guard lock(h.mu);
    REQUIRE(h.requests.size() == 1);
    CHECK(h.requests[0].body == "chunked!");
  }

  auto d = h.connect();
  REQUIRE(d->send_piece("GET /echo HTTP/1.1\r\nHost: test\r\nX-A: " + std::string(600, 'a') + "\r\n"));
  REQUIRE(d->send_piece("X-B: " + std::string(600, 'b') + "\r\n\r\n"));
  auto refused = d->response();
  REQUIRE(refused);
  check_problem(*refused, 431, "headers-too-large", "the request headers exceed 1024 bytes");
  CHECK(h.handled() == 1);
}

// A refusal found in what is already buffered is answered as one found while reading.
TEST_CASE("session: a body over the limit, and a malformed request, each sent behind a good request") {
  Harness h;
  auto c = h.connect();
  REQUIRE(c->send(request("GET", "/echo") + request("POST", "/echo", std::string(17, 'x'))));
  auto good = c->response();
  REQUIRE(good);
  CHECK(good->result_int() == 200);
  auto refused = c->response();
  REQUIRE(refused);
  check_problem(*refused, 413, "body-too-large", "the request body exceeds 16 bytes");
  CHECK(h.handled() == 1);

  auto d = h.connect();
  REQUIRE(d->send(request("GET", "/echo") + "NOT HTTP AT ALL\r\n\r\n"));
  good = d->response();
  REQUIRE(good);
  CHECK(good->result_int() == 200);
  refused = d->response();
  REQUIRE(refused);
  CHECK(refused->result_int() == 400);
  CHECK(h.handled() == 2);
}

TEST_CASE("session: a body over the limit is 413 body-too-large naming the limit, unhandled, then closed") {
  Harness h;
  auto ok = h.connect();
  auto r = ok->roundtrip(request("POST", "/echo", std::string(16, 'a')));  // at the limit
  REQUIRE(r);
  CHECK(r->result_int() == 200);

  auto c = h.connect();
  r = c->roundtrip(request("POST", "/echo", std::string(17, 'a'), {"X-Request-Id: big-one"}));
  REQUIRE(r);
  check_problem(*r, 413, "body-too-large", "the request body exceeds 16 bytes");
  CHECK(header(*r, "X-Request-Id") == "big-one");
  CHECK(header(*r, "Connection") == "close");
  CHECK(c->closed_without_data());
  CHECK(h.handled() == 1);  // only the first
  std::lock_guard lock(h.mu);
  REQUIRE(h.answered.size() == 2);
  CHECK(h.answered[1] == Seen{"", "", 413, Peer::Kind::unix_socket});
}

TEST_CASE("session: the admin socket's large-body path takes large_body, every other path and peer body") {
  Limits l = test_limits();
  l.large_body_path = "/upload";
  l.large_body = 32;
  Harness h(l);
  auto c = h.connect();
  auto r = c->roundtrip(request("POST", "/upload?x=1", std::string(32, 'u')));
  REQUIRE(r);
  CHECK(r->result_int() == 404);  // read whole and handed over (no such route here)
  CHECK(h.handled() == 1);

  auto c2 = h.connect();
  r = c2->roundtrip(request("POST", "/upload", std::string(33, 'u')));
  REQUIRE(r);
  check_problem(*r, 413, "body-too-large", "the request body exceeds 32 bytes");

  auto c3 = h.connect();
  r = c3->roundtrip(request("POST", "/echo", std::string(17, 'e')));
  REQUIRE(r);
  check_problem(*r, 413, "body-too-large", "the request body exceeds 16 bytes");

  Peer plain;
  plain.kind = Peer::Kind::plain_tcp;
  plain.address = "127.0.0.1:4000";
  auto c4 = h.connect(plain);  // the large path is the admin socket's only
  r = c4->roundtrip(request("POST", "/upload", std::string(17, 'u')));
  REQUIRE(r);
  check_problem(*r, 413, "body-too-large", "the request body exceeds 16 bytes");
  CHECK(h.handled() == 1);
}

TEST_CASE("session: a malformed request line is 400 invalid-request, unhandled, then closed") {
  Harness h;
  auto c = h.connect();
  auto r = c->roundtrip("hello world\r\n\r\n");
  REQUIRE(r);
  CHECK(r->result_int() == 400);
  auto o = json::parse(r->body()).as_object();
  CHECK(o["code"].as_string() == "invalid-request");
  CHECK(std::string(o["detail"].as_string()).starts_with("the request is not valid HTTP/1.1: "));
  CHECK(header(*r, "Connection") == "close");
  CHECK(header(*r, "X-Request-Id").size() == 36);
  CHECK(c->closed_without_data());
  CHECK(h.handled() == 0);
  {
    std::lock_guard lock(h.mu);
    REQUIRE(h.answered.size() == 1);
    CHECK(h.answered[0] == Seen{"", "", 400, Peer::Kind::unix_socket});
  }

  auto c2 = h.connect();  // headers over `header`: 431
  r = c2->roundtrip(request("GET", "/echo", {}, {"X-Big: " + std::string(2000, 'h')}));
  REQUIRE(r);
  check_problem(*r, 431, "headers-too-large", "the request headers exceed 1024 bytes");
  CHECK(c2->closed_without_data());
  CHECK(h.handled() == 0);
}

TEST_CASE("session: a handler that throws is answered 500 internal and logged; the connection goes on") {
  Harness h;
  auto c = h.connect();
  auto r = c->roundtrip(request("GET", "/throw", {}, {"X-Request-Id: t-1"}));
  REQUIRE(r);
  check_problem(*r, 500, "internal", "the request could not be handled");
  CHECK(header(*r, "X-Request-Id") == "t-1");
  CHECK(r->keep_alive());
  CHECK(h.logged("http: handler threw on GET /throw: boom"));

  r = c->roundtrip(request("GET", "/status42"));  // not a final status: 500 too
  REQUIRE(r);
  check_problem(*r, 500, "internal", "the request could not be handled");
  CHECK(h.logged("http: handler answered status 42 on GET /status42; sending 500"));

  r = c->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->result_int() == 200);
  std::lock_guard lock(h.mu);
  REQUIRE(h.answered.size() == 3);
  CHECK(h.answered[0] == Seen{"GET", "/throw", 500, Peer::Kind::unix_socket});
  CHECK(h.answered[1] == Seen{"GET", "/status42", 500, Peer::Kind::unix_socket});
}

// Every other timeout is an hour away: a close at all is header_timeout's, and not before it. The
// client waits up to 30 s for it (a hang guard, not a bound on the session's speed).
TEST_CASE("session: request fields that never end are cut at header_timeout, without an answer") {
  Limits l = test_limits();
  l.header_timeout = 1s;
  l.read_timeout = l.write_timeout = l.idle_timeout = l.handshake_timeout = std::chrono::hours(1);
  Harness h(l);
  auto c = h.connect();
  c->patience(30s);
  const auto t0 = Clock::now();
  REQUIRE(c->send("GET /echo HTTP/1.1\r\nHost: x\r\nX-Half: "));
  CHECK(c->closed_without_data());
  CHECK(Clock::now() - t0 >= 900ms);
  CHECK(h.handled() == 0);
  CHECK(Harness::eventually([&] { return h.open_sessions() == 0; }));
  std::lock_guard lock(h.mu);
  CHECK(h.answered.empty());
}

TEST_CASE("session: Expect: 100-continue gets 100 Continue before the body is read") {
  Harness h;
  auto c = h.connect();
  REQUIRE(c->send("POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"));
  auto r = c->response();
  REQUIRE(r);
  CHECK(r->result_int() == 100);
  r = c->roundtrip("hello");
  REQUIRE(r);
  CHECK(r->result_int() == 200);
  std::lock_guard lock(h.mu);
  REQUIRE(h.requests.size() == 1);
  CHECK(h.requests[0].body == "hello");
}

TEST_CASE("session: a drain closes an idle connection and answers the one in flight with Connection: close") {
  Harness h;
  auto idle = h.connect();
  REQUIRE(idle->roundtrip(request("GET", "/echo")));
  auto busy = h.connect();
  REQUIRE(busy->send(request("GET", "/hold")));
  REQUIRE(Harness::eventually([&] {
    std::lock_guard lock(h.mu);
    return h.held.has_value();
  }));
  for (auto& s : h.state->live()) s->drain();
  CHECK(idle->closed_without_data());

  Reply reply;
  {
    std::lock_guard lock(h.mu);
    reply = *h.held;
  }
  reply(Response{200, {{"Content-Type", "text/plain"}}, "late"});
  reply(Response{201, {}, "twice"});  // a second answer is ignored
  auto r = busy->response();
  REQUIRE(r);
  CHECK(r->result_int() == 200);
  CHECK(r->body() == "late");
  CHECK(header(*r, "Content-Type") == "text/plain");
  CHECK(header(*r, "Connection") == "close");
  CHECK(busy->closed_without_data());
  CHECK(Harness::eventually([&] { return h.open_sessions() == 0; }));
}
