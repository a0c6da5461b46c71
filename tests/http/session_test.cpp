// One connection's session driven over a socketpair: no listener, no TCP, no TLS. The session's end
// is started as the admin socket's accept starts it (admitted, then start_plain_session); the
// test's end is a blocking socket whose answers Beast's parser reads, so the framing is checked too.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/json.hpp>
#include <boost/system/system_error.hpp>
#include <cerrno>
#include <chrono>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "raw_request.hpp"
#include "server_state.hpp"

namespace {

namespace net = boost::asio;
namespace bhttp = boost::beast::http;
namespace json = boost::json;
using namespace std::chrono_literals;
using gpunode::http::Limits;
using gpunode::http::Peer;
using gpunode::http::Reply;
using gpunode::http::Request;
using gpunode::http::Response;
using gpunode::http::detail::ServerState;
using Clock = std::chrono::steady_clock;
using HttpResponse = bhttp::response<bhttp::string_body>;

// The test's end of the socketpair as Beast's SyncReadStream: blocking reads, each up to the 5 s
// receive timeout.
struct FdStream {
  int fd;

  template <class Buffers>
  std::size_t read_some(const Buffers& buffers, boost::system::error_code& ec) {
    ec = {};
    const net::mutable_buffer b = *net::buffer_sequence_begin(buffers);
    const auto n = ::recv(fd, b.data(), b.size(), 0);
    if (n > 0) return static_cast<std::size_t>(n);
    if (n == 0) {
      ec = net::error::eof;
    } else {
      ec = boost::system::error_code(errno, boost::system::system_category());
    }
    return 0;
  }

