// gpunode/daemon/wall_timer.hpp: a timer for an instant of the wall clock, for reservation terms.
//
// Terms are instants of the wall clock (startsAt, endsAt), so a steady timer for "now + delta"
// is wrong as soon as the clock is stepped (NTP, an operator): it fires an hour late after a step
// back, or early after a step forward. A WallTimer is a timerfd on CLOCK_REALTIME, armed for the instant
// itself (TFD_TIMER_ABSTIME) with TFD_TIMER_CANCEL_ON_SET: the kernel wakes it at that instant of
// the wall clock, and at once whenever the clock is set, so the caller looks at the terms again.
// An idle agent with no term pending sleeps (it re-arms once a day).
//
// Threads: one io_context's thread (the daemon's core); not thread-safe.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "gpunode/error/error.hpp"

namespace gpunode::daemon {

class WallTimer {
 public:
  // Why the handler was called.
  enum class Woken { due, clock_set };

  // An error says why the kernel refused a timerfd (its errno kept).
  static error::Result<std::unique_ptr<WallTimer>> open(boost::asio::io_context& io);

  WallTimer(const WallTimer&) = delete;
  WallTimer& operator=(const WallTimer&) = delete;
  ~WallTimer() = default;

  // Calls `fired` once, on the io_context's thread: at `when` (or at once if it has passed), or
  // as soon as the wall clock is set, whichever is first. A new wait_until() or cancel() replaces
  // the previous wait: its handler is never called.
  void wait_until(std::chrono::system_clock::time_point when, std::function<void(Woken)> fired);
  void cancel();

 private:
  explicit WallTimer(boost::asio::posix::stream_descriptor fd) : fd_(std::move(fd)) {}
  void wait(std::uint64_t generation);

  boost::asio::posix::stream_descriptor fd_;
  std::function<void(Woken)> fired_;
  std::uint64_t generation_ = 0;
};

}  // namespace gpunode::daemon
