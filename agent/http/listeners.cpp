// The listeners: HTTPS, plain HTTP and the admin socket bound, their accept loops, the connection budgets.
// A connection is admitted (budgets, and the admin socket's PeerFilter over SO_PEERCRED and
// SO_PEERGROUPS) before a byte is read, then handed to a session (session.cpp).
#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/strand.hpp>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <expected>
#include <filesystem>

#include "server_state.hpp"

namespace gpunode::http {
namespace {

using error_code = boost::system::error_code;

std::string endpoint_text(const tcp::endpoint& ep) {
  if (ep.address().is_v6()) return fmt::format("[{}]:{}", ep.address().to_string(), ep.port());
  return fmt::format("{}:{}", ep.address().to_string(), ep.port());
}

// The endpoint to bind for `host` (empty or "*": every IPv4 address; an IPv4 or IPv6 address; or a
// host name, resolved here, at start, never on a request's path).
error::Result<tcp::endpoint> endpoint_of(net::io_context& io, const std::string& host, std::uint16_t port) {
  if (host.empty() || host == "*") return tcp::endpoint(net::ip::address_v4::any(), port);
  error_code ec;
  auto addr = net::ip::make_address(host, ec);
  if (!ec) return tcp::endpoint(addr, port);
  tcp::resolver resolver(io);
  auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || results.empty()) {
    if (ec) return std::unexpected(error::from_errno(ec.value(), fmt::format("cannot resolve {}", host)));
    return error::fail(error::Errc::not_found, fmt::format("cannot resolve {}: no address", host));
  }
  return results.begin()->endpoint();
}

// Whether something answers on the unix socket at `path` (a live server: do not steal it).
bool unix_socket_alive(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  bool alive = ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0;
  ::close(fd);
  return alive;
}

// The admin socket's directory (CONTRACT §7): made mode 0750 if missing, and given to the admin
// group so that its members can reach the socket. Only the last level is made: a missing parent
// (a mistyped admin.socket) is an error. One that exists is left as it is.
error::Result<void> make_socket_dir(const std::string& path, std::optional<gid_t> group) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) return {};
  if (::mkdir(dir.c_str(), 0700) != 0) {  // 0700 until it has its group, then 0750
    if (errno == EEXIST) return {};
    return std::unexpected(error::from_errno(
        errno, fmt::format("admin socket {}: cannot create its directory {}", path, dir.string())));
  }
  if (group && ::chown(dir.c_str(), static_cast<uid_t>(-1), *group) != 0) {
    return std::unexpected(
        error::from_errno(errno, fmt::format("admin socket {}: cannot give its directory {} to group {}",
                                             path, dir.string(), *group)));
  }
  if (::chmod(dir.c_str(), 0750) != 0) {
    return std::unexpected(error::from_errno(
        errno, fmt::format("admin socket {}: cannot chmod its directory {}", path, dir.string())));
  }
  return {};
}

// A socket file left at `path` by a process that is gone is removed; anything else there is an error.
error::Result<void> remove_stale_socket(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return error::fail(error::Errc::exists,
                         fmt::format("admin socket {}: exists and is not a socket", path));
    if (unix_socket_alive(path)) {
      return error::fail(error::Errc::busy,
                         fmt::format("admin socket {}: another process is listening on it", path));
    }
    if (::unlink(path.c_str()) != 0) {
      return std::unexpected(
          error::from_errno(errno, fmt::format("admin socket {}: cannot remove the stale socket", path)));
    }
  } else if (errno != ENOENT) {
    return std::unexpected(error::from_errno(errno, fmt::format("admin socket {}", path)));
  }
  return {};
}

