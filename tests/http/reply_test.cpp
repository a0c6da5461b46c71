// A Reply let go unanswered (server.hpp, bmcweb's AsyncResp): wherever its last copy goes, the
// request is answered 500 `internal` and logged naming it, once; an answer given is unaffected; a
// Reply outliving its connection or its io_context does nothing.
#include "session_harness.hpp"

using namespace session_test;  // NOLINT(google-build-using-namespace): the harness, test by test

namespace {

constexpr std::string_view kDetail = "the request could not be handled";

std::string dropped_line(std::string_view id, std::string_view path) {
  return "http: REQUEST=" + std::string(id) + " GET " + std::string(path) +
         ": the handler let its Reply go unanswered; answered 500";
}

// Asks /hold on `c` (request id `id`) and waits until the handler holds the Reply.
void send_held(Harness& h, Conn& c, const std::string& id) {
  REQUIRE(c.send(request("GET", "/hold", {}, {"X-Request-Id: " + id})));
  REQUIRE(Harness::eventually([&] {
    std::lock_guard lock(h.mu);
    return h.held.has_value();
  }));
}

// The held Reply, taken out of the harness (to let go of, or to keep).
Reply take_held(Harness& h) {
  std::lock_guard lock(h.mu);
  Reply r = std::move(*h.held);
  h.held.reset();
  return r;
}

std::size_t log_count(Harness& h) {
  std::lock_guard lock(h.mu);
  return h.logs.size();
}

}  // namespace

TEST_CASE("reply: one let go at once is answered 500 and logged, once; the connection goes on") {
  Harness h;
  auto c = h.connect();
  auto r = c->roundtrip(request("GET", "/drop", {}, {"X-Request-Id: gone-1"}));
  REQUIRE(r);
  check_problem(*r, 500, "internal", kDetail);
  CHECK(header(*r, "X-Request-Id") == "gone-1");
  CHECK(r->keep_alive());
  CHECK(h.logged(dropped_line("gone-1", "/drop")));

  r = c->roundtrip(request("GET", "/echo"));  // a normal answer is unaffected
  REQUIRE(r);
  CHECK(r->result_int() == 200);
  CHECK(r->body() == R"({"path":"/echo"})");
  std::lock_guard lock(h.mu);
  CHECK(h.logs.size() == 1);
  REQUIRE(h.answered.size() == 2);
  CHECK(h.answered[0] == Seen{"GET", "/drop", 500, Peer::Kind::unix_socket});
  CHECK(h.answered[1] == Seen{"GET", "/echo", 200, Peer::Kind::unix_socket});
}

TEST_CASE("reply: one let go on another thread is answered 500 on the connection's executor") {
  Harness h;
  auto c = h.connect();
  auto r = c->roundtrip(request("GET", "/drop-thread", {}, {"X-Request-Id: gone-2"}));
  REQUIRE(r);
  check_problem(*r, 500, "internal", kDetail);
  CHECK(h.logged(dropped_line("gone-2", "/drop-thread")));
  r = c->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->result_int() == 200);
}

TEST_CASE(
    "reply: copies share one answer: the last copy decides, an answer given is never followed by a 500") {
  Harness h;
  auto c = h.connect();
  REQUIRE(c->send(request("GET", "/copies", {}, {"X-Request-Id: copied"})));
  REQUIRE(Harness::eventually([&] {
    std::lock_guard lock(h.mu);
    return h.copies.size() == 2;
  }));
  std::function<void()> first, second;
  {
    std::lock_guard lock(h.mu);
    first = std::move(h.copies[0]);
    second = std::move(h.copies[1]);
    h.copies.clear();
  }
  first = nullptr;  // one copy of two goes: the request still waits for the other
  second();         // the last copy answers
  auto r = c->response();
  REQUIRE(r);
  CHECK(r->result_int() == 200);
  CHECK(r->body() == "second");
  second = nullptr;                           // answered: its going adds nothing
  r = c->roundtrip(request("GET", "/echo"));  // the next answer on the connection is the next request's
  REQUIRE(r);
  CHECK(r->result_int() == 200);
  CHECK(r->body() == R"({"path":"/echo"})");
  std::lock_guard lock(h.mu);
  CHECK(h.logs.empty());
  REQUIRE(h.answered.size() == 2);
  CHECK(h.answered[0] == Seen{"GET", "/copies", 200, Peer::Kind::unix_socket});
}

