// gpunode::http over real sockets on loopback: HTTPS on 127.0.0.1 (port 0) and the admin socket
// in a temp dir, with the servers and clients of server_fixture.hpp: TLS, limits, budgets,
// timeouts, shutdown, concurrency. The admin socket's own cases: admin_socket_test.cpp.
#include "server_fixture.hpp"

using namespace server_test;

// ---------------------------------------------------------------------------------------------

TEST_CASE("problem(): the contract's keys, titled by the status's reason phrase") {
  auto r =
      gpunode::http::problem(400, "invalid-request", "bad things", {{"endsAt", "must be after startsAt"}});
  CHECK(r.status == 400);
  auto o = json::parse(r.body).as_object();
  CHECK(o["type"].as_string() == "urn:gpunode:problem:invalid-request");
  CHECK(o["title"].as_string() == "Bad Request");
  CHECK(o["status"].as_int64() == 400);
  CHECK(o["detail"].as_string() == "bad things");
  CHECK(o["code"].as_string() == "invalid-request");
  CHECK(o["errors"].as_array().size() == 1);
  CHECK(o["errors"].as_array()[0].as_object()["field"].as_string() == "endsAt");
  CHECK(r.headers.at(0).second == "application/problem+json");
  CHECK(gpunode::http::sane_request_id("abc-123"));
  CHECK_FALSE(gpunode::http::sane_request_id(""));
  CHECK_FALSE(gpunode::http::sane_request_id(std::string(129, 'a')));
  CHECK_FALSE(gpunode::http::sane_request_id("a\nb"));
  auto id = gpunode::http::generate_request_id();
  CHECK(id.size() == 36);
  CHECK(id != gpunode::http::generate_request_id());
}

TEST_CASE("make_tls_context: errors name the file and the reason") {
  using gpunode::error::Errc;
  const auto& c = certs();
  TempDir d;
  auto missing = d.file("missing.pem");
  auto r = gpunode::http::make_tls_context({missing, c.server_key, {}});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail == "TLS certificate " + missing + ": No such file or directory");
  CHECK(r.error().code == Errc::not_found);  // the errno kept, where it was made
  CHECK(r.error().native == ENOENT);

  auto garbage = d.file("garbage.pem");
  std::ofstream(garbage) << "not a certificate\n";
  r = gpunode::http::make_tls_context({garbage, c.server_key, {}});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail.starts_with("TLS certificate " + garbage + ": "));
  CHECK(r.error().code == Errc::invalid);

  r = gpunode::http::make_tls_context({c.server_cert, c.server2_key, {}});  // key of another cert
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail.starts_with("TLS key " + c.server2_key + " does not match certificate " +
                                     c.server_cert + ": "));
  CHECK(r.error().code == Errc::invalid);

  r = gpunode::http::make_tls_context({c.server_cert, c.server_key, garbage});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail.find(garbage) != std::string::npos);
  CHECK(r.error().code == Errc::invalid);

  r = gpunode::http::make_tls_context({c.server_cert, c.server_key, d.file("no-ca.pem")});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail == "TLS client CA " + d.file("no-ca.pem") + ": No such file or directory");
  CHECK(r.error().code == Errc::not_found);

  auto client = gpunode::http::make_client_tls_context({c.ca, c.client_cert, missing});
  REQUIRE_FALSE(client.has_value());
  CHECK(client.error().detail == "central client key " + missing + ": No such file or directory");
  CHECK(client.error().code == Errc::not_found);

  r = gpunode::http::make_tls_context({c.server_cert, c.server_key, c.ca});
  CHECK(r.has_value());
}

TEST_CASE("check_tls_file and check_key_pair: the reason alone, and its code") {
  using gpunode::error::Errc;
  using gpunode::http::TlsFileKind;
  const auto& c = certs();
  TempDir d;
  auto r = gpunode::http::check_tls_file(d.file("missing.pem"), TlsFileKind::certificate_chain);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail == "No such file or directory");
  CHECK(r.error().code == Errc::not_found);
  CHECK(r.error().native == ENOENT);

  r = gpunode::http::check_tls_file(c.server_cert, TlsFileKind::private_key);  // a certificate, not a key
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail.starts_with("not a PEM private key: "));
  CHECK(r.error().code == Errc::invalid);
  CHECK(gpunode::http::check_tls_file(c.server_cert, TlsFileKind::certificate_chain).has_value());

  r = gpunode::http::check_key_pair(c.server_cert, c.server2_key);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail == "does not belong to the certificate in " + c.server_cert);
  CHECK(r.error().code == Errc::invalid);
  CHECK(gpunode::http::check_key_pair(c.server_cert, c.server_key).has_value());
}