// The admin socket bound at `path`, given to `group`, chmodded to `mode` and listening; on an
// error after bind the socket file is removed.
error::Result<std::unique_ptr<detail::UnixListener>> bind_unix(net::io_context& io, const std::string& path,
                                                               unsigned mode, std::optional<gid_t> group) {
  auto l = std::make_unique<detail::UnixListener>();
  l->acceptor = std::make_unique<unix_proto::acceptor>(io);
  l->path = path;
  error_code ec;
  auto failed = [&](std::string_view step, int err) {
    return std::unexpected(error::from_errno(err, fmt::format("admin socket {}: {}", path, step)));
  };
  if (l->acceptor->open(unix_proto(), ec); ec) return failed("socket", ec.value());
  if (l->acceptor->bind(unix_proto::endpoint(path), ec); ec) return failed("bind", ec.value());
  // Nobody can connect before listen(), so the socket is the group's and has its mode first.
  // (fchown on the socket's descriptor would change the socket, not the file that names it.)
  if (group && ::chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0) {
    const int why = errno;
    ::unlink(path.c_str());
    return failed(fmt::format("cannot give it to group {}", *group), why);
  }
  // chmod after bind: the mode does not depend on the umask.
  struct stat st {};
  if (::chmod(path.c_str(), static_cast<mode_t>(mode)) != 0 || ::lstat(path.c_str(), &st) != 0) {
    const int why = errno;
    ::unlink(path.c_str());
    return failed("chmod", why);
  }
  l->dev = st.st_dev;
  l->ino = st.st_ino;
  if (l->acceptor->listen(net::socket_base::max_listen_connections, ec); ec) {
    ::unlink(path.c_str());
    return failed("listen", ec.value());
  }
  return l;
}

// The peer's supplementary groups from the socket (SO_PEERGROUPS, Linux 4.13): its credentials
// when it connected, with no NSS lookup. ERANGE says the buffer was short and sets `len` to the
// size needed; the groups cannot change on a connected socket, so one retry at that size is enough
// (a few more are allowed all the same).
error::Result<std::vector<gid_t>> peer_groups(int fd) {
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      return groups;
    }
    if (errno != ERANGE) return std::unexpected(error::from_errno(errno, "SO_PEERGROUPS"));
    groups.resize(std::max<std::size_t>(len / sizeof(gid_t), groups.size() * 2));
  }
  return error::fail(error::Errc::internal, "SO_PEERGROUPS: the group list kept growing");
}

// Binds and listens on host:port for listen_tls and listen_plain; errors name the address and the step.
error::Result<std::unique_ptr<tcp::acceptor>> bind_tcp(net::io_context& io, const std::string& listen,
                                                       const std::string& host, std::uint16_t port) {
  auto ep = endpoint_of(io, host, port);
  if (!ep)
    return std::unexpected(error::Error{ep.error().code,
                                        fmt::format("cannot listen on {}: {}", listen, ep.error().detail),
                                        ep.error().native, ep.error().origin});
  auto a = std::make_unique<tcp::acceptor>(io);
  error_code ec;
  auto failed = [&](std::string_view step) {
    return std::unexpected(
        error::from_errno(ec.value(), fmt::format("cannot listen on {}: {}", listen, step)));
  };
  if (a->open(ep->protocol(), ec); ec) return failed("open");
  if (a->set_option(net::socket_base::reuse_address(true), ec); ec) return failed("SO_REUSEADDR");
  if (a->bind(*ep, ec); ec) return failed("bind");
  if (a->listen(net::socket_base::max_listen_connections, ec); ec) return failed("listen");
  return a;
}

std::string listen_text(const std::string& host, std::uint16_t port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

}  // namespace