TEST_CASE("reply: one let go after its client left is answered into the void, logged, and the session ends") {
  Harness h;
  auto c = h.connect();
  send_held(h, *c, "left");
  c.reset();     // the client goes while its request is handled
  take_held(h);  // let go at once
  CHECK(Harness::eventually([&] { return h.logged(dropped_line("left", "/hold")); }));
  CHECK(Harness::eventually([&] { return h.open_sessions() == 0; }));
  std::lock_guard lock(h.mu);
  REQUIRE(h.answered.size() == 1);
  CHECK(h.answered[0] == Seen{"GET", "/hold", 500, Peer::Kind::unix_socket});
}

TEST_CASE("reply: one let go during a drain (a shutdown) is answered 500 with Connection: close") {
  Harness h;
  auto c = h.connect();
  send_held(h, *c, "stopping");
  for (auto& s : h.state->live()) s->drain();
  take_held(h);  // let go, as the daemon lets go of what it held when it stops
  auto r = c->response();
  REQUIRE(r);
  check_problem(*r, 500, "internal", kDetail);
  CHECK(header(*r, "Connection") == "close");
  CHECK(c->closed_without_data());
  CHECK(h.logged(dropped_line("stopping", "/hold")));
  CHECK(Harness::eventually([&] { return h.open_sessions() == 0; }));
}

TEST_CASE("reply: one queued in an io_context destroyed unrun is answered 500 when that io_context goes") {
  Harness h;
  auto c = h.connect();
  REQUIRE(c->send(request("GET", "/side", {}, {"X-Request-Id: queued"})));
  REQUIRE(Harness::eventually([&] { return h.handled() == 1; }));
  h.side.reset();  // as a thread's io_context goes with work still queued in it
  auto r = c->response();
  REQUIRE(r);
  check_problem(*r, 500, "internal", kDetail);
  CHECK(h.logged(dropped_line("queued", "/side")));
}

TEST_CASE("reply: one let go after its connection was closed does nothing") {
  Harness h;
  auto c = h.connect();
  send_held(h, *c, "held");
  for (auto& s : h.state->live()) s->force_close();
  REQUIRE(Harness::eventually([&] { return h.open_sessions() == 0; }));
  Reply late = take_held(h);
  late(Response{200, {}, "too late"});  // answering finds no one
  late = nullptr;
  auto other = h.connect();  // the server goes on, and the closed request left nothing behind
  REQUIRE(other->roundtrip(request("GET", "/echo")));
  CHECK(log_count(h) == 0);
  std::lock_guard lock(h.mu);
  REQUIRE(h.answered.size() == 1);
  CHECK(std::get<1>(h.answered[0]) == "/echo");
}

TEST_CASE("reply: one that outlives the server's io_context does nothing when called or let go") {
  Reply kept;
  {
    Harness h;
    auto c = h.connect();
    send_held(h, *c, "kept");
    kept = take_held(h);
  }
  kept(Response{200, {}, "after the end"});
  kept = nullptr;
}

TEST_CASE("reply: one let go while the io_context is destroyed, its session still open, does nothing") {
  // Under the sanitizers this is the check: the timer's handler (holding the Reply) and the
  // session's own wait go in whatever order the io_context destroys them.
  auto h = std::make_unique<Harness>();
  h->close_at_end = false;
  auto c = h->connect();
  REQUIRE(c->send(request("GET", "/timer")));
  REQUIRE(Harness::eventually([&] { return h->handled() == 1; }));
  h.reset();
  CHECK(c->closed_without_data());  // the session went with its io_context, answering nothing
}