TEST_CASE("listen errors name the address") {
  Fixture f;
  auto ctx = gpunode::http::make_tls_context({certs().server_cert, certs().server_key, {}});
  REQUIRE(ctx.has_value());
  // The address's syntax is config::parse_listen's (tests/config); here: what binding finds.
  auto r = f.server->listen_tls("192.0.2.1", 8443, *ctx);  // TEST-NET-1: not this host's address
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail.find("bind") != std::string::npos);
  CHECK(r.error().detail.find("192.0.2.1:8443") != std::string::npos);
  CHECK(r.error().code == gpunode::error::Errc::unavailable);  // EADDRNOTAVAIL
  auto port = f.listen();
  r = f.server->listen_tls("127.0.0.1", port, *ctx);  // taken
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail.find(std::to_string(port)) != std::string::npos);
  CHECK(r.error().code == gpunode::error::Errc::busy);  // EADDRINUSE
  CHECK(r.error().native == EADDRINUSE);
}

TEST_CASE("TLS: GET and POST round trip; response headers") {
  Fixture f;
  auto port = f.listen();
  auto c = Client::tls(port);
  REQUIRE_MESSAGE(c->ok, c->error);
  CHECK(std::string(SSL_get_version(c->ssl())) == "TLSv1.3");

  auto r = c->roundtrip(request("GET", "/echo?a=1&b=2", {}, {"X-Foo: bar"}));
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->header("content-type") == "application/json");
  CHECK(std::stoul(r->header("content-length")) == r->body.size());
  CHECK(r->header("x-echo") == "yes");
  CHECK_FALSE(r->headers.contains("server"));
  auto o = json::parse(r->body).as_object();
  CHECK(o["method"].as_string() == "GET");
  CHECK(o["target"].as_string() == "/echo?a=1&b=2");
  CHECK(o["path"].as_string() == "/echo");
  CHECK(o["query"].as_string() == "a=1&b=2");
  CHECK(o["xFoo"].as_string() == "bar");
  CHECK(o["peerKind"].as_string() == "tcp");
  CHECK(std::string(o["peerAddress"].as_string()).starts_with("127.0.0.1:"));
  CHECK(o["uid"].is_null());

  r = c->roundtrip(request("POST", "/echo", R"({"hello":"world"})", {"Content-Type: application/json"}));
  REQUIRE(r);
  CHECK(r->status == 200);
  o = json::parse(r->body).as_object();
  CHECK(o["method"].as_string() == "POST");
  CHECK(o["body"].as_string() == R"({"hello":"world"})");

  r = c->roundtrip(request("GET", "/nowhere"));
  REQUIRE(r);
  check_problem(*r, 404, "not-found");

  r = c->roundtrip(request("GET", "/nocontent"));
  REQUIRE(r);
  CHECK(r->status == 204);
  CHECK(r->body.empty());
  CHECK(!r->header("x-request-id").empty());

  // TLS 1.2 negotiates an ECDHE AEAD suite.
  auto c12 = Client::tls(port, {.max_version = TLS1_2_VERSION});
  REQUIRE_MESSAGE(c12->ok, c12->error);
  CHECK(std::string(SSL_get_cipher_name(c12->ssl())).starts_with("ECDHE-RSA-"));
  r = c12->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->status == 200);
}

TEST_CASE("keep-alive: 100 requests on one connection; Connection: close honoured") {
  Fixture f;
  auto port = f.listen();
  auto c = Client::tls(port);
  REQUIRE_MESSAGE(c->ok, c->error);
  for (int i = 0; i < 100; ++i) {
    auto r = c->roundtrip(request("POST", "/echo?i=" + std::to_string(i), std::to_string(i)));
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(json::parse(r->body).as_object()["body"].as_string() == std::to_string(i));
    CHECK(r->header("connection") != "close");
  }
  CHECK(f.server->open_connections() == 1);

  auto r = c->roundtrip(request("GET", "/echo", {}, {"Connection: close"}));
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->header("connection") == "close");
  CHECK(c->closed_without_data());
  c->close();
  CHECK(eventually([&] { return f.server->open_connections() == 0; }));

  // The handler can close too.
  auto c2 = Client::tls(port);
  r = c2->roundtrip(request("GET", "/close"));
  REQUIRE(r);
  CHECK(r->header("connection") == "close");
  CHECK(c2->closed_without_data());
}

