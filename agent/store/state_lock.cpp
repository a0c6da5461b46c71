// One agent per state directory. See state_lock.hpp for why flock.
#include "gpunode/store/state_lock.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <optional>
#include <string_view>
#include <utility>

namespace gpunode::store {
namespace {

// The pid the holder wrote, if the file holds one ("1234\n").
std::optional<long> read_pid(int fd) {
  char buf[32];
  ssize_t n;
  do {
    n = ::pread(fd, buf, sizeof buf - 1, 0);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return std::nullopt;
  std::string_view text(buf, static_cast<std::size_t>(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  long pid = 0;
  auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), pid);
  if (text.empty() || err != std::errc{} || end != text.data() + text.size() || pid <= 0) return std::nullopt;
  return pid;
}

}  // namespace

error::Result<StateLock> StateLock::acquire(const std::filesystem::path& dir) {
  std::filesystem::path file = dir / "lock";
  int fd;
  do {
    fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    return std::unexpected(error::from_errno(
        errno, fmt::format("state directory {}: cannot open {}", dir.string(), file.string())));
  }
  StateLock lock(fd, std::move(file));  // closes fd on every return below
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int e = errno;
    if (e == EWOULDBLOCK) {
      auto pid = read_pid(fd);
      return error::fail(error::Errc::busy,
                         fmt::format("state directory {} is in use by another gpunode-agent{}", dir.string(),
                                     pid ? fmt::format(" (pid {})", *pid) : std::string()));
    }
    return std::unexpected(error::from_errno(
        e, fmt::format("state directory {}: cannot lock {}", dir.string(), lock.file_.string())));
  }
  // Ours now: say who holds it (a stale pid from a dead holder is replaced).
  const std::string pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return std::unexpected(error::from_errno(
        errno,
        fmt::format("state directory {}: cannot write the pid into {}", dir.string(), lock.file_.string())));
  }
  return lock;
}

StateLock::StateLock(StateLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), file_(std::move(other.file_)) {}

StateLock& StateLock::operator=(StateLock&& other) noexcept {
  if (this != &other) {
    release();
    fd_ = std::exchange(other.fd_, -1);
    file_ = std::move(other.file_);
  }
  return *this;
}

StateLock::~StateLock() {
  release();
}

void StateLock::release() noexcept {
  if (fd_ >= 0) ::close(fd_);  // the lock goes with the open file description's last descriptor
  fd_ = -1;
}

}  // namespace gpunode::store
