// Server::recheck_access (CONTRACT §10 "A reload takes away what it takes away"): the connections
// already open lose what a reload took away, before anything more is answered on them. Each case
// holds a connection open across the change, and asks on that same connection.
#include "server_fixture.hpp"

using namespace server_test;

namespace {

// A PeerFilter the test turns: the admin socket's AdminPeers as a reload changes them.
struct Gate {
  std::shared_ptr<std::atomic<bool>> open = std::make_shared<std::atomic<bool>>(true);
  gpunode::http::PeerFilter filter() const {
    return [open = open](const Peer&) { return open->load(); };
  }
};

std::shared_ptr<boost::asio::ssl::context> context(const TlsFiles& files) {
  auto ctx = gpunode::http::make_tls_context(files);
  REQUIRE_MESSAGE(ctx.has_value(), (ctx ? "" : ctx.error().detail));
  return *ctx;
}

}  // namespace

TEST_CASE("recheck_access: an admin-socket peer no longer admitted is closed on its open connection") {
  Fixture f;
  Gate gate;
  const auto path = f.listen_unix(gate.filter());
  auto kept = Client::plain_unix(path);
  auto r = kept->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->status == 200);

  gate.open->store(false);  // the reload's new allowed_uids and allowed_group leave this peer out
  SUBCASE("without a recheck an open connection is not judged again (only new ones are)") {
    r = kept->roundtrip(request("GET", "/echo"));
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(Client::plain_unix(path)->closed_without_data());
  }
  SUBCASE("recheck_access closes it, idle, with no answer to what it sends next") {
    f.server->recheck_access();
    CHECK(kept->closed_without_data());
    CHECK(f.logged("no longer admitted after a reload"));
  }
  SUBCASE("a request sent right after the recheck is not answered") {
    f.server->recheck_access();
    kept->send(request("GET", "/echo"));
    CHECK_FALSE(kept->response());
  }
  SUBCASE("a request in flight at the recheck gets no answer") {
    kept->send(request("GET", "/slow?ms=300"));
    REQUIRE(eventually([&] { return f.slow_started.load() == 1; }));
    f.server->recheck_access();
    CHECK_FALSE(kept->response());
  }
}

TEST_CASE("recheck_access: a peer still admitted keeps its connection; a peer admitted again is served") {
  Fixture f;
  Gate gate;
  const auto path = f.listen_unix(gate.filter());
  auto kept = Client::plain_unix(path);
  f.server->recheck_access();
  auto r = kept->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->status == 200);
  gate.open->store(false);
  f.server->recheck_access();
  CHECK(kept->closed_without_data());
  gate.open->store(true);
  f.server->recheck_access();
  auto again = Client::plain_unix(path);
  r = again->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->status == 200);
}

TEST_CASE("recheck_access: a client CA added closes the HTTPS connections that presented no certificate") {
  const auto& c = certs();
  Fixture f;
  const auto port = f.listen({c.server_cert, c.server_key, {}});
  auto bare = Client::tls(port);
  REQUIRE_MESSAGE(bare->ok, bare->error);
  auto r = bare->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->status == 200);

  f.server->set_tls_context(context({c.server_cert, c.server_key, c.ca}));
  SUBCASE("the context alone changes only new connections") {
    r = bare->roundtrip(request("GET", "/echo"));
    REQUIRE(r);
    CHECK(r->status == 200);
  }
  SUBCASE("recheck_access closes it; a new connection needs the CA's certificate") {
    f.server->recheck_access();
    bare->send(request("GET", "/echo"));
    CHECK_FALSE(bare->response());
    CHECK(f.logged("presented no certificate, and api.tls.client_ca now requires one"));
    auto with_cert = Client::tls(port, {.cert = c.client_cert, .key = c.client_key});
    REQUIRE_MESSAGE(with_cert->ok, with_cert->error);
    r = with_cert->roundtrip(request("GET", "/echo"));
    REQUIRE(r);
    CHECK(r->status == 200);
  }
}

TEST_CASE("recheck_access: a client CA changed keeps the clients it accepts and closes the others") {
  const auto& c = certs();
  Fixture f;
  const auto port = f.listen({c.server_cert, c.server_key, c.ca});
  auto client = Client::tls(port, {.cert = c.client_cert, .key = c.client_key});
  REQUIRE_MESSAGE(client->ok, client->error);
  auto r = client->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->status == 200);

  SUBCASE("the same CA (the server's certificate rotated): the client stays") {
    f.server->set_tls_context(context({c.server2_cert, c.server2_key, c.ca}));
    f.server->recheck_access();
    r = client->roundtrip(request("GET", "/echo"));
    REQUIRE(r);
    CHECK(r->status == 200);
  }
  SUBCASE("another CA, which did not issue the client's certificate: closed") {
    f.server->set_tls_context(context({c.server_cert, c.server_key, c.rogue_cert}));
    f.server->recheck_access();
    client->send(request("GET", "/echo"));
    CHECK_FALSE(client->response());
    CHECK(f.logged("the client certificate is not accepted by api.tls.client_ca now"));
  }
  SUBCASE("the client CA removed: every client is admitted") {
    f.server->set_tls_context(context({c.server_cert, c.server_key, {}}));
    f.server->recheck_access();
    r = client->roundtrip(request("GET", "/echo"));
    REQUIRE(r);
    CHECK(r->status == 200);
  }
}