TEST_CASE("X-Request-Id: echoed when sane, generated otherwise") {
  Fixture f;
  auto port = f.listen();
  auto c = Client::tls(port);
  REQUIRE_MESSAGE(c->ok, c->error);
  auto r = c->roundtrip(request("GET", "/echo", {}, {"X-Request-Id: req-42 abc"}));
  REQUIRE(r);
  CHECK(r->header("x-request-id") == "req-42 abc");
  CHECK(json::parse(r->body).as_object()["requestId"].as_string() == "req-42 abc");

  r = c->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  auto first = r->header("x-request-id");
  CHECK(first.size() == 36);
  CHECK(json::parse(r->body).as_object()["requestId"].as_string() == first);
  r = c->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->header("x-request-id").size() == 36);
  CHECK(r->header("x-request-id") != first);

  r = c->roundtrip(request("GET", "/echo", {}, {"X-Request-Id: " + std::string(200, 'x')}));
  REQUIRE(r);
  CHECK(r->header("x-request-id").size() == 36);

  r = c->roundtrip(request("GET", "/nowhere", {}, {"X-Request-Id: abc"}));  // on problems too
  REQUIRE(r);
  CHECK(r->header("x-request-id") == "abc");
}

TEST_CASE("limits: a 64 KiB body is accepted, one byte more is 413") {
  Fixture f;
  auto port = f.listen();
  auto c = Client::tls(port);
  REQUIRE_MESSAGE(c->ok, c->error);
  auto r = c->roundtrip(request("POST", "/echo", std::string(64 * 1024, 'a')));
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(json::parse(r->body).as_object()["bodySize"].as_int64() == 64 * 1024);

  r = c->roundtrip(request("POST", "/echo", std::string(64 * 1024 + 1, 'a'), {"X-Request-Id: big-one"}));
  REQUIRE(r);
  check_problem(*r, 413, "body-too-large");
  CHECK(r->header("x-request-id") == "big-one");
  CHECK(r->header("connection") == "close");

  // Chunked, no Content-Length: the limit holds too (over the admin socket: the server half-closes).
  auto path = f.listen_unix();
  auto u = Client::plain_unix(path);
  std::string chunked = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 17; ++i) chunked += "1000\r\n" + std::string(4096, 'b') + "\r\n";
  chunked += "0\r\n\r\n";
  r = u->roundtrip(chunked);
  REQUIRE(r);
  check_problem(*r, 413, "body-too-large");
  CHECK(u->closed_without_data());
}

TEST_CASE(
    "limits: the admin socket's one large-body path takes up to large_body; every other path, and HTTPS, "
    "keep body") {
  Limits limits = test_limits();
  limits.large_body_path = "/echo";
  limits.large_body = 2 * 1024 * 1024;
  Fixture f(limits);
  auto path = f.listen_unix();
  auto u = Client::plain_unix(path);
  auto r = u->roundtrip(request("POST", "/echo", std::string(2 * 1024 * 1024, 'x')));
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(json::parse(r->body).as_object()["bodySize"].as_int64() == 2 * 1024 * 1024);
  r = u->roundtrip(
      request("POST", "/echo?x=1", std::string(1024 * 1024, 'x')));  // the path, whatever the query
  REQUIRE(r);
  CHECK(r->status == 200);

  auto u2 = Client::plain_unix(path);  // refused on its Content-Length, before the body is sent
  r = u2->roundtrip("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2097153\r\n\r\n");
  REQUIRE(r);
  check_problem(*r, 413, "body-too-large");
  CHECK(json::parse(r->body).as_object()["detail"].as_string() == "the request body exceeds 2097152 bytes");

  auto u3 = Client::plain_unix(path);
  r = u3->roundtrip(request("POST", "/other", std::string(64 * 1024 + 1, 'x')));
  REQUIRE(r);
  check_problem(*r, 413, "body-too-large");
  CHECK(json::parse(r->body).as_object()["detail"].as_string() == "the request body exceeds 65536 bytes");

  auto u4 = Client::plain_unix(path);
  std::string chunked = "POST /other HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 17; ++i) chunked += "1000\r\n" + std::string(4096, 'b') + "\r\n";
  chunked += "0\r\n\r\n";
  r = u4->roundtrip(chunked);
  REQUIRE(r);
  check_problem(*r, 413, "body-too-large");

  auto port = f.listen();
  auto c = Client::tls(port);
  REQUIRE_MESSAGE(c->ok, c->error);
  r = c->roundtrip(request("POST", "/echo", std::string(64 * 1024 + 1, 'a')));
  REQUIRE(r);
  check_problem(*r, 413, "body-too-large");  // HTTPS never takes the large path
}

