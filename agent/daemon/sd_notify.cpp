#include "gpunode/daemon/sd_notify.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>

namespace gpunode::daemon {

bool sd_notify(std::string_view state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return false;
  const std::size_t len = std::strlen(path);
  sockaddr_un addr{};
  if ((path[0] != '/' && path[0] != '@') || len >= sizeof addr.sun_path) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path, len);
  if (path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  const auto addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  const ssize_t sent = ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL | MSG_DONTWAIT,
                                reinterpret_cast<const sockaddr*>(&addr), addr_len);
  ::close(fd);
  return sent == static_cast<ssize_t>(state.size());
}

namespace {

// A decimal environment value, or nothing (unset, empty, or not a number).
std::optional<unsigned long long> number(const char* text) {
  if (text == nullptr || *text == '\0') return std::nullopt;
  unsigned long long v = 0;
  const char* end = text + std::strlen(text);
  auto [p, ec] = std::from_chars(text, end, v);
  if (ec != std::errc{} || p != end) return std::nullopt;
  return v;
}

}  // namespace

std::optional<std::chrono::microseconds> sd_watchdog_interval() {
  auto usec = number(std::getenv("WATCHDOG_USEC"));
  if (!usec || *usec == 0) return std::nullopt;
  if (const char* pid = std::getenv("WATCHDOG_PID"); pid != nullptr && *pid != '\0') {
    auto p = number(pid);
    if (!p || *p != static_cast<unsigned long long>(::getpid()))
      return std::nullopt;  // meant for another process
  }
  return std::chrono::microseconds(*usec);
}

std::vector<PassedSocket> sd_listen_fds() {
  constexpr int kFirst = 3;  // SD_LISTEN_FDS_START
  const auto pid = number(std::getenv("LISTEN_PID"));
  const auto count = number(std::getenv("LISTEN_FDS"));
  const char* names = std::getenv("LISTEN_FDNAMES");
  std::string all_names = names != nullptr ? names : "";
  ::unsetenv("LISTEN_PID");
  ::unsetenv("LISTEN_FDS");
  ::unsetenv("LISTEN_FDNAMES");
  std::vector<PassedSocket> out;
  if (!pid || *pid != static_cast<unsigned long long>(::getpid()) || !count || *count == 0 || *count > 64)
    return out;
  std::size_t at = 0;
  for (int i = 0; i < static_cast<int>(*count); ++i) {
    PassedSocket s;
    s.fd = kFirst + i;
    if (at <= all_names.size()) {  // names are ':'-separated, one per descriptor, in order
      const auto colon = all_names.find(':', at);
      s.name = all_names.substr(at, colon == std::string::npos ? std::string::npos : colon - at);
      at = colon == std::string::npos ? all_names.size() + 1 : colon + 1;
    }
    ::fcntl(s.fd, F_SETFD, FD_CLOEXEC);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace gpunode::daemon
