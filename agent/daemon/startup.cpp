#include "startup.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "gpunode/daemon/config_files.hpp"
#include "gpunode/http/client_tls.hpp"
#include "gpunode/text/printable.hpp"

namespace gpunode::daemon {
namespace {

// Descriptors the agent holds besides its connections: SQLite and its journal, libvirt's socket,
// the lock, the listeners, the reporter's connection, pipes, netlink, the watchdog's and journal's,
// the rescan fingerprint's directories (at most 65, discovery/sysfs_reader.cpp) and unit health's
// files (at most 96, and a directory per watched function, a GPU's functions and its ports:
// discovery/health.cpp): with room for 256 of those.
constexpr std::size_t kOwnFiles = 512;

// What a passed socket is: its family, whether it listens for streams, and where it is bound.
struct Bound {
  int family = AF_UNSPEC;
  bool listening = false;
  std::string path;                            // AF_UNIX
  std::optional<boost::asio::ip::address> ip;  // AF_INET, AF_INET6
  std::uint16_t port = 0;
  std::string text;  // for messages
};

Bound bound_address(int fd) {
  Bound b;
  int type = 0, accepting = 0;
  socklen_t len = sizeof type;
  const bool stream = ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
  len = sizeof accepting;
  b.listening =
      stream && ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) == 0 && accepting != 0;
  sockaddr_storage ss{};
  len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    b.text = fmt::format("not a socket: {}", std::strerror(errno));
    return b;
  }
  b.family = ss.ss_family;
  if (ss.ss_family == AF_UNIX) {
    const auto& un = reinterpret_cast<const sockaddr_un&>(ss);
    b.path = len > offsetof(sockaddr_un, sun_path) ? std::string(un.sun_path) : std::string();
    b.text = text::printable(b.path);
  } else if (ss.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(ss);
    b.ip = boost::asio::ip::address_v4(ntohl(in.sin_addr.s_addr));
    b.port = ntohs(in.sin_port);
    b.text = fmt::format("{}:{}", b.ip->to_string(), b.port);
  } else if (ss.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(ss);
    boost::asio::ip::address_v6::bytes_type bytes;
    std::memcpy(bytes.data(), in6.sin6_addr.s6_addr, bytes.size());
    b.ip = boost::asio::ip::address_v6(bytes, in6.sin6_scope_id);
    b.port = ntohs(in6.sin6_port);
    b.text = fmt::format("[{}]:{}", b.ip->to_string(), b.port);
  } else {
    b.text = fmt::format("address family {}", ss.ss_family);
  }
  return b;
}

// Whether a TCP socket bound at `b` serves `listen` (api.listen): the same port, and the same
// address, any of the addresses a host name resolves to, or (for "", "*", 0.0.0.0 or ::) any
// wildcard (systemd's ListenStream=PORT binds [::] for IPv4 and IPv6 alike).
bool serves_listen(const Bound& b, const std::string& listen) {
  const auto want = config::parse_listen(listen);
  if (!b.ip || !want || want->port != b.port) return false;
  const std::string& host = want->host;
  if (host.empty() || host == "*" || host == "0.0.0.0" || host == "::") return b.ip->is_unspecified();
  boost::system::error_code ec;
  if (auto ip = boost::asio::ip::make_address(host, ec); !ec) return ip == *b.ip;
  boost::asio::io_context io;  // at start, before serving: a resolver may block here
  boost::asio::ip::tcp::resolver resolver(io);
  for (const auto& r : resolver.resolve(host, std::to_string(want->port), ec)) {
    if (r.endpoint().address() == *b.ip) return true;
  }
  return false;
}

}  // namespace

std::expected<config::Config, std::vector<config::Problem>> load_checked(const std::string& file) {
  auto loaded = config::load_file(file, config::Purpose::run);
  if (!loaded.ok()) return std::unexpected(std::move(loaded.problems));
  if (auto bad = check_named_files(loaded, file); !bad.empty()) return std::unexpected(std::move(bad));
  return std::move(loaded.config);
}

error::Result<std::shared_ptr<const auth::TokenVerifier>> load_verifier(const config::Config& c) {
  auto v = auth::TokenVerifier::from_files(
      c.auth.keys, {c.auth.issuer, c.auth.audience, c.node.id, std::chrono::seconds(60)});
  if (!v) return std::unexpected(std::move(v.error()));
  return std::make_shared<const auth::TokenVerifier>(std::move(*v));
}

std::string token_keys_line(const auth::TokenVerifier& v) {
  const auto ids = v.key_ids();
  return fmt::format("token keys: {} loaded (kid {})", ids.size(), fmt::join(ids, ", "));
}

http::TlsFiles tls_files(const config::Config& c) {
  return {c.api.tls.cert, c.api.tls.key, c.api.tls.client_ca};
}

error::Result<std::shared_ptr<boost::asio::ssl::context>> central_tls(const config::Config& c) {
  if (c.central.url.empty()) return nullptr;
  return http::make_client_tls_context({c.central.ca, c.central.client_cert, c.central.client_key});
}

