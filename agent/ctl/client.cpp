// HTTP/1.1 over the admin socket. Blocking system calls under one deadline (poll with what is
// left of the request's timeout before every read and write; the connect bounded by SO_SNDTIMEO),
// and Beast's parser for the answer. No event loop: the libvirt hook runs this on every domain
// start, and its whole run is measured against /bin/true (CONTRACT §9 "Speed").
#include "gpunode/ctl/client.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <boost/beast/core/buffers_prefix.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "gpunode/ctl/fd.hpp"
#include "gpunode/text/ascii.hpp"

namespace gpunode::ctl {
namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;

namespace {

// The largest answer read: an audit page of 500 records is about 400 KiB.
constexpr std::uint64_t kBodyLimit = 64ULL * 1024 * 1024;

TransportError::Kind connect_kind(int err) {
  if (err == ENOENT || err == ENOTDIR) return TransportError::Kind::missing;
  if (err == EACCES || err == EPERM) return TransportError::Kind::denied;
  if (err == ECONNREFUSED) return TransportError::Kind::not_listening;
  if (err == EAGAIN || err == EINPROGRESS || err == ETIMEDOUT) return TransportError::Kind::timeout;
  return TransportError::Kind::broken;
}

// Closed by the peer before any byte of an answer: how the agent refuses a peer (CONTRACT §4: it
// closes at once, without an HTTP answer).
bool closed_by_peer(int err) {
  return err == 0 || err == ECONNRESET || err == EPIPE;
}

// Milliseconds left until `deadline` for poll(2), at least 0; rounded up, so that a wait ends at
// the deadline, never up to a millisecond before it.
int left_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

// Waits for `events` on fd until the deadline: 1 ready, 0 the deadline passed, -1 an error (errno).
int wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, left_ms(deadline));
    if (n < 0 && errno == EINTR) continue;
    return n;
  }
}

// The request as bytes. A header that would split the request (CR, LF, NUL in it) is refused.
std::optional<std::string> request_text(const Request& r, const std::string& user_agent) {
  const auto clean = [](std::string_view v) {
    return v.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
  };
  if (!clean(r.method) || !clean(r.target) || !clean(user_agent)) return std::nullopt;
  std::string out = fmt::format(
      "{} {} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: {}\r\nAccept: application/json, "
      "application/problem+json\r\n"
      "Connection: close\r\n",
      r.method, r.target, user_agent);
  for (const auto& [k, v] : r.headers) {
    if (!clean(k) || !clean(v) || k.find(':') != std::string::npos) return std::nullopt;
    out += fmt::format("{}: {}\r\n", k, v);
  }
  if (!r.body.empty() || r.method == "POST" || r.method == "PATCH") {
    out += fmt::format("Content-Type: {}\r\n", r.content_type.empty() ? "application/json" : r.content_type);
  }
  out += fmt::format("Content-Length: {}\r\n\r\n", r.body.size());
  out += r.body;
  return out;
}

// One exchange over the socket at `path`: its deadline, and how its failures are told.
struct Exchange {
  const std::string& path;
  Clock::time_point deadline;
  std::chrono::seconds timeout;

  [[nodiscard]] std::unexpected<TransportError> fail(TransportError::Kind kind, std::string detail) const {
    return std::unexpected(TransportError{kind, path, std::move(detail)});
  }
  [[nodiscard]] std::unexpected<TransportError> timed_out() const {
    return fail(TransportError::Kind::timeout, fmt::format("{} s", timeout.count()));
  }
};

std::expected<sockaddr_un, TransportError> socket_address(const Exchange& x) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (x.path.empty() || x.path.size() >= sizeof sa.sun_path)
    return x.fail(TransportError::Kind::broken, "the socket path is empty or too long");
  std::memcpy(sa.sun_path, x.path.c_str(), x.path.size() + 1);
  return sa;
}

