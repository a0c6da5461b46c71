// The daemon's two event sources besides requests: the wall-clock timer of the terms and the
// kernel's device events (their parser alone, and the socket with a uevent sent as the kernel
// sends them, where this test may send on that group: as root).
#include <doctest/doctest.h>
#include <linux/netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gpunode/daemon/cadence.hpp"
#include "gpunode/daemon/debounce.hpp"
#include "gpunode/daemon/uevents.hpp"
#include "gpunode/daemon/wall_timer.hpp"

using gpunode::daemon::parse_uevent;
using gpunode::daemon::Uevent;
using gpunode::daemon::UeventMonitor;
using gpunode::daemon::WallTimer;
using namespace std::chrono_literals;
using Clock = std::chrono::system_clock;

namespace {

std::string msg(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (auto p : parts) {
    out.append(p);
    out.push_back('\0');
  }
  return out;
}

// Sends `message` to the kernel uevent group; false where this process may not (not root).
bool send_uevent(const std::string& message) {
  const int fd = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_KOBJECT_UEVENT);
  if (fd < 0) return false;
  sockaddr_nl to{};
  to.nl_family = AF_NETLINK;
  to.nl_groups = 1;
  const bool ok = ::sendto(fd, message.data(), message.size(), 0, reinterpret_cast<const sockaddr*>(&to),
                           sizeof to) == static_cast<ssize_t>(message.size());
  ::close(fd);
  return ok;
}

// Runs `io` until `done` holds, or for 30 s: a hang guard, not a bound on the timer's speed (the
// steady clock's: the tests set the system clock).
template <class Pred>
bool run_until(boost::asio::io_context& io, Pred done) {
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (!done() && std::chrono::steady_clock::now() < until) io.run_one_for(100ms);
  return done();
}

}  // namespace

TEST_CASE("wall timer: fires at its instant, at once for one passed, never for one replaced or cancelled") {
  boost::asio::io_context io;
  auto timer = WallTimer::open(io);
  REQUIRE_MESSAGE(timer, (timer ? "" : timer.error().detail));
  auto& t = **timer;

  // The replaced wait is an hour away: the one that fires within the test is the second, not before
  // its instant.
  const auto start = Clock::now();
  Clock::time_point fired{};
  int replaced = 0;
  t.wait_until(start + std::chrono::hours(1), [&](WallTimer::Woken) { ++replaced; });
  t.wait_until(start + 300ms, [&](WallTimer::Woken why) {
    CHECK(why == WallTimer::Woken::due);
    fired = Clock::now();
  });
  REQUIRE(run_until(io, [&] { return fired != Clock::time_point{}; }));
  CHECK(replaced == 0);
  CHECK(fired >= start + 300ms);

  io.restart();
  int passed = 0;
  t.wait_until(Clock::time_point{}, [&](WallTimer::Woken) { ++passed; });  // the epoch itself
  CHECK(run_until(io, [&] { return passed == 1; }));

  io.restart();
  int cancelled = 0;
  t.wait_until(Clock::now() + 100ms, [&](WallTimer::Woken) { ++cancelled; });
  t.cancel();
  io.run_for(400ms);
  CHECK(cancelled == 0);
}

TEST_CASE("wall timer: a set of the system clock wakes it at once as clock_set, and it can be armed again" *
          doctest::test_suite("root")) {
  boost::asio::io_context io;
  auto timer = WallTimer::open(io);
  REQUIRE_MESSAGE(timer, (timer ? "" : timer.error().detail));
  auto& t = **timer;
  // Due in an hour: woken within the test at all, it was the set that woke it.
  std::optional<WallTimer::Woken> woken;
  t.wait_until(Clock::now() + std::chrono::hours(1), [&](WallTimer::Woken why) { woken = why; });
  // The clock set to what it reads: a step of the call's own microseconds, nothing else moves,
  // but the kernel tells every CANCEL_ON_SET timer, as it does for a real step. Needs CAP_SYS_TIME.
  boost::asio::steady_timer set(io, 200ms);
  int set_errno = 0;
  set.async_wait([&](const boost::system::error_code&) {
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    if (::clock_settime(CLOCK_REALTIME, &now) != 0) set_errno = errno;
  });
  run_until(io, [&] { return woken.has_value() || set_errno != 0; });
  REQUIRE_MESSAGE(set_errno == 0, "clock_settime as root: " << std::strerror(set_errno));
  REQUIRE(woken.has_value());
  CHECK(*woken == WallTimer::Woken::clock_set);
  // Armed again after the set: due as usual.
  io.restart();
  woken.reset();
  t.wait_until(Clock::now() + 100ms, [&](WallTimer::Woken why) { woken = why; });
  REQUIRE(run_until(io, [&] { return woken.has_value(); }));
  CHECK(*woken == WallTimer::Woken::due);
}

