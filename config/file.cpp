// config::read_file: a whole regular file, bounded, without hanging on a FIFO.
#include "gpunode/config/file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
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

namespace {

// Writes all of `content`, then fsyncs; errno on failure.
int write_all(int fd, std::string_view content) {
  while (!content.empty()) {
    const ssize_t n = ::write(fd, content.data(), content.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    content.remove_prefix(static_cast<std::size_t>(n));
  }
  return ::fsync(fd) == 0 ? 0 : errno;
}

}  // namespace

std::expected<void, int> write_file_atomic(const std::string& path, std::string_view content, unsigned mode,
                                           bool replace) {
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  std::string temp = path + ".tmp.XXXXXX";
  const Closer f{::mkostemp(temp.data(), O_CLOEXEC)};
  if (f.fd < 0) return std::unexpected(errno);
  int err = ::fchmod(f.fd, static_cast<mode_t>(mode)) == 0 ? write_all(f.fd, content) : errno;
  if (err == 0 && replace && ::rename(temp.c_str(), path.c_str()) != 0) err = errno;
  if (err == 0 && !replace && ::link(temp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0 || !replace) ::unlink(temp.c_str());
  if (err != 0) return std::unexpected(err);
  const Closer d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.fd >= 0 && ::fsync(d.fd) != 0) return std::unexpected(errno);
  return {};
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