// A connect to a listener whose queue is full waits: bounded by the deadline (SO_SNDTIMEO).
std::expected<void, TransportError> connect_within(int fd, const sockaddr_un& sa, const Exchange& x) {
  const auto wait = std::chrono::duration_cast<std::chrono::microseconds>(x.deadline - Clock::now());
  timeval tv{static_cast<time_t>(wait.count() / 1000000), static_cast<suseconds_t>(wait.count() % 1000000)};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  while (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    return x.fail(connect_kind(err), std::strerror(err));
  }
  return {};
}

// The whole request written before the deadline. MSG_NOSIGNAL: a peer that closed gives EPIPE,
// never SIGPIPE.
std::expected<void, TransportError> send_all(int fd, const std::string& text, const Exchange& x) {
  for (std::size_t sent = 0; sent < text.size();) {
    const int ready = wait_for(fd, POLLOUT, x.deadline);
    if (ready == 0) return x.timed_out();
    const auto n =
        ready < 0 ? -1 : ::send(fd, text.data() + sent, text.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      const int err = errno;
      // A refused peer may be closed before the request is written: then the write fails.
      return x.fail(closed_by_peer(err) ? TransportError::Kind::refused_peer : TransportError::Kind::broken,
                    std::strerror(err));
    }
    sent += static_cast<std::size_t>(n);
  }
  return {};
}

using Parser = http::response_parser<http::string_body>;

// Gives the parser what it takes of `pending` (the bytes received and not yet taken).
std::expected<void, TransportError> feed(Parser& parser, std::string& pending, const Exchange& x) {
  while (!pending.empty() && !parser.is_done()) {
    boost::system::error_code ec;
    const auto used = parser.put(boost::asio::buffer(pending), ec);
    if (ec == http::error::need_more) break;
    if (ec) return x.fail(TransportError::Kind::broken, ec.message());
    pending.erase(0, used);
    if (used == 0) break;
  }
  return {};
}

// The answer as parsed, its header names lower-cased.
Response response_of(http::response<http::string_body>& res) {
  Response out;
  out.status = res.result_int();
  for (const auto& f : res) {
    out.headers.emplace_back(text::ascii_lower(f.name_string()), std::string(f.value()));
  }
  out.body = std::move(res.body());
  return out;
}

// Reads until the answer is whole, each read waiting at most until the deadline.
std::expected<Response, TransportError> read_answer(int fd, const Exchange& x) {
  Parser parser;
  parser.body_limit(kBodyLimit);
  parser.eager(true);
  std::string pending;  // received bytes the parser has not taken yet
  bool got_any = false;
  std::array<char, 65536>
      buf;  // not zeroed: recv() fills what is used (zeroing 64 KiB costs the hook 16 page faults)
  while (!parser.is_done()) {
    const int ready = wait_for(fd, POLLIN, x.deadline);
    if (ready == 0) return x.timed_out();
    const auto n = ready < 0 ? -1 : ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      if (n == 0 && parser.is_header_done() && !parser.content_length() && !parser.chunked()) {
        boost::system::error_code ec;
        parser.put_eof(ec);  // an answer whose body ends with the connection
        if (!ec) break;
      }
      if (!got_any && closed_by_peer(err))
        return x.fail(TransportError::Kind::refused_peer, n == 0 ? "end of stream" : std::strerror(err));
      return x.fail(TransportError::Kind::broken,
                    n == 0 ? "the connection closed before the answer was whole" : std::strerror(err));
    }
    got_any = true;
    pending.append(buf.data(), static_cast<std::size_t>(n));
    if (auto fed = feed(parser, pending, x); !fed) return std::unexpected(fed.error());
  }
  return response_of(parser.get());
}

}  // namespace

std::string_view Response::header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers) {
    if (k == lower_name) return v;
  }
  return {};
}