TEST_CASE("uevents: the kernel's messages parsed; what changes the units") {
  auto bind = parse_uevent(msg({"bind@/devices/pci0000:40/0000:40:01.1/0000:41:00.0", "ACTION=bind",
                                "DEVPATH=/devices/pci0000:40/0000:40:01.1/0000:41:00.0", "SUBSYSTEM=pci",
                                "DRIVER=vfio-pci", "SEQNUM=4242"}));
  REQUIRE(bind);
  CHECK(bind->action == "bind");
  CHECK(bind->devpath == "/devices/pci0000:40/0000:40:01.1/0000:41:00.0");
  CHECK(bind->subsystem == "pci");
  CHECK(changes_units(*bind));
  for (const char* a : {"add", "remove", "unbind"}) CHECK(changes_units(Uevent{a, "/devices/x", "pci"}));
  CHECK_FALSE(changes_units(Uevent{"change", "/devices/x", "pci"}));
  CHECK(changes_units(Uevent{"add", "/kernel/iommu_groups/7", "iommu_group"}));
  CHECK_FALSE(changes_units(Uevent{"add", "/devices/virtual/net/tap0", "net"}));

  // Not the kernel's format: libudev's rebroadcast, garbage, an empty or cut message.
  CHECK_FALSE(parse_uevent(std::string("libudev\0\xfe\xed\xca\xfe", 12)));
  CHECK_FALSE(parse_uevent(""));
  CHECK_FALSE(parse_uevent("add@"));
  CHECK_FALSE(parse_uevent("@/devices/x"));
  CHECK_FALSE(parse_uevent("add/devices/x"));
  auto bare = parse_uevent("remove@/devices/x");  // no fields at all, no terminator
  REQUIRE(bare);
  CHECK(bare->subsystem.empty());
  static constexpr char kCut[] = "add@/devices/x\0SUBSYSTEM=pci";  // the last field unterminated
  auto cut = parse_uevent(std::string(kCut, sizeof kCut - 1));
  REQUIRE(cut);
  CHECK(cut->subsystem == "pci");
}

TEST_CASE("uevents: the monitor hears a PCI bind sent on the kernel's group and ignores the rest" *
          doctest::test_suite("root")) {
  boost::asio::io_context io;
  auto monitor = UeventMonitor::open(io);
  REQUIRE_MESSAGE(monitor, (monitor ? "" : monitor.error().detail));
  std::vector<Uevent> seen;
  bool ours = false;
  (*monitor)->watch([&](const gpunode::daemon::UeventNotice& n) {
    if (const auto* e = std::get_if<Uevent>(&n)) {
      seen.push_back(*e);
      if (e->devpath == "/devices/pci0000:00/0000:00:1f.6" && e->action == "unbind") ours = true;
    }
  });
  REQUIRE(send_uevent(msg({"add@/devices/virtual/net/gpunode-test", "ACTION=add", "SUBSYSTEM=net"})));
  REQUIRE(send_uevent(
      msg({"unbind@/devices/pci0000:00/0000:00:1f.6", "ACTION=unbind", "SUBSYSTEM=pci", "SEQNUM=1"})));
  // Until ours is heard: the net device's add, sent before it on the same group, has come by then.
  // Other devices may come and go on this machine meanwhile.
  CHECK(run_until(io, [&] { return ours; }));
  (*monitor)->stop();
  for (const auto& e : seen) CHECK(e.subsystem == "pci");  // the net device's add was not passed on
}

TEST_CASE(
    "debounce: after_first runs once, its delay after the first poke of a burst; after_last once quiet; "
    "cancel drops a due run") {
  using gpunode::daemon::Debounce;
  boost::asio::io_context io;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::chrono::steady_clock::duration> first_runs, last_runs;
  Debounce first(io.get_executor(), 100ms, Debounce::Mode::after_first,
                 [&] { first_runs.push_back(std::chrono::steady_clock::now() - start); });
  Debounce last(io.get_executor(), 100ms, Debounce::Mode::after_last,
                [&] { last_runs.push_back(std::chrono::steady_clock::now() - start); });
  // Pokes at 0, 40, 80, 120 and 160 ms: one burst.
  boost::asio::steady_timer poker(io);
  int pokes = 0;
  std::function<void()> poke = [&] {
    first.poke();
    last.poke();
    if (++pokes == 5) return;
    poker.expires_at(start + pokes * 40ms);
    poker.async_wait([&](const boost::system::error_code&) { poke(); });
  };
  poke();
  io.run_for(600ms);
  REQUIRE(first_runs.size() == 2);  // at 100 ms, and for the pokes after it (120, 160) at 220 ms
  CHECK(first_runs[0] >= 100ms);
  CHECK(first_runs[1] >= 220ms);
  REQUIRE(last_runs.size() == 1);  // 100 ms after the last poke (160 ms), not before
  CHECK(last_runs[0] >= 260ms);

  // A run whose time has come but has not run yet is dropped by cancel().
  bool ran = false;
  Debounce dropped(io.get_executor(), 10ms, Debounce::Mode::after_first, [&] { ran = true; });
  dropped.poke();
  CHECK(dropped.armed());
  std::this_thread::sleep_for(30ms);  // due now, its handler not yet run
  dropped.cancel();
  CHECK_FALSE(dropped.armed());
  io.restart();
  io.run_for(100ms);
  CHECK_FALSE(ran);
}

TEST_CASE("cadence: the next multiple of the interval, so that equal intervals fire together") {
  using gpunode::daemon::next_on_cadence;
  using Steady = std::chrono::steady_clock;
  const Steady::time_point at(std::chrono::hours(100) + 7s + 250ms);
  CHECK(next_on_cadence(at, 30s) == Steady::time_point(std::chrono::hours(100) + 30s));
  CHECK(next_on_cadence(Steady::time_point(std::chrono::hours(100) + 30s), 30s) ==
        Steady::time_point(std::chrono::hours(100) + 60s));  // strictly after: never fires twice at once
  // A rescan armed after its work and a health poll armed before it still meet.
  CHECK(next_on_cadence(at + 3ms, 30s) == next_on_cadence(at, 30s));
  CHECK(next_on_cadence(at, 200ms) == Steady::time_point(std::chrono::hours(100) + 7s + 400ms));
  CHECK(next_on_cadence(at, 0s) == at);
  for (const auto now : {Steady::now(), Steady::now() + 29999ms}) {
    const auto next = next_on_cadence(now, 30s);
    CHECK(next > now);
    CHECK(next - now <= 30s);
    CHECK(next.time_since_epoch() % 30s == Steady::duration::zero());
  }
}