TEST_CASE(
    "budgets: TLS connections per client address and in all, admin-socket connections; refusals logged once "
    "a minute") {
  Limits limits = test_limits();
  limits.max_connections = 5;
  limits.max_connections_per_client = 3;
  limits.max_unix_connections = 2;
  // An hour: the connections held below stay open however slow the machine, and one the budgets
  // admitted is never closed by a timeout here, so a close is the refusal at accept.
  limits.handshake_timeout = std::chrono::hours(1);
  Fixture f(limits);
  auto port = f.listen();
  const auto closed_at_once = [](int fd) {
    timeval tv{30, 0};  // a hang guard: a connection not refused is never closed
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b = 0;
    const auto n = ::recv(fd, &b, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  };
  // Three idle TCP connections (no handshake) from 127.0.0.1 hold the address's budget.
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) held.push_back(connect_tcp(port));
  CHECK(eventually([&] { return f.server->open_connections() == 3; }));
  int fourth = connect_tcp(port);
  CHECK(closed_at_once(fourth));
  ::close(fourth);
  // Another address (127.0.0.2) is served meanwhile, up to the total.
  TlsOptions from2;
  from2.source = "127.0.0.2";
  auto other = Client::tls(port, from2);
  REQUIRE_MESSAGE(other->ok, other->error);
  auto r = other->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->status == 200);
  auto other2 = Client::tls(port, from2);
  REQUIRE(other2->ok);
  CHECK(eventually([&] { return f.server->open_connections() == 5; }));
  int sixth = connect_tcp(port, "127.0.0.3");
  CHECK(closed_at_once(sixth));  // the total
  ::close(sixth);
  {
    std::lock_guard lock(f.log_mu);
    const auto lines = std::count_if(f.logs.begin(), f.logs.end(), [](const std::string& l) {
      return l.starts_with("connections refused: ");
    });
    CHECK(lines == 1);  // the second refusal is counted, not logged
    auto it = std::find_if(f.logs.begin(), f.logs.end(),
                           [](const std::string& l) { return l.starts_with("connections refused: "); });
    REQUIRE(it != f.logs.end());
    CHECK(*it ==
          "connections refused: 1 since the last such line (127.0.0.1 has the 3 connections of "
          "api.max_connections_per_client open); "
          "the next line comes a minute from now at the soonest");
  }
  // A held connection closed gives its place back.
  ::close(held.back());
  held.pop_back();
  CHECK(eventually([&] { return f.server->open_connections() == 4; }));
  auto again = Client::tls(port);
  REQUIRE_MESSAGE(again->ok, again->error);
  for (int fd : held) ::close(fd);

  // The admin socket's own budget.
  auto path = f.listen_unix();
  auto u1 = Client::plain_unix(path);
  auto u2 = Client::plain_unix(path);
  REQUIRE(u1->roundtrip(request("GET", "/echo")));
  REQUIRE(u2->roundtrip(request("GET", "/echo")));
  auto u3 = Client::plain_unix(path);
  CHECK(u3->closed_without_data());
}

TEST_CASE("limits: 9 KiB of headers is 431; a garbage request is 400; both then close") {
  Fixture f;
  auto port = f.listen();
  auto c = Client::tls(port);
  REQUIRE_MESSAGE(c->ok, c->error);
  auto r = c->roundtrip(request("GET", "/echo", {}, {"X-Big: " + std::string(9 * 1024, 'h')}));
  REQUIRE(r);
  check_problem(*r, 431, "headers-too-large");
  CHECK(r->header("connection") == "close");

  auto c2 = Client::tls(port);
  r = c2->roundtrip("hello world\r\n\r\n");
  REQUIRE(r);
  check_problem(*r, 400, "invalid-request");
  CHECK(r->header("connection") == "close");

  auto path = f.listen_unix();
  auto u = Client::plain_unix(path);
  r = u->roundtrip("GET / HTTP/1.1\r\nHost x\r\n\r\n");  // a header line without a colon
  REQUIRE(r);
  check_problem(*r, 400, "invalid-request");
  CHECK(u->closed_without_data());

  // The server is still fine.
  auto c3 = Client::tls(port);
  r = c3->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->status == 200);
}