error::Result<std::string> fit_open_files(const config::Config& c) {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return std::unexpected(error::from_errno(errno, "cannot read the open-file limit"));
  const rlim_t before = rl.rlim_cur;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) rl.rlim_cur = before;
  }
  const std::size_t need = c.api.max_connections + c.admin.max_connections + kMetricsConnections + kOwnFiles;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {  // the caps do not fit: invalid
    return error::fail(
        error::Errc::invalid,
        fmt::format("the open-file limit is {} (hard limit {}), below the {} the connection caps need "
                    "(api.max_connections {} + admin.max_connections {} + {} for metrics.listen + {} for the "
                    "agent's own files): raise LimitNOFILE (ulimit -n) or lower the caps",
                    rl.rlim_cur, rl.rlim_max, need, c.api.max_connections, c.admin.max_connections,
                    kMetricsConnections, kOwnFiles));
  }
  return fmt::format(
      "open files: limit {}{}; connections: HTTPS {} ({} per client address), admin socket {}, "
      "metrics.listen {}",
      rl.rlim_cur, rl.rlim_cur != before ? fmt::format(" (raised from {})", before) : std::string(),
      c.api.max_connections, c.api.max_connections_per_client, c.admin.max_connections, kMetricsConnections);
}

error::Result<store::StateLock> lock_state_dir(const config::Config& c) {
  std::error_code ec;
  std::filesystem::create_directories(c.state.dir, ec);
  if (ec)
    return std::unexpected(
        error::from_errno(ec.value(), fmt::format("cannot create state directory {}", c.state.dir)));
  // 0750 as the unit's StateDirectoryMode= makes it: the group (gpunode) may look, others not.
  ::chmod(c.state.dir.c_str(), 0750);
  return store::StateLock::acquire(c.state.dir);  // held by another agent: busy
}

void ignore_sigpipe() {
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
}

http::Limits api_limits(const config::Config& c) {
  http::Limits limits;
  limits.max_connections = c.api.max_connections;
  limits.max_connections_per_client = c.api.max_connections_per_client;
  limits.max_plain_connections = kMetricsConnections;
  limits.one_thread = true;  // the net thread alone runs its io_context (daemon.cpp)
  return limits;
}

http::Limits admin_limits(const config::Config& c) {
  http::Limits limits;
  limits.large_body_path = "/v1/admin/domain-admission";  // CONTRACT §9: domain XML up to 16 MiB
  limits.max_unix_connections = c.admin.max_connections;
  limits.one_thread = true;  // the admin thread alone runs its io_context (daemon.cpp)
  return limits;
}

error::Result<PassedListeners> match_passed(const std::vector<PassedSocket>& passed,
                                            const config::Config& c) {
  const auto mismatch = [](std::string why) { return error::fail(error::Errc::invalid, std::move(why)); };
  PassedListeners out;
  for (const auto& s : passed) {
    const auto bound = bound_address(s.fd);
    const std::string what = fmt::format("the socket systemd passed as \"{}\" (fd {}, {})",
                                         text::printable(s.name), s.fd, bound.text);
    const bool api = s.name == "api" || (s.name != "admin" && bound.family != AF_UNIX);
    auto& slot = api ? out.api : out.admin;
    const char* key = api ? "api.listen" : "admin.socket";
    if (s.name != "api" && s.name != "admin" && bound.family != AF_UNIX && bound.family != AF_INET &&
        bound.family != AF_INET6)
      return mismatch(fmt::format("{} serves neither api.listen nor admin.socket", what));
    if (slot) return mismatch(fmt::format("{} is a second socket for {}", what, key));
    if (!bound.listening)
      return mismatch(fmt::format("{} is not a listening stream socket for {}", what, key));
    const bool same =
        api ? serves_listen(bound, c.api.listen) : bound.family == AF_UNIX && bound.path == c.admin.socket;
    if (!same) {
      return mismatch(fmt::format(
          "{} does not match {} \"{}\": make gpunode-agent.socket's ListenStream= and {} name the same "
          "address (systemctl edit gpunode-agent.socket)",
          what, key, text::printable(api ? c.api.listen : c.admin.socket), key));
    }
    slot = s.fd;
  }
  return out;
}

error::Result<void> listen_all(http::Server& server, http::Server& admin, const config::Config& c,
                               const PassedListeners& passed, std::shared_ptr<boost::asio::ssl::context> tls,
                               std::optional<gid_t> group, std::shared_ptr<AdminPeers> peers) {
  const auto where = config::parse_listen(c.api.listen);  // checked when the config was loaded
  if (!where) return std::unexpected(error::with_context(where.error(), "api.listen"));
  if (auto l = passed.api ? server.adopt_tls(*passed.api, std::move(tls))
                          : server.listen_tls(where->host, where->port, std::move(tls));
      !l)
    return std::unexpected(l.error());
  auto filter = [peers](const http::Peer& peer) { return peers->allowed(peer); };
  if (auto l = passed.admin ? admin.adopt_unix(*passed.admin, filter)
                            : admin.listen_unix(c.admin.socket, 0660, group, filter);
      !l) {
    return std::unexpected(l.error());
  }
  if (!c.metrics.listen.empty()) {
    const auto m = config::parse_listen(c.metrics.listen);  // checked when the config was loaded
    if (!m) return std::unexpected(error::with_context(m.error(), "metrics.listen"));
    if (auto l = server.listen_plain(m->host, m->port); !l)
      return std::unexpected(error::with_context(std::move(l.error()), "metrics.listen"));
  }
  return {};
}

report::Options reporter_options(const config::Config& c, const std::string& version,
                                 std::shared_ptr<boost::asio::ssl::context> tls) {
  report::Options ro;
  ro.url = c.central.url;
  ro.node_id = c.node.id;
  ro.version = version;
  ro.state_db = std::filesystem::path(c.state.dir) / "state.db";
  ro.tls = std::move(tls);
  ro.heartbeat_interval = c.central.heartbeat_interval;
  return ro;
}

}  // namespace gpunode::daemon