std::string describe(const TransportError& e, uid_t uid, std::string_view program) {
  using K = TransportError::Kind;
  switch (e.kind) {
    case K::missing:
      return fmt::format(
          "{}: no admin socket at {} ({})\n"
          "  is gpunode-agent running on this host? (systemctl status gpunode-agent.service)\n"
          "  is this the admin.socket of /etc/gpunode/agent.yaml? ({})\n",
          program, e.path, e.detail,
          program == "gpunodectl" ? "--socket PATH names another"
                                  : "the running agent keeps the socket it started with until a restart");
    case K::denied:
      return fmt::format(
          "{}: permission denied on the admin socket {} ({})\n"
          "  uid {} may not open it: the socket is mode 0660, group admin.allowed_group, in a directory mode "
          "0755;\n"
          "  run as root, or as a member of admin.allowed_group, or ask for the uid in admin.allowed_uids\n",
          program, e.path, e.detail, uid);
    case K::not_listening:
      return fmt::format(
          "{}: nothing listens on the admin socket {} ({})\n"
          "  the socket file is stale: is gpunode-agent running? (systemctl status gpunode-agent.service)\n",
          program, e.path, e.detail);
    case K::refused_peer:
      return fmt::format(
          "{}: the agent at {} refused this caller: it closed the connection without an answer ({})\n"
          "  uid {} is not in admin.allowed_uids and not in admin.allowed_group of /etc/gpunode/agent.yaml;\n"
          "  run as root or as a member of admin.allowed_group (the agent logs the refusal)\n",
          program, e.path, e.detail, uid);
    case K::untrusted:
      return fmt::format("{}: the server at {} is not to be trusted: {}\n", program, e.path, e.detail);
    case K::timeout:
      return fmt::format(
          "{}: no answer from the agent at {} within {}\n  is gpunode-agent stuck? (journalctl -u "
          "gpunode-agent.service)\n",
          program, e.path, e.detail);
    case K::broken:
      break;
  }
  return fmt::format("{}: cannot talk to the agent at {}: {}\n", program, e.path, e.detail);
}

UnixClient::UnixClient(std::string path, std::string user_agent, VetServer vet)
    : path_(std::move(path)), user_agent_(std::move(user_agent)), vet_(std::move(vet)) {}

error::Result<void> vet_agent_socket(const std::string& path, int fd) {
  ucred peer{};
  socklen_t len = sizeof peer;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0)
    return std::unexpected(error::from_errno(errno, "cannot tell who serves it"));
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    return std::unexpected(error::from_errno(errno, fmt::format("cannot inspect its directory {}", dir)));
  const auto refuse = [](std::string why) { return error::fail(error::Errc::permission, std::move(why)); };
  if (peer.uid != 0 && peer.uid != st.st_uid) {
    return refuse(
        fmt::format("it is served by uid {}, neither root nor the owner (uid {}) of its directory {}",
                    peer.uid, st.st_uid, dir));
  }
  if (st.st_uid != 0 && st.st_uid != peer.uid)
    return refuse(
        fmt::format("its directory {} belongs to uid {}, neither root nor the server", dir, st.st_uid));
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return refuse(fmt::format(
        "its directory {} is writable by others (mode {:04o}): anyone could have put the socket there", dir,
        st.st_mode & 07777));
  }
  return {};
}

std::expected<Response, TransportError> UnixClient::call(const Request& r) {
  const Exchange x{path_, Clock::now() + r.timeout, r.timeout};
  auto text = request_text(r, user_agent_);
  if (!text) return x.fail(TransportError::Kind::broken, "a header of the request holds a line break");
  auto address = socket_address(x);
  if (!address) return std::unexpected(address.error());
  Fd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (sock.get() < 0) return x.fail(TransportError::Kind::broken, std::strerror(errno));
  if (auto connected = connect_within(sock.get(), *address, x); !connected)
    return std::unexpected(connected.error());
  if (vet_) {
    if (auto vetted = vet_(sock.get()); !vetted)
      return x.fail(TransportError::Kind::untrusted, std::move(vetted.error().detail));
  }
  if (auto sent = send_all(sock.get(), *text, x); !sent) return std::unexpected(sent.error());
  return read_answer(sock.get(), x);
}

}  // namespace gpunode::ctl
