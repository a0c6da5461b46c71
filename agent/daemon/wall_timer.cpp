#include "gpunode/daemon/wall_timer.hpp"

#include <sys/timerfd.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>

namespace gpunode::daemon {

error::Result<std::unique_ptr<WallTimer>> WallTimer::open(boost::asio::io_context& io) {
  const int fd = ::timerfd_create(CLOCK_REALTIME, TFD_NONBLOCK | TFD_CLOEXEC);
  if (fd < 0) return std::unexpected(error::from_errno(errno, "timerfd_create(CLOCK_REALTIME)"));
  return std::unique_ptr<WallTimer>(new WallTimer(boost::asio::posix::stream_descriptor(io, fd)));
}

void WallTimer::wait_until(std::chrono::system_clock::time_point when, std::function<void(Woken)> fired) {
  cancel();
  fired_ = std::move(fired);
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count();
  itimerspec spec{};
  // An instant at or before the epoch would disarm the timer (it_value zero): one nanosecond after
  // it has passed all the same, and fires at once.
  spec.it_value.tv_sec = ns > 0 ? static_cast<time_t>(ns / 1'000'000'000) : 0;
  spec.it_value.tv_nsec = ns > 0 ? static_cast<long>(ns % 1'000'000'000) : 1;
  if (::timerfd_settime(fd_.native_handle(), TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, &spec, nullptr) !=
      0) {
    // Cannot happen with a valid descriptor and value; fire now rather than never.
    boost::asio::post(fd_.get_executor(), [this, g = generation_] {
      if (g == generation_ && fired_) std::exchange(fired_, {})(Woken::due);
    });
    return;
  }
  wait(generation_);
}

void WallTimer::cancel() {
  ++generation_;
  fired_ = {};
  boost::system::error_code ec;
  fd_.cancel(ec);
}

void WallTimer::wait(std::uint64_t generation) {
  fd_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                 [this, generation](const boost::system::error_code& ec) {
                   if (ec || generation != generation_) return;  // cancelled, or replaced by a newer wait
                   std::uint64_t expirations = 0;
                   const auto n = ::read(fd_.native_handle(), &expirations, sizeof expirations);
                   Woken why = Woken::due;
                   if (n < 0) {
                     if (errno == EAGAIN || errno == EINTR) return wait(generation);  // woken for nothing
                     // ECANCELED: the clock was set. Anything else cannot happen on a timerfd; the caller
                     // looks at the terms all the same and arms again.
                     why = errno == ECANCELED ? Woken::clock_set : Woken::due;
                   }
                   if (auto f = std::exchange(fired_, {})) f(why);
                 });
}

}  // namespace gpunode::daemon
