// The parts of systemd's daemon protocols the agent needs, without libsystemd (which would pull
// seven more shared libraries into every agent's memory; each part is a few lines over documented,
// stable environment variables): a datagram to $NOTIFY_SOCKET, the watchdog interval from
// $WATCHDOG_USEC / $WATCHDOG_PID, and the sockets of socket activation from $LISTEN_PID,
// $LISTEN_FDS and $LISTEN_FDNAMES (sd_listen_fds_with_names(3)).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpunode::daemon {

// Sends `state` ("READY=1", "STOPPING=1", "WATCHDOG=1") when run under systemd; false when not
// (no NOTIFY_SOCKET) or the send failed.
bool sd_notify(std::string_view state);

// The watchdog interval systemd expects pets within, when it watches this process.
std::optional<std::chrono::microseconds> sd_watchdog_interval();

// A socket systemd passed: its descriptor (3, 4, ...) and its FileDescriptorName= (systemd's
// default is the socket unit's name).
struct PassedSocket {
  int fd = -1;
  std::string name;
};
// The sockets passed to this process, each made close-on-exec, and the three variables unset so
// that no child process takes them for its own. Empty when none were passed, or when they were
// meant for another process ($LISTEN_PID).
std::vector<PassedSocket> sd_listen_fds();

}  // namespace gpunode::daemon
