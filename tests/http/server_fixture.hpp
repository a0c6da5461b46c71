// The servers and clients of the http tests (server_test.cpp, admin_socket_test.cpp,
// access_test.cpp): real sockets on loopback, HTTPS on 127.0.0.1 (port 0) and the admin socket in a
// temp dir. Certificates are made with OpenSSL's API; the clients are plain blocking OpenSSL/POSIX
// clients, so every TLS knob (versions, suites, renegotiation, client certs) is the test's to set.
#pragma once

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <grp.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/json.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gpunode/http/client_tls.hpp"
#include "gpunode/http/server.hpp"
#include "gpunode/http/tls_files.hpp"
#include "raw_request.hpp"
#include "recorders.hpp"
#include "test_certs.hpp"

namespace server_test {

namespace fs = std::filesystem;
namespace net = boost::asio;
namespace json = boost::json;
using namespace std::chrono_literals;
using gpunode::http::Limits;
using gpunode::http::Peer;
using gpunode::http::Reply;
using gpunode::http::Request;
using gpunode::http::Response;
using gpunode::http::Server;
using gpunode::http::TlsFiles;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Temp dirs and certificates

struct TempDir {
  fs::path path;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "gpunode-http-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(std::string_view name) const { return (path / name).string(); }
};

using namespace gpunode::test_certs;

// ---------------------------------------------------------------------------------------------
// Blocking clients

inline std::string ssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    std::array<char, 256> buf{};
    ERR_error_string_n(e, buf.data(), buf.size());
    if (!out.empty()) out += "; ";
    out += buf.data();
  }
  return out;
}

inline void set_timeouts(int fd) {
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// To the server on 127.0.0.1, from `source` (another loopback address: another client) when given.
inline int connect_tcp(std::uint16_t port, const char* source = nullptr) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  if (source != nullptr) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    REQUIRE(::inet_pton(AF_INET, source, &from.sin_addr) == 1);
    REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&from), sizeof from) == 0);
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  set_timeouts(fd);
  return fd;
}

inline int connect_unix(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return -1;
  }
  set_timeouts(fd);
  return fd;
}

struct HttpResponse {
  unsigned status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string{} : it->second;
  }
  json::object problem() const { return json::parse(body).as_object(); }
};

struct TlsOptions {
  int min_version = TLS1_2_VERSION;
  int max_version = 0;
  std::string ciphers{};  // TLS 1.2 cipher list
  std::string cert{};
  std::string key{};
  bool seclevel0 = false;
  const char* source = nullptr;  // connect_tcp's
};

class Client {
 public:
  Client() = default;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client() { close(); }

  static std::unique_ptr<Client> plain_unix(const std::string& path) {
    auto c = std::make_unique<Client>();
    c->fd_ = connect_unix(path);
    c->ok = c->fd_ >= 0;
    return c;
  }

  static std::unique_ptr<Client> plain_tcp(std::uint16_t port) {
    auto c = std::make_unique<Client>();
    c->fd_ = connect_tcp(port);
    c->ok = c->fd_ >= 0;
    return c;
  }

