// StateLock (CONTRACT §7 "One agent per state directory") against real files: a second holder is
// refused with the directory and the pid, in this process or another; the lock goes with the
// object and with a holder killed by SIGKILL.
#include "gpunode/store/state_lock.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "temp_dir.hpp"

namespace fs = std::filesystem;
using gpunode::store::StateLock;
using gpunode::test::TempDir;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string own_pid_line() {
  return std::to_string(::getpid()) + "\n";
}

std::string in_use(const fs::path& dir, long pid) {
  return "state directory " + dir.string() + " is in use by another gpunode-agent (pid " +
         std::to_string(pid) + ")";
}

StateLock acquire_ok(const fs::path& dir) {
  auto lock = StateLock::acquire(dir);
  REQUIRE_MESSAGE(lock.has_value(), (lock ? "" : lock.error().detail));
  return std::move(*lock);
}

}  // namespace

TEST_CASE("state lock: a second acquire in the same process is refused with the directory and the pid") {
  TempDir d;
  StateLock first = acquire_ok(d.path());
  CHECK(first.file() == d / "lock");
  CHECK(slurp(d / "lock") == own_pid_line());

  auto second = StateLock::acquire(d.path());  // another open file description: flock conflicts
  REQUIRE_FALSE(second.has_value());
  CHECK(second.error().detail == in_use(d.path(), ::getpid()));
  CHECK(slurp(d / "lock") == own_pid_line());  // the refused one wrote nothing
}

TEST_CASE("state lock: released on destruction, kept across a move") {
  TempDir d;
  {
    StateLock moved = acquire_ok(d.path());
    CHECK_FALSE(StateLock::acquire(d.path()).has_value());
    StateLock target = std::move(moved);
    CHECK_FALSE(StateLock::acquire(d.path()).has_value());
  }
  acquire_ok(d.path());
}

TEST_CASE("state lock: a stale pid in the file does not hold the directory") {
  TempDir d;
  std::ofstream(d / "lock") << "999999\n";
  StateLock lock = acquire_ok(d.path());
  CHECK(slurp(d / "lock") == own_pid_line());
}

TEST_CASE("state lock: held without a pid in the file, the refusal names the directory only") {
  TempDir d;
  int fd = ::open((d / "lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);  // as `flock -n FILE` from a shell would
  auto r = StateLock::acquire(d.path());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail == "state directory " + d.path().string() + " is in use by another gpunode-agent");
  CHECK(r.error().code == gpunode::error::Errc::busy);
  ::close(fd);
  acquire_ok(d.path());
}

TEST_CASE("state lock: a lock held by another process is seen, and goes when that process is SIGKILLed") {
  TempDir d;
  int ready[2];
  REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(ready[0]);
    auto held = StateLock::acquire(d.path());
    const char ok = held ? 'y' : 'n';
    (void)::write(ready[1], &ok, 1);
    for (;;) ::pause();  // holds the lock until killed
  }
  ::close(ready[1]);
  char ok = 0;
  REQUIRE(::read(ready[0], &ok, 1) == 1);
  ::close(ready[0]);
  CHECK(ok == 'y');

  auto refused = StateLock::acquire(d.path());
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().detail == in_use(d.path(), child));

  REQUIRE(::kill(child, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  StateLock after = acquire_ok(d.path());
  CHECK(slurp(d / "lock") == own_pid_line());
}

TEST_CASE("state lock: a missing directory is an error naming it") {
  TempDir d;
  const fs::path missing = d / "no-such-dir";
  auto r = StateLock::acquire(missing);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail.find("state directory " + missing.string() + ": cannot open " +
                              (missing / "lock").string()) == 0);
  CHECK(r.error().detail.find("No such file or directory") != std::string::npos);
  CHECK(r.error().code == gpunode::error::Errc::not_found);
}