namespace detail {

void ServerState::stop_accepting() {
  std::lock_guard lock(mu);
  accepting = false;
  error_code ec;
  for (auto& a : tcp_acceptors) a->close(ec);
  for (auto& l : unix_listeners) {
    l->acceptor->close(ec);
    struct stat st {};
    if (!l->unlinked && ::lstat(l->path.c_str(), &st) == 0 && st.st_dev == l->dev && st.st_ino == l->ino) {
      ::unlink(l->path.c_str());
    }
    l->unlinked = true;
  }
}

bool ServerState::admit(Peer::Kind kind, const std::string& address) {
  std::string line;
  {
    std::lock_guard lock(mu);
    std::string why;
    switch (kind) {
      case Peer::Kind::tcp: {
        auto& mine = tls_by_address[address];
        if (limits.max_connections != 0 && open_tls >= limits.max_connections) {
          why =
              fmt::format("the {} HTTPS connections of api.max_connections are open", limits.max_connections);
        } else if (limits.max_connections_per_client != 0 && mine >= limits.max_connections_per_client) {
          why = fmt::format("{} has the {} connections of api.max_connections_per_client open", address,
                            limits.max_connections_per_client);
        } else {
          ++open_tls;
          ++mine;
          return true;
        }
        if (mine == 0) tls_by_address.erase(address);
        break;
      }
      case Peer::Kind::plain_tcp:
        if (limits.max_plain_connections == 0 || open_plain < limits.max_plain_connections) {
          ++open_plain;
          return true;
        }
        why =
            fmt::format("the {} connections of the metrics listener are open", limits.max_plain_connections);
        break;
      case Peer::Kind::unix_socket:
        if (limits.max_unix_connections == 0 || open_unix < limits.max_unix_connections) {
          ++open_unix;
          return true;
        }
        why =
            fmt::format("the {} connections of admin.max_connections are open", limits.max_unix_connections);
        break;
    }
    ++refused;
    const auto now = std::chrono::steady_clock::now();
    if (!ever_refused || now - refusals_logged >= std::chrono::minutes(1)) {
      line = fmt::format(
          "connections refused: {} since the last such line ({}); the next line comes a minute from now at "
          "the soonest",
          refused, why);
      refused = 0;
      refusals_logged = now;
      ever_refused = true;
    }
  }
  if (!line.empty()) log(line);
  return false;
}

void ServerState::release(Peer::Kind kind, const std::string& address) {
  std::lock_guard lock(mu);
  switch (kind) {
    case Peer::Kind::tcp: {
      --open_tls;
      auto it = tls_by_address.find(address);
      if (it != tls_by_address.end() && --it->second == 0) tls_by_address.erase(it);
      break;
    }
    case Peer::Kind::plain_tcp:
      --open_plain;
      break;
    case Peer::Kind::unix_socket:
      --open_unix;
      break;
  }
}

void ServerState::retry_later(std::function<void()> f) {
  auto t = std::make_shared<net::steady_timer>(io, std::chrono::milliseconds(100));
  t->async_wait([t, f = std::move(f)](error_code ec) {
    if (!ec) f();
  });
}

void ServerState::accept_tcp(tcp::acceptor* a, bool plain) {
  std::lock_guard lock(mu);
  if (!accepting) return;
  a->async_accept(connection_executor(),
                  [self = shared_from_this(), a, plain](error_code ec, tcp::socket socket) {
                    self->on_tcp_accept(a, plain, ec, std::move(socket));
                  });
}

void ServerState::on_tcp_accept(tcp::acceptor* a, bool plain, error_code ec, tcp::socket socket) {
  if (ec) {
    if (ec == net::error::operation_aborted) return;
    {
      std::lock_guard lock(mu);
      if (!accepting) return;
    }
    log(fmt::format("http: accept failed: {}", ec.message()));
    retry_later([self = shared_from_this(), a, plain] { self->accept_tcp(a, plain); });
    return;
  }
  std::shared_ptr<ssl::context> ctx;
  if (!plain) {
    std::lock_guard lock(mu);
    ctx = tls;
  }
  Peer peer;
  peer.kind = plain ? Peer::Kind::plain_tcp : Peer::Kind::tcp;
  error_code rec;
  socket.set_option(tcp::no_delay(true), rec);  // responses are whole; never wait for Nagle
  auto remote = socket.remote_endpoint(rec);
  peer.address = rec ? std::string("?") : endpoint_text(remote);
  std::string client = plain || rec ? std::string() : remote.address().to_string();
  if (!admit(peer.kind, client)) {
    error_code cec;
    socket.close(cec);  // at once: not a byte read, no TLS
  } else if (plain) {
    start_plain_session(shared_from_this(), std::move(peer), std::move(client),
                        net::generic::stream_protocol::socket(std::move(socket)));
  } else {
    start_tls_session(shared_from_this(), std::move(peer), std::move(client), std::move(ctx),
                      std::move(socket));
  }
  accept_tcp(a, plain);
}

void ServerState::accept_unix(UnixListener* l) {
  std::lock_guard lock(mu);
  if (!accepting) return;
  l->acceptor->async_accept(connection_executor(),
                            [self = shared_from_this(), l](error_code ec, unix_proto::socket socket) {
                              self->on_unix_accept(l, ec, std::move(socket));
                            });
}

void ServerState::on_unix_accept(UnixListener* l, error_code ec, unix_proto::socket socket) {
  if (ec) {
    if (ec == net::error::operation_aborted) return;
    {
      std::lock_guard lock(mu);
      if (!accepting) return;
    }
    log(fmt::format("admin socket {}: accept failed: {}", l->path, ec.message()));
    retry_later([self = shared_from_this(), l] { self->accept_unix(l); });
    return;
  }
  Peer peer;
  peer.kind = Peer::Kind::unix_socket;
  peer.address = l->path;
  if (peer_allowed(*l, socket.native_handle(), peer) && admit(Peer::Kind::unix_socket, {})) {
    start_plain_session(shared_from_this(), std::move(peer), std::string(),
                        net::generic::stream_protocol::socket(std::move(socket)), l->filter);
  } else {
    error_code cec;
    socket.close(cec);
  }
  accept_unix(l);
}

bool ServerState::peer_allowed(const UnixListener& l, int fd, Peer& peer) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred) {
    log(fmt::format("admin socket {}: refused a peer: cannot read SO_PEERCRED: {}", l.path,
                    std::strerror(errno)));
    return false;
  }
  peer.uid = cred.uid;
  peer.gid = cred.gid;
  peer.pid = cred.pid;
  if (auto groups = peer_groups(fd)) {
    peer.groups = std::move(*groups);
  } else {
    log(fmt::format("admin socket {}: cannot read the supplementary groups of peer uid={} pid={}: {}", l.path,
                    cred.uid, cred.pid, groups.error().detail));
  }
  bool ok = false;
  try {
    ok = !l.filter || l.filter(peer);
  } catch (...) {
    ok = false;
  }
  if (!ok) {
    log(fmt::format("admin socket {}: refused peer uid={} gid={} pid={}", l.path, cred.uid, cred.gid,
                    cred.pid));
  }
  return ok;
}

}  // namespace detail