  static std::unique_ptr<Client> tls(std::uint16_t port, const TlsOptions& o = {}) {
    auto c = std::make_unique<Client>();
    ERR_clear_error();
    c->ctx_ = SSL_CTX_new(TLS_client_method());
    REQUIRE(c->ctx_ != nullptr);
    if (o.seclevel0) {
      SSL_CTX_set_security_level(c->ctx_, 0);
      SSL_CTX_set_cipher_list(c->ctx_, "DEFAULT:@SECLEVEL=0");
    }
    SSL_CTX_set_min_proto_version(c->ctx_, o.min_version);
    SSL_CTX_set_max_proto_version(c->ctx_, o.max_version);
    if (!o.ciphers.empty()) REQUIRE(SSL_CTX_set_cipher_list(c->ctx_, o.ciphers.c_str()) == 1);
    REQUIRE(SSL_CTX_load_verify_locations(c->ctx_, certs().ca.c_str(), nullptr) == 1);
    SSL_CTX_set_verify(c->ctx_, SSL_VERIFY_PEER, nullptr);
    if (!o.cert.empty()) {
      REQUIRE(SSL_CTX_use_certificate_chain_file(c->ctx_, o.cert.c_str()) == 1);
      REQUIRE(SSL_CTX_use_PrivateKey_file(c->ctx_, o.key.c_str(), SSL_FILETYPE_PEM) == 1);
    }
    c->fd_ = connect_tcp(port, o.source);
    REQUIRE(c->fd_ >= 0);
    c->ssl_ = SSL_new(c->ctx_);
    SSL_set_fd(c->ssl_, c->fd_);
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl_), "127.0.0.1");
    if (SSL_connect(c->ssl_) == 1) {
      c->ok = true;
    } else {
      c->error = ssl_errors();
    }
    return c;
  }

  bool ok = false;
  std::string error;

  SSL* ssl() const { return ssl_; }

  bool send(std::string_view data) {
    while (!data.empty()) {
      long n = 0;
      if (ssl_ != nullptr) {
        n = SSL_write(ssl_, data.data(), static_cast<int>(std::min<std::size_t>(data.size(), 1 << 20)));
      } else {
        n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      }
      if (n <= 0) {
        error = ssl_errors();
        return false;
      }
      data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }

  // Reads more; false on end of stream, error or the receive timeout (5 s unless patience() set
  // it), which timed_out() tells apart.
  bool fill() {
    std::array<char, 16384> tmp{};
    long n = 0;
    int saved = 0;
    timed_out_ = false;
    if (ssl_ != nullptr) {
      n = SSL_read(ssl_, tmp.data(), static_cast<int>(tmp.size()));
      saved = errno;
      if (n <= 0) {
        const int e = SSL_get_error(ssl_, static_cast<int>(n));
        timed_out_ =
            (e == SSL_ERROR_SYSCALL || e == SSL_ERROR_WANT_READ) && (saved == EAGAIN || saved == EWOULDBLOCK);
      }
    } else {
      n = ::recv(fd_, tmp.data(), tmp.size(), 0);
      saved = errno;
      timed_out_ = n < 0 && (saved == EAGAIN || saved == EWOULDBLOCK);
    }
    if (n <= 0) {
      error = ssl_errors();
      return false;
    }
    buf_.append(tmp.data(), static_cast<std::size_t>(n));
    return true;
  }

  std::optional<HttpResponse> response() {
    std::size_t end = 0;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos) {
      if (!fill()) return std::nullopt;
    }
    HttpResponse r;
    std::string head = buf_.substr(0, end);
    std::size_t pos = head.find("\r\n");
    std::string status_line = head.substr(0, pos);
    r.status = static_cast<unsigned>(std::stoul(status_line.substr(9, 3)));
    while (pos != std::string::npos && pos < head.size()) {
      std::size_t next = head.find("\r\n", pos + 2);
      std::string line = head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        std::string value = line.substr(colon + 1);
        while (!value.empty() && value.front() == ' ') value.erase(0, 1);
        r.headers[name] = value;
      }
      pos = next;
    }
    std::size_t len = r.headers.contains("content-length") ? std::stoul(r.headers["content-length"]) : 0;
    while (buf_.size() < end + 4 + len) {
      if (!fill()) return std::nullopt;
    }
    r.body = buf_.substr(end + 4, len);
    buf_.erase(0, end + 4 + len);
    return r;
  }

  std::optional<HttpResponse> roundtrip(std::string_view request) {
    if (!send(request)) return std::nullopt;
    return response();
  }

  // True when the server closes (or resets) the connection without sending anything more; false on
  // data, or when the receive timeout ran out first (the connection still open).
  bool closed_without_data() {
    if (!buf_.empty()) return false;
    if (fill()) return false;
    return !timed_out_;
  }

  bool timed_out() const { return timed_out_; }

  // How long a read waits for the server (SO_RCVTIMEO; 5 s unless set here).
  void patience(std::chrono::seconds limit) {
    timeval tv{static_cast<time_t>(limit.count()), 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }

  void close() {
    if (ssl_ != nullptr) {
      SSL_shutdown(ssl_);
      SSL_free(ssl_);
      ssl_ = nullptr;
    }
    if (ctx_ != nullptr) {
      SSL_CTX_free(ctx_);
      ctx_ = nullptr;
    }
    if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
    }
    ERR_clear_error();
  }

 private:
  int fd_ = -1;
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  std::string buf_;
  bool timed_out_ = false;
};

using gpunode::http::testing::request;  // a request as a client writes it

// ---------------------------------------------------------------------------------------------
// A server on two I/O threads (one when Limits::one_thread says so), with a handler that answers
// by path:
//   /echo           200 JSON of what it got
//   /slow?ms=N      200 after N ms (replies from another thread)
//   /never          lets its Reply go unanswered (the server answers 500 `internal`)
//   /park           keeps its Reply unanswered until the fixture goes (in `parked`)
//   /throw          throws
//   /close          200 with Connection: close
//   /nocontent      204 (with a body the server must drop)
//   anything else   404 problem

inline Limits test_limits() {
  Limits l;
  l.handshake_timeout = 5s;
  l.header_timeout = 5s;
  l.read_timeout = 5s;
  l.write_timeout = 5s;
  l.idle_timeout = 10s;
  return l;
}

struct Fixture {
  net::io_context io;
  net::io_context work;  // the handler's "elsewhere"
  net::executor_work_guard<net::io_context::executor_type> io_guard{io.get_executor()};
  net::executor_work_guard<net::io_context::executor_type> work_guard{work.get_executor()};
  std::mutex log_mu;
  std::vector<std::string> logs;
  std::atomic<int> slow_started{0};
  std::optional<Server> server;
  std::vector<std::thread> threads;
  TempDir dir;
  // What the server's observer saw (I/O threads write, the test reads): under log_mu.
  std::vector<gpunode::http::testing::Seen> answered;
  std::vector<Reply> parked;  // /park's, under log_mu; let go when the fixture goes

