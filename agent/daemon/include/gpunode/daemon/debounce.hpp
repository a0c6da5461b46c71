// gpunode/daemon/debounce.hpp: one run of an action for a burst of pokes.
//
// - Mode::after_first: the action runs `delay` after the first poke of a burst; pokes meanwhile
//   join that run (a burst of kernel uevents is one rescan; of libvirt events, one list).
// - Mode::after_last: it runs once `delay` passed without a poke (after a load of requests).
// Threads: every member function, and the action, run on the executor's one thread. cancel()
// drops a pending run; a later poke arms it again.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>

namespace gpunode::daemon {

class Debounce {
 public:
  enum class Mode { after_first, after_last };
  Debounce(boost::asio::any_io_executor executor, std::chrono::milliseconds delay, Mode mode,
           std::function<void()> action)
      : timer_(std::move(executor)), delay_(delay), mode_(mode), action_(std::move(action)) {}
  Debounce(const Debounce&) = delete;
  Debounce& operator=(const Debounce&) = delete;

  void poke();
  void cancel();
  [[nodiscard]] bool armed() const { return armed_; }

 private:
  void arm();
  boost::asio::steady_timer timer_;
  std::chrono::milliseconds delay_;
  Mode mode_;
  std::function<void()> action_;
  bool armed_ = false;
  bool poked_again_ = false;  // after_last: a poke came while armed
  unsigned generation_ = 0;   // moved by cancel(): a run already due is dropped too
};

}  // namespace gpunode::daemon
