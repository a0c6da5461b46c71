// One connection's session over a socketpair, as session_test.cpp and reply_test.cpp drive it: no
// listener, no TCP, no TLS. The session's end is started as the admin socket's accept starts it
// (admitted, then start_plain_session); the test's end is a blocking socket whose answers Beast's
// parser reads, so the framing is checked too.
#pragma once

#include <doctest/doctest.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/json.hpp>
#include <boost/system/system_error.hpp>
#include <cerrno>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "raw_request.hpp"
#include "recorders.hpp"
#include "server_state.hpp"

namespace session_test {

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

  // One piece of a request, sent and then read by the session before this returns: SIOCOUTQ on a
  // Unix stream socket counts what the peer has not read yet. The next piece therefore arrives in a
  // read of its own: the session cannot find it in its buffer with the one before. False when the
  // piece is not read within `limit` (a hang guard, not a bound on the session's speed).
  bool send_piece(std::string_view piece, std::chrono::seconds limit = std::chrono::seconds(30)) {
    if (!send(piece)) return false;
    const auto until = std::chrono::steady_clock::now() + limit;
    for (;;) {
      int unread = -1;
      if (::ioctl(fd_, SIOCOUTQ, &unread) != 0) return false;
      if (unread == 0) return true;
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // How long a read waits for the session (SO_RCVTIMEO; 5 s unless set here).
  void patience(std::chrono::seconds limit) {
    timeval tv{static_cast<time_t>(limit.count()), 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
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

inline Limits test_limits() {
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
inline Peer admin_peer() {
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
//   /hold        keeps the Reply for the test to answer (or to let go)
//   /drop        lets the Reply go at once, unanswered
//   /drop-thread lets it go on another thread
//   /copies      keeps two copies of the Reply (in `copies`), neither answered
//   /side        queues the Reply in `side`, an io_context no thread runs (the test destroys it)
//   /timer       keeps the Reply in a timer on the session's own io_context that never fires
//   /nocontent   204 with a body the session must drop
//   /huge        200 with the largest field Beast can hold, and one a byte larger
//   anything     404 problem
struct Harness {
  net::io_context io;
  net::executor_work_guard<net::io_context::executor_type> guard{io.get_executor()};
  std::mutex mu;  // guards what the handler, the logger and the observer write
  std::vector<Request> requests;
  std::vector<std::string> logs;
  std::vector<gpunode::http::testing::Seen> answered;
  std::optional<Reply> held;
  std::vector<std::function<void()>> copies;  // lambdas that each hold a copy of one Reply
  std::optional<net::io_context> side{std::in_place};
  std::vector<std::thread> droppers;  // the threads /drop-thread lets its Reply go on (under mu)
  std::shared_ptr<ServerState> state;
  std::thread thread;
  bool close_at_end = true;  // false: the io_context goes with its sessions still open

  explicit Harness(Limits limits = test_limits()) {
    state = std::make_shared<ServerState>(
        io, limits, [this](Request r, Reply reply) { handle(std::move(r), std::move(reply)); },
        gpunode::http::testing::log_into(mu, logs), gpunode::http::testing::answers_into(mu, answered));
    thread = std::thread([this] { io.run(); });
  }

  ~Harness() {
    std::vector<std::thread> started;
    {
      std::lock_guard lock(mu);
      started.swap(droppers);
    }
    for (auto& t : started) t.join();
    if (close_at_end) {
      for (auto& s : state->live()) s->force_close();
      CHECK(eventually([&] { return open_sessions() == 0; }));
    }
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
    } else if (r.path == "/drop") {
      // the Reply goes when this returns
    } else if (r.path == "/drop-thread") {
      droppers.emplace_back([reply = std::move(reply)]() mutable { Reply gone = std::move(reply); });
    } else if (r.path == "/copies") {
      copies.emplace_back([reply] { reply(Response{200, {}, "first"}); });
      copies.emplace_back([reply = std::move(reply)] { reply(Response{200, {}, "second"}); });
    } else if (r.path == "/side") {
      net::post(*side, [reply = std::move(reply)] { reply(Response{200, {}, "never run"}); });
    } else if (r.path == "/timer") {
      auto t = std::make_shared<net::steady_timer>(io, std::chrono::hours(1));
      t->async_wait([t, reply = std::move(reply)](boost::system::error_code) {});
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

  // Lets the io_context run what is queued now, twice round (a handler that posts once more is
  // run too): a check after it sees what the session did with what it had read, not a moment
  // before it got to it.
  void settle() {
    for (int round = 0; round < 2; ++round) {
      std::promise<void> ran;
      net::post(io, [&ran] { ran.set_value(); });
      ran.get_future().wait();
    }
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

inline std::string header(const HttpResponse& r, std::string_view name) {
  auto it = r.find(name);
  return it == r.end() ? std::string{} : std::string(it->value());
}

inline void check_problem(const HttpResponse& r, unsigned status, std::string_view code,
                          std::string_view detail) {
  CHECK(r.result_int() == status);
  CHECK(header(r, "Content-Type") == "application/problem+json");
  auto o = json::parse(r.body()).as_object();
  CHECK(o["code"].as_string() == code);
  CHECK(o["status"].to_number<unsigned>() == status);
  CHECK(o["detail"].as_string() == detail);
}

using gpunode::http::testing::Seen;

}  // namespace session_test
