// HTTP/1.1 over the admin socket with Beast. Synchronous for the caller: the operations are
// asynchronous on a private io_context run for at most the request's timeout, so every step
// (connect, write, read) is bounded by one deadline and the socket is closed when it passes.
#include "gpunode/ctl/client.hpp"

#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <fmt/format.h>

namespace gpunode::ctl {
namespace asio = boost::asio;
namespace http = boost::beast::http;
using local = asio::local::stream_protocol;

namespace {

// The largest answer read: an audit page of 500 records is about 400 KiB.
constexpr std::uint64_t kBodyLimit = 64ULL * 1024 * 1024;

TransportError::Kind connect_kind(const boost::system::error_code& ec) {
  if (ec == asio::error::not_found || ec.value() == ENOENT || ec.value() == ENOTDIR) return TransportError::Kind::missing;
  if (ec.value() == EACCES || ec.value() == EPERM) return TransportError::Kind::denied;
  if (ec.value() == ECONNREFUSED) return TransportError::Kind::not_listening;
  return TransportError::Kind::broken;
}

// Closed by the peer before any byte of an answer: how the agent refuses a peer (CONTRACT §4: it
// closes at once, without an HTTP answer).
bool closed_by_peer(const boost::system::error_code& ec) {
  return ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe;
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
          program == "gpunodectl" ? "--socket PATH names another" : "the running agent keeps the socket it started with until a restart");
    case K::denied:
      return fmt::format(
          "{}: permission denied on the admin socket {} ({})\n"
          "  uid {} may not open it: the socket is mode 0660, group admin.allowed_group, in a directory mode 0755;\n"
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
      return fmt::format("{}: no answer from the agent at {} within {}\n  is gpunode-agent stuck? (journalctl -u gpunode-agent.service)\n",
                         program, e.path, e.detail);
    case K::broken:
      break;
  }
  return fmt::format("{}: cannot talk to the agent at {}: {}\n", program, e.path, e.detail);
}

UnixClient::UnixClient(std::string path, std::string user_agent, VetServer vet)
    : path_(std::move(path)), user_agent_(std::move(user_agent)), vet_(std::move(vet)) {}

std::optional<std::string> vet_agent_socket(const std::string& path, int fd) {
  ucred peer{};
  socklen_t len = sizeof peer;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) return fmt::format("cannot tell who serves it: {}", std::strerror(errno));
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return fmt::format("cannot inspect its directory {}: {}", dir, std::strerror(errno));
  if (peer.uid != 0 && peer.uid != st.st_uid) {
    return fmt::format("it is served by uid {}, neither root nor the owner (uid {}) of its directory {}", peer.uid, st.st_uid, dir);
  }
  if (st.st_uid != 0 && st.st_uid != peer.uid) return fmt::format("its directory {} belongs to uid {}, neither root nor the server", dir, st.st_uid);
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return fmt::format("its directory {} is writable by others (mode {:04o}): anyone could have put the socket there", dir, st.st_mode & 07777);
  }
  return std::nullopt;
}

std::expected<Response, TransportError> UnixClient::call(const Request& r) {
  asio::io_context io;
  local::socket sock(io);
  boost::beast::flat_buffer buffer;
  http::request<http::string_body> req{http::string_to_verb(r.method), r.target, 11};
  req.set(http::field::host, "localhost");
  req.set(http::field::user_agent, user_agent_);
  req.set(http::field::accept, "application/json, application/problem+json");
  req.set(http::field::connection, "close");
  for (const auto& [k, v] : r.headers) req.set(k, v);
  if (!r.body.empty() || r.method == "POST" || r.method == "PATCH") {
    req.set(http::field::content_type, r.content_type.empty() ? "application/json" : r.content_type);
    req.body() = r.body;
  }
  req.prepare_payload();
  http::response_parser<http::string_body> parser;
  parser.body_limit(kBodyLimit);

  std::optional<TransportError> failed;
  bool done = false;
  auto fail = [&](TransportError::Kind kind, const boost::system::error_code& ec) {
    failed = TransportError{kind, path_, ec.message()};
  };
  sock.async_connect(local::endpoint(path_), [&](const boost::system::error_code& ec) {
    if (ec) return fail(connect_kind(ec), ec);
    if (vet_) {
      if (auto why = vet_(sock.native_handle())) {
        failed = TransportError{TransportError::Kind::untrusted, path_, std::move(*why)};
        return;
      }
    }
    http::async_write(sock, req, [&](const boost::system::error_code& wec, std::size_t) {
      // A refused peer may be closed before the request is written: then the write fails.
      if (wec) return fail(closed_by_peer(wec) ? TransportError::Kind::refused_peer : TransportError::Kind::broken, wec);
      http::async_read(sock, buffer, parser, [&](const boost::system::error_code& rec, std::size_t n) {
        if (rec) {
          const bool nothing = n == 0 && buffer.size() == 0 && !parser.got_some();
          return fail(nothing && closed_by_peer(rec) ? TransportError::Kind::refused_peer : TransportError::Kind::broken, rec);
        }
        done = true;
      });
    });
  });
  io.run_for(r.timeout);
  if (!done && !failed) {
    boost::system::error_code ignored;
    sock.close(ignored);
    return std::unexpected(TransportError{TransportError::Kind::timeout, path_, fmt::format("{} s", r.timeout.count())});
  }
  if (failed) return std::unexpected(*failed);
  auto& res = parser.get();
  Response out;
  out.status = res.result_int();
  for (const auto& f : res) {
    std::string name(f.name_string());
    for (auto& c : name) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    out.headers.emplace_back(std::move(name), std::string(f.value()));
  }
  out.body = std::move(res.body());
  return out;
}

}  // namespace gpunode::ctl
