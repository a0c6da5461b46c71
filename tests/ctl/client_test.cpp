// The admin-socket client against small servers on a real Unix socket: an answer, a peer refused
// (closed without an answer), a stale socket file, no socket, silence past the deadline, and an
// answer that is not HTTP.
#include "gpunode/ctl/client.hpp"

#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

using namespace gpunode::ctl;
using namespace std::chrono_literals;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/gpunodectl-client-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

int bound_socket(const std::string& path, bool listen_too) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  if (listen_too) REQUIRE(::listen(fd, 4) == 0);
  return fd;
}

// Accepts one connection and hands it to `serve` on a thread of its own.
struct OneShotServer {
  int fd;
  std::thread t;
  OneShotServer(const std::string& path, std::function<void(int)> serve) : fd(bound_socket(path, true)) {
    t = std::thread([this, serve = std::move(serve)] {
      const int c = ::accept(fd, nullptr, nullptr);
      if (c >= 0) {
        serve(c);
        ::close(c);
      }
    });
  }
  ~OneShotServer() {
    t.join();
    ::close(fd);
  }
};

void read_request(int c) {
  std::string got;
  char buf[4096];
  while (got.find("\r\n\r\n") == std::string::npos) {
    const auto n = ::read(c, buf, sizeof buf);
    if (n <= 0) return;
    got.append(buf, static_cast<std::size_t>(n));
  }
}

void write_all(int c, std::string_view s) {
  while (!s.empty()) {
    const auto n = ::write(c, s.data(), s.size());
    if (n <= 0) return;
    s.remove_prefix(static_cast<std::size_t>(n));
  }
}

Request quick(std::string target) {
  Request r;
  r.target = std::move(target);
  r.timeout = 2s;
  return r;
}

}  // namespace

TEST_CASE("an answer: status, lower-cased headers, body") {
  TempDir d;
  const std::string path = d.path + "/a.sock";
  OneShotServer s(path, [](int c) {
    read_request(c);
    write_all(c,
              "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Request-Id: r1\r\nContent-Length: "
              "11\r\n\r\n{\"ok\":true}");
  });
  auto r = UnixClient(path, "test").call(quick("/healthz"));
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->header("x-request-id") == "r1");
  CHECK(r->body == "{\"ok\":true}");
}

TEST_CASE("closed at once without an answer: the agent refused the peer") {
  TempDir d;
  const std::string path = d.path + "/a.sock";
  OneShotServer s(path, [](int) {});
  auto r = UnixClient(path, "test").call(quick("/healthz"));
  REQUIRE(!r);
  CHECK(r.error().kind == TransportError::Kind::refused_peer);
  CHECK(r.error().path == path);
}

TEST_CASE("no socket, a socket nobody listens on") {
  TempDir d;
  auto r = UnixClient(d.path + "/none.sock", "test").call(quick("/healthz"));
  REQUIRE(!r);
  CHECK(r.error().kind == TransportError::Kind::missing);
  CHECK(describe(r.error(), 5).find(d.path + "/none.sock") != std::string::npos);
  const std::string stale = d.path + "/stale.sock";
  const int fd = bound_socket(stale, false);
  auto s = UnixClient(stale, "test").call(quick("/healthz"));
  ::close(fd);
  REQUIRE(!s);
  CHECK(s.error().kind == TransportError::Kind::not_listening);
}

TEST_CASE("silence past the request's deadline: a timeout, and the call returns") {
  TempDir d;
  const std::string path = d.path + "/a.sock";
  std::atomic<bool> done{false};
  OneShotServer s(path, [&](int c) {
    read_request(c);
    while (!done) std::this_thread::sleep_for(10ms);
  });
  Request q = quick("/slow");
  q.timeout = 1s;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = UnixClient(path, "test").call(q);
  const auto took = std::chrono::steady_clock::now() - t0;
  done = true;
  REQUIRE(!r);
  CHECK(r.error().kind == TransportError::Kind::timeout);
  // At its deadline, not before; and it returns (30 s: a hung call, not a slow machine).
  CHECK(took >= 1s);
  CHECK(took < 30s);
  CHECK(describe(r.error(), 0).find("within 1 s") != std::string::npos);
}

TEST_CASE("an answer that is not HTTP") {
  TempDir d;
  const std::string path = d.path + "/a.sock";
  OneShotServer s(path, [](int c) {
    read_request(c);
    write_all(c, "SSH-2.0-OpenSSH_9.2\r\n");
  });
  auto r = UnixClient(path, "test").call(quick("/healthz"));
  REQUIRE(!r);
  CHECK(r.error().kind == TransportError::Kind::broken);
  CHECK(describe(r.error(), 0).starts_with("gpunodectl: cannot talk to the agent at " + path + ": "));
}
