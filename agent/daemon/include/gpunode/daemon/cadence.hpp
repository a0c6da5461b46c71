// gpunode/daemon/cadence.hpp: when a periodic timer of the core thread fires next.
//
// The core thread's periodic work (the backstop rescan, discovery.rescan_interval; the health poll,
// health.interval; the audit checkpoints' looks after the first, every 30 s until one is signed since start)
// runs at the multiples of its interval on the monotonic clock, not an interval after it last ran: two with
// the same interval (both 30 s by default) wake the thread once between them instead of twice, as a wake-up
// is much of what an idle agent costs, and neither drifts by the time its work took.
#pragma once

#include <chrono>

namespace gpunode::daemon {

// The first multiple of `interval` on the monotonic clock after `now` (`now` itself for an interval
// that is not positive).
inline std::chrono::steady_clock::time_point next_on_cadence(std::chrono::steady_clock::time_point now,
                                                             std::chrono::steady_clock::duration interval) {
  if (interval <= std::chrono::steady_clock::duration::zero()) return now;
  return std::chrono::steady_clock::time_point((now.time_since_epoch() / interval + 1) * interval);
}

}  // namespace gpunode::daemon