TEST_CASE("Expect: 100-continue gets 100 Continue, then the body is read") {
  Fixture f;
  auto path = f.listen_unix();
  auto u = Client::plain_unix(path);
  REQUIRE(u->send("POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"));
  auto r = u->response();
  REQUIRE(r);
  CHECK(r->status == 100);
  r = u->roundtrip("hello");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(json::parse(r->body).as_object()["body"].as_string() == "hello");

  // Too large announced: 413 at once, no 100.
  r = u->roundtrip(
      "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n");
  REQUIRE(r);
  check_problem(*r, 413, "body-too-large");
}

// No wall-clock bound: the slow client's header_timeout is an hour while the others are served (it
// is still open after them), then a second; every other timeout is an hour, so a close at all is
// header_timeout's, and not before it. The client waits up to 30 s for it (a hang guard).
TEST_CASE("a slow client is cut at header_timeout while others are served") {
  for (const auto header_timeout : {std::chrono::seconds(std::chrono::hours(1)), std::chrono::seconds(1)}) {
    CAPTURE(header_timeout.count());
    Limits l = test_limits();
    l.header_timeout = header_timeout;
    l.handshake_timeout = l.read_timeout = l.write_timeout = l.idle_timeout = std::chrono::hours(1);
    Fixture f{l};
    auto port = f.listen();
    auto slow = Client::tls(port);
    REQUIRE_MESSAGE(slow->ok, slow->error);
    slow->patience(30s);
    auto t0 = Clock::now();
    REQUIRE(slow->send("GET /echo HTTP/1.1\r\nHost: x\r\nX-Half: "));

    auto other = Client::tls(port);
    REQUIRE_MESSAGE(other->ok, other->error);
    for (int i = 0; i < 5; ++i) {
      auto r = other->roundtrip(request("GET", "/echo"));
      REQUIRE(r);
      CHECK(r->status == 200);
    }
    if (header_timeout > 1s) {
      CHECK(f.server->open_connections() == 2);  // the slow one held no one up, and is still open
      continue;
    }
    CHECK(slow->closed_without_data());
    CHECK(Clock::now() - t0 >= 900ms);
    auto r = other->roundtrip(request("GET", "/echo"));
    REQUIRE(r);
    CHECK(r->status == 200);
  }
}

// Every other timeout is an hour: a close at all is the one under test's, and not before it. The
// clients wait up to 30 s for it (a hang guard, not a bound on the server's speed).
TEST_CASE(
    "an idle keep-alive connection is closed at idle_timeout; a silent TLS client at handshake_timeout") {
  Limits l = test_limits();
  l.idle_timeout = 1s;
  l.handshake_timeout = 1s;
  l.header_timeout = l.read_timeout = l.write_timeout = std::chrono::hours(1);
  Fixture f{l};
  auto port = f.listen();
  auto c = Client::tls(port);
  REQUIRE_MESSAGE(c->ok, c->error);
  auto r = c->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  c->patience(30s);
  auto t0 = Clock::now();
  CHECK(c->closed_without_data());
  CHECK(Clock::now() - t0 >= 800ms);

  // A TCP client that never starts the handshake.
  int fd = connect_tcp(port);
  REQUIRE(fd >= 0);
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  t0 = Clock::now();
  char b = 0;
  const auto n = ::recv(fd, &b, 1, 0);
  CHECK((n == 0 || (n < 0 && errno == ECONNRESET)));  // closed, not the client's timeout
  CHECK(Clock::now() - t0 >= 800ms);
  ::close(fd);
  CHECK(eventually([&] { return f.server->open_connections() == 0; }));
}

