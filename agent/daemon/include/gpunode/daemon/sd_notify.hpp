// The two calls of systemd's notify protocol the agent needs, without libsystemd (which would
// pull seven more shared libraries into every agent's memory): a datagram to $NOTIFY_SOCKET,
// and the watchdog interval from $WATCHDOG_USEC / $WATCHDOG_PID.
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

namespace gpunode::daemon {

// Sends `state` ("READY=1", "STOPPING=1", "WATCHDOG=1") when run under systemd; false when not
// (no NOTIFY_SOCKET) or the send failed.
bool sd_notify(std::string_view state);

// The watchdog interval systemd expects pets within, when it watches this process.
std::optional<std::chrono::microseconds> sd_watchdog_interval();

}  // namespace gpunode::daemon
