// A file descriptor closed when it goes out of scope: the admin socket's client and the hook's
// settings cache (config.cpp keeps a copy of its own, below this library).
#pragma once

#include <unistd.h>

namespace gpunode::ctl {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  [[nodiscard]] int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace gpunode::ctl