TEST_CASE("TLS policy: old versions, non-ECDHE and non-AEAD suites refused; plain HTTP gets nothing") {
  Fixture f;
  auto port = f.listen();

  auto v11 =
      Client::tls(port, {.min_version = TLS1_VERSION, .max_version = TLS1_1_VERSION, .seclevel0 = true});
  CHECK_FALSE(v11->ok);
  CHECK_MESSAGE(v11->error.find("protocol version") != std::string::npos, v11->error);

  auto rsa_kx =
      Client::tls(port, {.max_version = TLS1_2_VERSION, .ciphers = "AES256-SHA256:AES128-GCM-SHA256"});
  CHECK_FALSE(rsa_kx->ok);
  CHECK_MESSAGE(rsa_kx->error.find("handshake failure") != std::string::npos, rsa_kx->error);

  auto cbc = Client::tls(
      port, {.max_version = TLS1_2_VERSION, .ciphers = "ECDHE-RSA-AES128-SHA:ECDHE-RSA-AES256-SHA384"});
  CHECK_FALSE(cbc->ok);
  CHECK_MESSAGE(cbc->error.find("handshake failure") != std::string::npos, cbc->error);

  auto dhe = Client::tls(port, {.max_version = TLS1_2_VERSION, .ciphers = "DHE-RSA-AES128-GCM-SHA256"});
  CHECK_FALSE(dhe->ok);

  auto chacha = Client::tls(port, {.max_version = TLS1_2_VERSION, .ciphers = "ECDHE-RSA-CHACHA20-POLY1305"});
  CHECK_MESSAGE(chacha->ok, chacha->error);

  int fd = connect_tcp(port);
  REQUIRE(fd >= 0);
  std::string plain = request("GET", "/echo");
  CHECK(::send(fd, plain.data(), plain.size(), MSG_NOSIGNAL) > 0);
  std::array<char, 512> buf{};
  auto n = ::recv(fd, buf.data(), buf.size(), 0);
  CHECK(std::string_view(buf.data(), n > 0 ? static_cast<std::size_t>(n) : 0).find("HTTP/") ==
        std::string_view::npos);
  ::close(fd);
}

TEST_CASE("TLS 1.2 renegotiation is refused") {
  Fixture f;
  auto port = f.listen();
  auto c = Client::tls(port, {.max_version = TLS1_2_VERSION});
  REQUIRE_MESSAGE(c->ok, c->error);
  auto r = c->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  REQUIRE(SSL_renegotiate(c->ssl()) == 1);
  CHECK(SSL_do_handshake(c->ssl()) != 1);
  auto err = ssl_errors();
  CHECK_MESSAGE(err.find("renegotiation") != std::string::npos, err);
}

TEST_CASE("mTLS: no certificate or a foreign one fails the handshake; the CA's works") {
  const auto& c = certs();
  Fixture f;
  auto port = f.listen({c.server_cert, c.server_key, c.ca});

  auto good = Client::tls(port, {.cert = c.client_cert, .key = c.client_key});
  REQUIRE_MESSAGE(good->ok, good->error);
  auto r = good->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->status == 200);

  auto good12 =
      Client::tls(port, {.max_version = TLS1_2_VERSION, .cert = c.client_cert, .key = c.client_key});
  REQUIRE_MESSAGE(good12->ok, good12->error);
  r = good12->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->status == 200);

  // TLS 1.2: the client's handshake itself fails.
  auto none12 = Client::tls(port, {.max_version = TLS1_2_VERSION});
  CHECK_FALSE(none12->ok);
  auto rogue12 = Client::tls(port, {.max_version = TLS1_2_VERSION, .cert = c.rogue_cert, .key = c.rogue_key});
  CHECK_FALSE(rogue12->ok);

  // TLS 1.3: the client finishes first; the server's alert arrives instead of any HTTP answer.
  auto none13 = Client::tls(port);
  if (none13->ok) {
    none13->send(request("GET", "/echo"));
    CHECK_FALSE(none13->response());
  }
  auto rogue13 = Client::tls(port, {.cert = c.rogue_cert, .key = c.rogue_key});
  if (rogue13->ok) {
    rogue13->send(request("GET", "/echo"));
    CHECK_FALSE(rogue13->response());
  }
  CHECK(f.logged("TLS handshake"));
}

TEST_CASE("set_tls_context: new connections get the new certificate, open ones keep working") {
  const auto& c = certs();
  Fixture f;
  auto port = f.listen();
  auto old_conn = Client::tls(port);
  REQUIRE_MESSAGE(old_conn->ok, old_conn->error);
  auto cn_of = [](Client& cl) {
    X509* x = SSL_get1_peer_certificate(cl.ssl());
    std::array<char, 256> buf{};
    X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, buf.data(),
                              static_cast<int>(buf.size()));
    X509_free(x);
    return std::string(buf.data());
  };
  CHECK(cn_of(*old_conn) == "gpunode-one");
  auto ctx2 = gpunode::http::make_tls_context({c.server2_cert, c.server2_key, {}});
  REQUIRE(ctx2.has_value());
  f.server->set_tls_context(*ctx2);
  auto new_conn = Client::tls(port);
  REQUIRE_MESSAGE(new_conn->ok, new_conn->error);
  CHECK(cn_of(*new_conn) == "gpunode-two");
  auto r = old_conn->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->status == 200);
}

