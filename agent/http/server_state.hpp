// What the server's parts share (private to agent/http): ServerState, SessionBase, the session factories.
// server.cpp holds the registry and the shutdown, listeners.cpp the accept loops and the budgets,
// session.cpp the per-connection state machine that start_plain_session and start_tls_session start.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gpunode/error/error.hpp"
#include "gpunode/http/server.hpp"

namespace gpunode::http {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = net::ip::tcp;
using unix_proto = net::local::stream_protocol;
using LogFn = std::function<void(std::string_view)>;

namespace detail {

class SessionBase {
 public:
  virtual ~SessionBase() = default;
  virtual void drain() = 0;        // any thread: finish the request in flight, then close
  virtual void force_close() = 0;  // any thread: close now
  virtual void recheck() = 0;      // any thread: close now if the peer is no longer admitted
};

struct UnixListener {
  std::unique_ptr<unix_proto::acceptor> acceptor;
  std::string path;
  PeerFilter filter;
  dev_t dev = 0;
  ino_t ino = 0;
  bool unlinked = false;
};

struct ServerState : std::enable_shared_from_this<ServerState> {
  ServerState(net::io_context& io_ctx, Limits l, Handler h, LogFn lg, Observer o)
      : io(io_ctx), limits(l), handler(std::move(h)), log_fn(std::move(lg)), observer(std::move(o)) {}

  net::io_context& io;
  const Limits limits;
  // Where a new connection's handlers run: its own strand, or (Limits::one_thread) the io_context.
  net::any_io_executor connection_executor() const {
    if (limits.one_thread) return io.get_executor();
    return net::make_strand(io);
  }
  const Handler handler;
  const LogFn log_fn;
  const Observer observer;

  // Open connections' access (CONTRACT §10 "A reload takes away what it takes away"): moved by
  // Server::recheck_access. A session checks its peer again when this is past the generation it
  // last checked at: before it dispatches a request, before it writes an answer, and at once when
  // recheck() reaches it. Any thread.
  std::atomic<std::uint64_t> access_generation{0};

  // Guards everything below, and every call on an acceptor (initiating an accept, closing it).
  mutable std::mutex mu;
  std::shared_ptr<ssl::context> tls;
  std::vector<std::unique_ptr<tcp::acceptor>> tcp_acceptors;  // HTTPS and plain HTTP alike
  std::vector<std::unique_ptr<UnixListener>> unix_listeners;
  bool accepting = true;
  std::uint16_t port = 0;
  std::uint64_t next_id = 0;
  // Open connections by budget (CONTRACT §10): TLS in total and by client address, plain TCP, the
  // admin socket. Taken at accept (admit), given back when the session goes (release).
  std::size_t open_tls = 0, open_plain = 0, open_unix = 0;
  std::unordered_map<std::string, std::size_t> tls_by_address;
  // Refusals since the last line about them; a line at most once a minute.
  std::size_t refused = 0;
  std::chrono::steady_clock::time_point refusals_logged{};
  bool ever_refused = false;
  std::unordered_map<std::uint64_t, std::weak_ptr<SessionBase>> sessions;
  bool draining = false;
  std::vector<std::function<void()>> done;
  std::unique_ptr<net::steady_timer> drain_timer;

  // server.cpp: the observer and the logger (a throw from either is swallowed), the sessions.
  void observe(const Answered& a) const;
  void log(std::string_view message) const;
  // Registers a session; says whether a shutdown is already under way.
  std::pair<std::uint64_t, bool> add(std::weak_ptr<SessionBase> s);
  void remove(std::uint64_t id);
  // The live sessions. Call without holding mu; drop the result without holding it too.
  std::vector<std::shared_ptr<SessionBase>> live();
  // The context new TLS connections get; it says whether client certificates are required now.
  std::shared_ptr<ssl::context> current_tls() const;

  // listeners.cpp: the listeners, the accept loops and the connection budgets.
  void stop_accepting();
  // Whether a new connection of `kind` from `address` fits the budgets; takes its place if it does.
  // `address` is the client's IP for TLS (empty otherwise).
  bool admit(Peer::Kind kind, const std::string& address);
  void release(Peer::Kind kind, const std::string& address);
  void retry_later(std::function<void()> f);
  void accept_tcp(tcp::acceptor* a, bool plain);
  void on_tcp_accept(tcp::acceptor* a, bool plain, boost::system::error_code ec, tcp::socket socket);
  void accept_unix(UnixListener* l);
  void on_unix_accept(UnixListener* l, boost::system::error_code ec, unix_proto::socket socket);
  // Fills `peer` from the admin socket's credentials and asks the listener's PeerFilter; logs a refusal.
  bool peer_allowed(const UnixListener& l, int fd, Peer& peer);
};

// session.cpp: serve one connection until it closes. Only for a connection ServerState::admit()
// took: the session gives its place back (release) when it goes. `budget_address` is the client IP
// the TLS budget counted it under (empty otherwise). The socket's executor is the connection's
// strand. Plain: the admin socket and listen_plain's TCP, both as a generic stream socket (one
// instantiation of the session's code for the two). TLS: keeps `ctx` for the connection's life.
// `filter`: the admin socket's PeerFilter, asked again for the peer when access is rechecked (none
// for metrics.listen's plain TCP).
void start_plain_session(std::shared_ptr<ServerState> st, Peer peer, std::string budget_address,
                         net::generic::stream_protocol::socket socket, PeerFilter filter = {});
void start_tls_session(std::shared_ptr<ServerState> st, Peer peer, std::string budget_address,
                       std::shared_ptr<ssl::context> ctx, tcp::socket socket);

// tls.cpp: that the client of `ssl` (its handshake done) presented a certificate that `current`
// accepts now: its chain verified against current's client CA as a handshake would. Success when
// current requires no client certificate; else permission (internal when the check could not
// run), the detail saying what was missing or wrong.
error::Result<void> client_certificate_accepted(SSL* ssl, SSL_CTX* current);

}  // namespace detail
}  // namespace gpunode::http