  template <class Buffers>
  std::size_t read_some(const Buffers& buffers) {
    boost::system::error_code ec;
    const auto n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }
};

class Conn {
 public:
  explicit Conn(int fd) : fd_(fd) {
    timeval tv{5, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }
  ~Conn() { ::close(fd_); }
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  bool send(std::string_view data) {
    while (!data.empty()) {
      const auto n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  // The next answer whole (its header up to 128 KiB: the session may send fields of 64 KiB).
  std::optional<HttpResponse> response() {
    FdStream stream{fd_};
    bhttp::response_parser<bhttp::string_body> parser;
    parser.header_limit(128 * 1024);
    boost::system::error_code ec;
    bhttp::read(stream, buffer_, parser, ec);
    if (ec) return std::nullopt;
    return parser.release();
  }

  std::optional<HttpResponse> roundtrip(std::string_view request) {
    if (!send(request)) return std::nullopt;
    return response();
  }

  // True when the session ends the connection (an orderly end or a reset) with nothing more sent;
  // false on data or on the receive timeout.
  bool closed_without_data() {
    if (buffer_.size() != 0) return false;
    char c = 0;
    const auto n = ::recv(fd_, &c, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

 private:
  int fd_;
  boost::beast::flat_buffer buffer_;
};

using gpunode::http::testing::request;  // a request as a client writes it

Limits test_limits() {
  Limits l;
  l.body = 16;
  l.header = 1024;
  l.handshake_timeout = 5s;
  l.header_timeout = 5s;
  l.read_timeout = 5s;
  l.write_timeout = 5s;
  l.idle_timeout = 10s;
  l.one_thread = true;  // the Harness runs its io_context on one thread
  return l;
}

// An admin-socket peer, as the listener would fill it from SO_PEERCRED and SO_PEERGROUPS.
Peer admin_peer() {
  Peer p;
  p.kind = Peer::Kind::unix_socket;
  p.address = "/run/gpunode/admin.sock";
  p.uid = 1000;
  p.gid = 1001;
  p.pid = 4242;
  p.groups = {1001, 27};
  return p;
}

// A ServerState with no listener, its io_context run by one thread as the daemon's are
// (Limits::one_thread: the sessions run on its executor, no strand), and a handler that answers by
// path:
//   /echo        200 {"path":...} with headers the session must drop or keep; the request is kept
//   /throw       throws
//   /status42    answers status 42
//   /hold        keeps the Reply for the test to answer
//   /nocontent   204 with a body the session must drop
//   /huge        200 with the largest field Beast can hold, and one a byte larger
//   anything     404 problem
struct Harness {
  net::io_context io;
  net::executor_work_guard<net::io_context::executor_type> guard{io.get_executor()};
  std::mutex mu;  // guards what the handler, the logger and the observer write
  std::vector<Request> requests;
  std::vector<std::string> logs;
  std::vector<std::tuple<std::string, std::string, unsigned, Peer::Kind>> answered;
  std::optional<Reply> held;
  std::shared_ptr<ServerState> state;
  std::thread thread;

  explicit Harness(Limits limits = test_limits()) {
    state = std::make_shared<ServerState>(
        io, limits, [this](Request r, Reply reply) { handle(std::move(r), std::move(reply)); },
        [this](std::string_view m) {
          std::lock_guard lock(mu);
          logs.emplace_back(m);
        },
        [this](const gpunode::http::Answered& a) {
          std::lock_guard lock(mu);
          answered.emplace_back(std::string(a.method), std::string(a.path), a.status, a.via);
        });
    thread = std::thread([this] { io.run(); });
  }

  ~Harness() {
    for (auto& s : state->live()) s->force_close();
    CHECK(eventually([&] { return open_sessions() == 0; }));
    guard.reset();
    io.stop();
    thread.join();
  }

  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  // A new connection: the session's end admitted and started, the test's end returned.
  std::unique_ptr<Conn> connect(const Peer& peer = admin_peer()) {
    int fds[2] = {-1, -1};
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    // On the executor the listener would give it: the io_context's own (Limits::one_thread).
    gpunode::http::unix_proto::socket session_end(state->connection_executor(), gpunode::http::unix_proto(),
                                                  fds[0]);
    REQUIRE(state->admit(peer.kind, {}));
    gpunode::http::detail::start_plain_session(state, peer, {},
                                               net::generic::stream_protocol::socket(std::move(session_end)));
    return std::make_unique<Conn>(fds[1]);
  }

  void handle(Request r, Reply reply) {
    std::unique_lock lock(mu);
    requests.push_back(r);
    if (r.path == "/echo") {
      lock.unlock();
      reply(Response{200,
                     {{"X-Echo", "yes"},
                      {"Content-Length", "1"},
                      {"X-Request-Id", "forged"},
                      {"Bad Name", "dropped"},
                      {"X-Split", "a\r\nInjected: 1"}},
                     R"({"path":")" + r.path + R"("})"});
    } else if (r.path == "/throw") {
      throw std::runtime_error("boom");
    } else if (r.path == "/status42") {
      lock.unlock();
      reply(Response{42, {}, "?"});
    } else if (r.path == "/hold") {
      held = std::move(reply);
    } else if (r.path == "/nocontent") {
      lock.unlock();
      reply(Response{204, {}, "dropped"});
    } else if (r.path == "/huge") {
      lock.unlock();
      reply(Response{
          200, {{"X-Largest", std::string(65533, 'l')}, {"X-Too-Large", std::string(65534, 't')}}, "{}"});
    } else {
      lock.unlock();
      reply(gpunode::http::problem(404, "not-found", "no such route"));
    }
  }

  std::size_t open_sessions() {
    std::lock_guard lock(state->mu);
    return state->sessions.size();
  }

  std::size_t open_unix() {
    std::lock_guard lock(state->mu);
    return state->open_unix;
  }

  std::size_t handled() {
    std::lock_guard lock(mu);
    return requests.size();
  }

  bool logged(std::string_view line) {
    std::lock_guard lock(mu);
    return std::find(logs.begin(), logs.end(), line) != logs.end();
  }

  template <class Pred>
  static bool eventually(Pred pred, std::chrono::milliseconds limit = 3s) {
    const auto until = Clock::now() + limit;
    while (Clock::now() < until) {
      if (pred()) return true;
      std::this_thread::sleep_for(5ms);
    }
    return pred();
  }
};

std::string header(const HttpResponse& r, std::string_view name) {
  auto it = r.find(name);
  return it == r.end() ? std::string{} : std::string(it->value());
}

void check_problem(const HttpResponse& r, unsigned status, std::string_view code, std::string_view detail) {
  CHECK(r.result_int() == status);
  CHECK(header(r, "Content-Type") == "application/problem+json");
  auto o = json::parse(r.body()).as_object();
  CHECK(o["code"].as_string() == code);
  CHECK(o["status"].to_number<unsigned>() == status);
  CHECK(o["detail"].as_string() == detail);
}

using Seen = std::tuple<std::string, std::string, unsigned, Peer::Kind>;

}  // namespace

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
// arrives in pieces is read on until it is whole; requests sent back to back are each answered.
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

  // The request line, the rest of the header, then the body: each piece after a pause.
  const auto whole = request("POST", "/echo", "pieces", {"X-Foo: Bar"});
  const auto header_end = whole.find("\r\n\r\n") + 4;
  for (const auto& piece :
       {whole.substr(0, 10), whole.substr(10, header_end - 10), whole.substr(header_end)}) {
    REQUIRE(c->send(piece));
    std::this_thread::sleep_for(50ms);
  }
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
  for (const std::string& piece :
       {head + "5\r\nchu", std::string("nk\r\n"), std::string("3\r\ned!\r\n0\r\n\r\n")}) {
    REQUIRE(c->send(piece));
    std::this_thread::sleep_for(50ms);
  }
  auto r = c->response();
  REQUIRE(r);
  CHECK(r->result_int() == 200);
  {
    std::lock_guard lock(h.mu);
    REQUIRE(h.requests.size() == 1);
    CHECK(h.requests[0].body == "chunked!");
  }

  auto d = h.connect();
  REQUIRE(d->send("GET /echo HTTP/1.1\r\nHost: test\r\nX-A: " + std::string(600, 'a') + "\r\n"));
  std::this_thread::sleep_for(50ms);
  REQUIRE(d->send("X-B: " + std::string(600, 'b') + "\r\n\r\n"));
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

TEST_CASE("session: request fields that never end are cut at header_timeout, without an answer") {
  Limits l = test_limits();
  l.header_timeout = 1s;
  Harness h(l);
  auto c = h.connect();
  const auto t0 = Clock::now();
  REQUIRE(c->send("GET /echo HTTP/1.1\r\nHost: x\r\nX-Half: "));
  CHECK(c->closed_without_data());
  const auto elapsed = Clock::now() - t0;
  CHECK(elapsed >= 900ms);
  CHECK(elapsed < 3s);
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