TEST_CASE("no handler timeout: a 2 s answer outlasts a 1 s read_timeout; a throw or a Reply let go: 500") {
  // CONTRACT §7 "Deadlines": a request's deadline is its handler's (a long poll waits up to
  // 120 s, a terminate-spot up to 300 s of grace); the socket's timeouts never cut it short.
  Limits l = test_limits();
  l.read_timeout = 1s;
  l.write_timeout = 1s;
  l.idle_timeout = 1s;
  Fixture f{l};
  auto port = f.listen();
  auto path = f.listen_unix();
  for (bool tls : {true, false}) {
    CAPTURE(tls);
    auto client = tls ? Client::tls(port) : Client::plain_unix(path);
    REQUIRE_MESSAGE(client->ok, client->error);
    auto t0 = Clock::now();
    auto r = client->roundtrip(request("GET", "/slow?ms=2000", {}, {"X-Request-Id: slowpoke"}));
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(r->body == "slow");
    CHECK(r->header("x-request-id") == "slowpoke");
    CHECK(Clock::now() - t0 >= 1900ms);
    r = client->roundtrip(request("GET", "/echo"));  // the same connection goes on
    REQUIRE(r);
    CHECK(r->status == 200);
  }
  auto c = Client::tls(port);
  REQUIRE_MESSAGE(c->ok, c->error);
  auto r = c->roundtrip(request("GET", "/throw"));
  REQUIRE(r);
  check_problem(*r, 500, "internal");
  r = c->roundtrip(request("GET", "/never", {}, {"X-Request-Id: let-go"}));  // a Reply let go: 500 too
  REQUIRE(r);
  check_problem(*r, 500, "internal");
  CHECK(r->header("x-request-id") == "let-go");
  CHECK(f.logged("http: REQUEST=let-go GET /never: the handler let its Reply go unanswered; answered 500"));
  r = c->roundtrip(request("GET", "/slow?ms=10"));
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->header("content-type") == "text/plain");
  CHECK(r->body == "slow");
}

TEST_CASE("stop_accepting: new connections refused, open ones served, admin socket removed") {
  Fixture f;
  auto port = f.listen();
  auto path = f.listen_unix();
  auto c = Client::tls(port);
  REQUIRE_MESSAGE(c->ok, c->error);
  f.server->stop_accepting();
  CHECK(connect_tcp(port) < 0);
  CHECK_FALSE(fs::exists(path));
  auto r = c->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->status == 200);
}

TEST_CASE("graceful shutdown: the request in flight completes, idle connections close, done runs") {
  Fixture f;
  auto port = f.listen();
  auto idle = Client::tls(port);
  REQUIRE_MESSAGE(idle->ok, idle->error);
  REQUIRE(idle->roundtrip(request("GET", "/echo")));
  auto busy = Client::tls(port);
  REQUIRE_MESSAGE(busy->ok, busy->error);
  REQUIRE(busy->send(request("GET", "/slow?ms=300")));
  REQUIRE(eventually([&] { return f.slow_started == 1; }));

  // A drain of an hour: done runs when the last connection goes, not at the drain's end (the
  // wait for it below is a hang guard, not a bound on the server's speed).
  auto t0 = Clock::now();
  auto p = std::make_shared<std::promise<void>>();
  auto done = p->get_future();
  f.server->shutdown(std::chrono::hours(1), [p] { p->set_value(); });
  CHECK(connect_tcp(port) < 0);

  CHECK(idle->closed_without_data());
  idle->close();
  auto r = busy->response();
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->body == "slow");
  CHECK(r->header("connection") == "close");
  CHECK(Clock::now() - t0 >= 200ms);
  busy->close();
  CHECK(done.wait_for(30s) == std::future_status::ready);
  CHECK(f.server->open_connections() == 0);
}

