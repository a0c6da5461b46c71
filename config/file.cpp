// config::read_file: a whole regular file, bounded, without hanging on a FIFO.
#include "gpunode/config/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gpunode::config {
namespace {

// Closes the descriptor it holds.
struct Closer {
  int fd;
  ~Closer() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::expected<std::string, int> read_file(const std::string& path, std::size_t limit) {
  const Closer f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)};
  if (f.fd < 0) return std::unexpected(errno);
  return read_file(f.fd, limit);
}

std::expected<std::string, int> read_file(int fd, std::size_t limit) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::unexpected(errno);
  if (S_ISDIR(st.st_mode)) return std::unexpected(EISDIR);
  if (!S_ISREG(st.st_mode)) return std::unexpected(EINVAL);
  if (st.st_size < 0 || static_cast<std::size_t>(st.st_size) > limit) return std::unexpected(EFBIG);
  std::string text;
  text.reserve(static_cast<std::size_t>(st.st_size));
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::unexpected(errno);
    if (n == 0) return text;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > limit) return std::unexpected(EFBIG);  // it grew while read
  }
}

std::string read_error_text(int error, std::size_t limit) {
  if (error == EINVAL) return "not a regular file";
  if (error == EFBIG) {
    if (limit % (1 << 20) == 0) return "larger than " + std::to_string(limit >> 20) + " MiB";
    return "larger than " + std::to_string(limit) + " bytes";
  }
  return std::strerror(error);
}

}  // namespace gpunode::config
