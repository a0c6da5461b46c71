#include "gpunode/daemon/debounce.hpp"

namespace gpunode::daemon {

void Debounce::poke() {
  if (armed_) {
    poked_again_ = true;
    return;
  }
  armed_ = true;
  poked_again_ = false;
  arm();
}

void Debounce::arm() {
  timer_.expires_after(delay_);
  timer_.async_wait([this, generation = generation_](const boost::system::error_code& e) {
    if (e || generation != generation_) return;  // cancelled (also after its time had come)
    if (mode_ == Mode::after_last && poked_again_) {
      poked_again_ = false;
      return arm();
    }
    armed_ = false;
    action_();
  });
}

void Debounce::cancel() {
  ++generation_;
  armed_ = false;
  poked_again_ = false;
  timer_.cancel();
}

}  // namespace gpunode::daemon