// Every timeout is an hour: only the drain's end closes the two, and done runs then (the wait for
// it is a hang guard, not a bound on the server's speed).
TEST_CASE("graceful shutdown: after the drain every connection is closed") {
  Limits l = test_limits();
  l.handshake_timeout = l.header_timeout = l.read_timeout = l.write_timeout = l.idle_timeout =
      std::chrono::hours(1);
  Fixture f{l};
  auto port = f.listen();
  auto stuck = Client::tls(port);
  REQUIRE_MESSAGE(stuck->ok, stuck->error);
  REQUIRE(stuck->send(request("GET", "/park")));
  auto silent = Client::tls(port);  // a client that ignores close_notify
  REQUIRE_MESSAGE(silent->ok, silent->error);
  REQUIRE(eventually([&] { return f.server->open_connections() == 2; }));
  auto t0 = Clock::now();
  auto p = std::make_shared<std::promise<void>>();
  auto done = p->get_future();
  f.server->shutdown(300ms, [p] { p->set_value(); });
  REQUIRE(done.wait_for(30s) == std::future_status::ready);
  CHECK(Clock::now() - t0 >= 250ms);
  CHECK(f.server->open_connections() == 0);
  CHECK_FALSE(stuck->response());
}

namespace {

// 20 clients of 20 requests each (TLS and the admin socket, some answered from another thread),
// each answer checked against its request.
void serve_twenty_clients(Fixture& f) {
  auto port = f.listen();
  auto path = f.listen_unix();
  std::atomic<int> answered{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 20; ++i) {
    clients.emplace_back([&, i] {
      auto c = i % 4 == 3 ? Client::plain_unix(path) : Client::tls(port);
      if (!c->ok) return;
      for (int j = 0; j < 20; ++j) {
        auto body = std::to_string(i) + "/" + std::to_string(j);
        auto target = j % 5 == 0 ? std::string("/slow?ms=5") : std::string("/echo");
        auto r = c->roundtrip(request("POST", target, body));
        if (!r || r->status != 200) return;
        if (target == "/echo" && json::parse(r->body).as_object()["body"].as_string() != body) return;
        ++answered;
      }
    });
  }
  for (auto& t : clients) t.join();
  CHECK(answered == 400);
  CHECK(eventually([&] { return f.server->open_connections() == 0; }));
}

}  // namespace

TEST_CASE("concurrency: 20 clients x 20 requests, two I/O threads (each connection on its strand)") {
  Fixture f;
  serve_twenty_clients(f);
}

TEST_CASE("concurrency: 20 clients x 20 requests, one I/O thread (Limits::one_thread: no strands)") {
  Limits limits = test_limits();
  limits.one_thread = true;
  Fixture f(limits);
  serve_twenty_clients(f);
}

TEST_CASE(
    "plain HTTP listener (metrics.listen): no TLS, its own peer kind; every answer observed, the server's "
    "own too") {
  Fixture f;
  const std::uint16_t port = [] {  // a free port: bound and released
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    ::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    ::close(fd);
    return ntohs(sa.sin_port);
  }();
  auto l = f.server->listen_plain("127.0.0.1", port);
  REQUIRE_MESSAGE(l.has_value(), (l ? "" : l.error().detail));
  auto c = Client::plain_tcp(port);
  REQUIRE(c->ok);
  auto r = c->roundtrip(request("GET", "/echo?x=1"));
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->problem().at("peerKind") == "plain");
  r = c->roundtrip(request("GET", "/nothing-here"));
  REQUIRE(r);
  CHECK(r->status == 404);
  auto big = Client::plain_tcp(port);
  REQUIRE(big->ok);
  r = big->roundtrip(request("GET", "/echo", {}, {"X-Big: " + std::string(9 * 1024, 'a')}));
  REQUIRE(r);
  CHECK(r->status == 431);
  CHECK(eventually([&] {
    std::lock_guard lock(f.log_mu);
    return f.answered.size() == 3;
  }));
  std::lock_guard lock(f.log_mu);
  REQUIRE(f.answered.size() == 3);
  CHECK(f.answered[0] == std::tuple<std::string, std::string, unsigned, Peer::Kind>{"GET", "/echo", 200,
                                                                                    Peer::Kind::plain_tcp});
  CHECK(f.answered[1] == std::tuple<std::string, std::string, unsigned, Peer::Kind>{
                             "GET", "/nothing-here", 404, Peer::Kind::plain_tcp});
  CHECK(f.answered[2] ==
        std::tuple<std::string, std::string, unsigned, Peer::Kind>{"", "", 431, Peer::Kind::plain_tcp});
  CHECK(f.server->tls_port() == 0);  // a plain listener is not the HTTPS port
}