  explicit Fixture(Limits limits = test_limits()) {
    // A client that writes to a connection the server closed gets EPIPE, not the test's death
    // (OpenSSL writes with write(2), which raises SIGPIPE).
    ::signal(SIGPIPE, SIG_IGN);
    server.emplace(
        io, limits, [this](Request r, Reply reply) { handle(std::move(r), std::move(reply)); },
        gpunode::http::testing::log_into(log_mu, logs),
        gpunode::http::testing::answers_into(log_mu, answered));
    threads.emplace_back([this] { io.run(); });
    if (!limits.one_thread) threads.emplace_back([this] { io.run(); });
    threads.emplace_back([this] { work.run(); });
  }

  ~Fixture() {
    auto p = std::make_shared<std::promise<void>>();
    auto f = p->get_future();
    server->shutdown(200ms, [p] { p->set_value(); });
    CHECK(f.wait_for(5s) == std::future_status::ready);
    work_guard.reset();
    io_guard.reset();
    work.stop();
    io.stop();
    for (auto& t : threads) t.join();
    server.reset();
  }

  std::uint16_t listen(const TlsFiles& files = {certs().server_cert, certs().server_key, {}}) {
    auto ctx = gpunode::http::make_tls_context(files);
    REQUIRE_MESSAGE(ctx.has_value(), (ctx ? "" : ctx.error().detail));
    auto r = server->listen_tls("127.0.0.1", 0, *ctx);
    REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().detail));
    REQUIRE(server->tls_port() != 0);
    return server->tls_port();
  }

  std::string listen_unix(gpunode::http::PeerFilter filter = {}) {
    auto path = dir.file("admin.sock");
    auto r = server->listen_unix(path, 0660, std::nullopt, std::move(filter));
    REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().detail));
    return path;
  }

  bool logged(std::string_view needle) {
    std::lock_guard lock(log_mu);
    for (const auto& l : logs) {
      if (l.find(needle) != std::string::npos) return true;
    }
    return false;
  }

  void handle(Request r, Reply reply) {
    if (r.path == "/echo") {
      json::object o;
      o["method"] = r.method;
      o["target"] = r.target;
      o["path"] = r.path;
      o["query"] = r.query;
      o["bodySize"] = r.body.size();
      o["body"] = r.body.size() <= 1024 ? r.body : std::string{};
      o["requestId"] = r.request_id;
      o["peerKind"] = r.peer.kind == Peer::Kind::tcp         ? "tcp"
                      : r.peer.kind == Peer::Kind::plain_tcp ? "plain"
                                                             : "unix";
      o["peerAddress"] = r.peer.address;
      o["uid"] = r.peer.uid ? json::value(*r.peer.uid) : json::value(nullptr);
      o["pid"] = r.peer.pid ? json::value(*r.peer.pid) : json::value(nullptr);
      o["gid"] = r.peer.gid ? json::value(*r.peer.gid) : json::value(nullptr);
      json::array groups;
      for (gid_t g : r.peer.groups) groups.emplace_back(g);
      o["groups"] = std::move(groups);
      o["xFoo"] = std::string(r.header("x-foo").value_or("-"));
      reply(Response{200, {{"X-Echo", "yes"}}, json::serialize(o)});
    } else if (r.path == "/slow") {
      ++slow_started;
      auto ms = std::stoi(r.query.substr(r.query.find('=') + 1));
      auto t = std::make_shared<net::steady_timer>(work, std::chrono::milliseconds(ms));
      t->async_wait([t, reply](boost::system::error_code) {
        reply(Response{200, {{"Content-Type", "text/plain"}}, "slow"});
      });
    } else if (r.path == "/never") {
      // lets the Reply go
    } else if (r.path == "/park") {
      std::lock_guard lock(log_mu);
      parked.push_back(std::move(reply));
    } else if (r.path == "/throw") {
      throw std::runtime_error("boom");
    } else if (r.path == "/close") {
      reply(Response{200, {{"Connection", "close"}}, "{}"});
    } else if (r.path == "/nocontent") {
      reply(Response{204, {}, "dropped"});
    } else {
      reply(gpunode::http::problem(404, "not-found", "no such route"));
    }
  }
};

inline void check_problem(const HttpResponse& r, unsigned status, std::string_view code) {
  CHECK(r.status == status);
  CHECK(r.header("content-type") == "application/problem+json");
  CHECK(!r.header("x-request-id").empty());
  auto p = r.problem();
  for (const char* key : {"type", "title", "status", "detail", "code", "errors"}) {
    CHECK_MESSAGE(p.contains(key), key);
  }
  CHECK(p["type"].as_string() == std::string("urn:gpunode:problem:") + std::string(code));
  CHECK(p["code"].as_string() == code);
  CHECK(p["status"].to_number<unsigned>() == status);
  CHECK(p["errors"].as_array().empty());
}

template <class Pred>
inline bool eventually(Pred pred, std::chrono::milliseconds limit = 3s) {
  auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

}  // namespace server_test
