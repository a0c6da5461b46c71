#include "gpunode/daemon/sd_notify.hpp"

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

std::optional<std::chrono::microseconds> sd_watchdog_interval() {
  auto number = [](const char* text) -> std::optional<unsigned long long> {
    if (text == nullptr || *text == '\0') return std::nullopt;
    unsigned long long v = 0;
    const char* end = text + std::strlen(text);
    auto [p, ec] = std::from_chars(text, end, v);
    if (ec != std::errc{} || p != end) return std::nullopt;
    return v;
  };
  auto usec = number(std::getenv("WATCHDOG_USEC"));
  if (!usec || *usec == 0) return std::nullopt;
  if (const char* pid = std::getenv("WATCHDOG_PID"); pid != nullptr && *pid != '\0') {
    auto p = number(pid);
    if (!p || *p != static_cast<unsigned long long>(::getpid()))
      return std::nullopt;  // meant for another process
  }
  return std::chrono::microseconds(*usec);
}

}  // namespace gpunode::daemon