error::Result<void> Server::listen_tls(const std::string& host, std::uint16_t port,
                                       std::shared_ptr<ssl::context> tls) {
  const std::string listen = listen_text(host, port);
  if (!tls) return error::fail(error::Errc::invalid, fmt::format("listen {}: no TLS context", listen));
  auto a = bind_tcp(state_->io, listen, host, port);
  if (!a) return std::unexpected(a.error());
  error_code ec;
  auto bound = (*a)->local_endpoint(ec);
  tcp::acceptor* raw = a->get();
  {
    std::lock_guard lock(state_->mu);
    if (!state_->accepting)
      return error::fail(error::Errc::unavailable,
                         fmt::format("listen {}: the server is shutting down", listen));
    state_->tls = std::move(tls);
    if (state_->port == 0 && !ec) state_->port = bound.port();
    state_->tcp_acceptors.push_back(std::move(*a));
  }
  state_->accept_tcp(raw, false);
  return {};
}

error::Result<void> Server::adopt_tls(int fd, std::shared_ptr<ssl::context> tls) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
      (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)) {
    ::close(fd);
    return error::fail(error::Errc::invalid, fmt::format("passed socket (fd {}): not a TCP socket", fd));
  }
  auto a = std::make_unique<tcp::acceptor>(state_->io);
  error_code ec;
  if (a->assign(ss.ss_family == AF_INET ? tcp::v4() : tcp::v6(), fd, ec); ec) {
    ::close(fd);
    return std::unexpected(error::from_errno(ec.value(), fmt::format("passed socket (fd {})", fd)));
  }
  auto bound = a->local_endpoint(ec);
  tcp::acceptor* raw = a.get();
  {
    std::lock_guard lock(state_->mu);
    if (!state_->accepting)
      return error::fail(error::Errc::unavailable, "passed socket: the server is shutting down");
    state_->tls = std::move(tls);
    if (state_->port == 0 && !ec) state_->port = bound.port();
    state_->tcp_acceptors.push_back(std::move(a));
  }
  state_->accept_tcp(raw, false);
  return {};
}

