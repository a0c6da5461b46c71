// gpunode/store/state_lock.hpp: one agent per state directory (CONTRACT §7).
//
// `run` takes the lock before it opens anything in state.dir and holds it for its whole life; a
// second agent on the same directory refuses to start, naming the directory and the holder's pid.
// The lock is flock(2) LOCK_EX|LOCK_NB on <dir>/lock, which then holds the holder's pid ("1234\n").
// The kernel drops it when the holder's last descriptor of that open file goes, so also when the
// process dies in any way, SIGKILL included: a stale lock file is never a reason to refuse.
//
// Why flock and not fcntl (POSIX) locks: fcntl locks belong to the process, not to the open file,
// so a second acquire in the same process would succeed against its own lock, and they are dropped
// as soon as the process closes ANY descriptor of the file (SQLite, a library, a test that reads
// the pid file): the lock would vanish silently while the agent runs. flock locks belong to the
// open file description: a second open of <dir>/lock conflicts even in the same process, and only
// closing this object's descriptor releases it. The descriptor is O_CLOEXEC, so a program the agent
// executes never inherits the lock (a fork without exec would share it: the agent does not fork).
#pragma once

#include <expected>
#include <filesystem>
#include <string>

#include "gpunode/error/error.hpp"

namespace gpunode::store {

class StateLock {
 public:
  // Locks <dir>/lock (created mode 0644 if missing; `dir` must exist) and writes this process's
  // pid into it. Fails when another open file holds the lock, e.g.
  //   state directory /var/lib/gpunode is in use by another gpunode-agent (pid 1234)
  // (without the pid when the file does not hold one), or with the file and the reason when the
  // lock file cannot be opened or locked.
  static error::Result<StateLock> acquire(const std::filesystem::path& dir);

  StateLock(StateLock&& other) noexcept;
  StateLock& operator=(StateLock&& other) noexcept;
  StateLock(const StateLock&) = delete;
  StateLock& operator=(const StateLock&) = delete;
  ~StateLock();  // releases the lock (closes the descriptor); the pid stays in the file

  const std::filesystem::path& file() const { return file_; }  // <dir>/lock

 private:
  StateLock(int fd, std::filesystem::path file) : fd_(fd), file_(std::move(file)) {}
  void release() noexcept;

  int fd_ = -1;
  std::filesystem::path file_;
};

}  // namespace gpunode::store