error::Result<void> Server::adopt_unix(int fd, PeerFilter filter) {
  sockaddr_un sa{};
  socklen_t len = sizeof sa;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0 || sa.sun_family != AF_UNIX) {
    ::close(fd);
    return error::fail(error::Errc::invalid, fmt::format("passed socket (fd {}): not a unix socket", fd));
  }
  auto l = std::make_unique<detail::UnixListener>();
  l->acceptor = std::make_unique<unix_proto::acceptor>(state_->io);
  l->path = len > offsetof(sockaddr_un, sun_path) ? std::string(sa.sun_path) : std::string();
  l->unlinked = true;  // systemd's: it outlives this agent
  l->filter = std::move(filter);
  error_code ec;
  if (l->acceptor->assign(unix_proto(), fd, ec); ec) {
    ::close(fd);
    return std::unexpected(
        error::from_errno(ec.value(), fmt::format("passed socket {} (fd {})", l->path, fd)));
  }
  detail::UnixListener* raw = l.get();
  {
    std::lock_guard lock(state_->mu);
    if (!state_->accepting)
      return error::fail(error::Errc::unavailable, "passed socket: the server is shutting down");
    state_->unix_listeners.push_back(std::move(l));
  }
  state_->accept_unix(raw);
  return {};
}

error::Result<void> Server::listen_plain(const std::string& host, std::uint16_t port) {
  const std::string listen = listen_text(host, port);
  auto a = bind_tcp(state_->io, listen, host, port);
  if (!a) return std::unexpected(a.error());
  tcp::acceptor* raw = a->get();
  {
    std::lock_guard lock(state_->mu);
    if (!state_->accepting)
      return error::fail(error::Errc::unavailable,
                         fmt::format("listen {}: the server is shutting down", listen));
    state_->tcp_acceptors.push_back(std::move(*a));
  }
  state_->accept_tcp(raw, true);
  return {};
}

error::Result<void> Server::listen_unix(const std::string& path, unsigned mode, std::optional<gid_t> group,
                                        PeerFilter filter) {
  if (path.empty() || path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return error::fail(error::Errc::invalid, fmt::format("admin socket {}: path empty or too long", path));
  }
  if (auto made = make_socket_dir(path, group); !made) return std::unexpected(made.error());
  if (auto removed = remove_stale_socket(path); !removed) return std::unexpected(removed.error());
  auto l = bind_unix(state_->io, path, mode, group);
  if (!l) return std::unexpected(l.error());
  (*l)->filter = std::move(filter);
  detail::UnixListener* raw = l->get();
  {
    std::lock_guard lock(state_->mu);
    if (!state_->accepting) {
      ::unlink(path.c_str());
      return error::fail(error::Errc::unavailable,
                         fmt::format("admin socket {}: the server is shutting down", path));
    }
    state_->unix_listeners.push_back(std::move(*l));
  }
  state_->accept_unix(raw);
  return {};
}

}  // namespace gpunode::http
