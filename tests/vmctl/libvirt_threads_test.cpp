// The libvirt adapter used from several threads at once, against libvirt's test driver.
//
// To hold one libvirt call of the adapter where it is, this binary defines virDomainGetXMLDesc and
// virDomainDestroy itself: the adapter (a static library linked into it) calls these instead of
// libvirt's, and they pass every call on to libvirt's own (dlsym RTLD_NEXT) except the one made on
// the thread a Gate is armed on, which waits in the gate until the test opens it: a stand-in for a
// libvirtd that is slow to answer that one call. Nothing here depends on timing to pass: a wait
// with a limit only bounds how long a broken adapter takes to fail.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <libvirt/libvirt.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <expected>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gpunode/vmctl/vmctl.hpp"

using namespace gpunode::vmctl;
using namespace std::chrono_literals;

namespace {

constexpr auto kLimit = 30s;  // how long a call that should not be held back may take

class Gate {
 public:
  // On the test's thread, before the call to hold starts: nothing held, not open.
  void close() {
    std::lock_guard lock{mu_};
    armed_ = held_ = open_ = false;
  }
  // On the thread of the call to hold: its next call through this gate waits in it until open().
  void arm() {
    std::lock_guard lock{mu_};
    thread_ = std::this_thread::get_id();
    armed_ = true;
  }
  void disarm() {
    std::lock_guard lock{mu_};
    armed_ = false;
  }
  void pass() {
    std::unique_lock lock{mu_};
    if (!armed_ || std::this_thread::get_id() != thread_) return;
    armed_ = false;
    held_ = true;
    cv_.notify_all();
    cv_.wait(lock, [this] { return open_; });
  }
  bool wait_held() {
    std::unique_lock lock{mu_};
    return cv_.wait_for(lock, kLimit, [this] { return held_; });
  }
  void open() {
    std::lock_guard lock{mu_};
    armed_ = false;
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread::id thread_;
  bool armed_ = false;
  bool held_ = false;
  bool open_ = false;
};

Gate xml_gate;      // virDomainGetXMLDesc: list() calls it for every domain
Gate destroy_gate;  // virDomainDestroy: a termination's hard stop

// Closes a gate for a test and opens it when the test leaves, however it leaves (declared after
// the futures of the calls it may hold, so that it opens before their destructors wait for them).
class GateUse {
 public:
  explicit GateUse(Gate& gate) : gate_(gate) { gate_.close(); }
  GateUse(const GateUse&) = delete;
  GateUse& operator=(const GateUse&) = delete;
  ~GateUse() { gate_.open(); }

 private:
  Gate& gate_;
};

// `call` on a thread of its own, its first call through `gate` held there.
template <typename Call>
auto held_in(Gate& gate, Call call) {
  return std::async(std::launch::async, [&gate, call] {
    gate.arm();
    auto result = call();
    gate.disarm();
    return result;
  });
}

using Listing = std::future<std::expected<std::vector<Domain>, VmError>>;

template <typename Fn>
Fn real(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

const std::string fixture_uri = "test://" + std::string{GPUNODE_VMCTL_DATA} + "/node.xml";
const TerminationRecord record{"capacity-reclaim", "2027-01-31T00:00:00Z", "org-a", "aud_9"};

template <typename T>
bool ready(std::future<T>& f) {
  return f.wait_for(kLimit) == std::future_status::ready;
}

std::string uuid_of(Hypervisor& hv, const std::string& name) {
  auto all = hv.list();
  REQUIRE(all.has_value());
  for (const auto& d : *all)
    if (d.name == name) return d.uuid;
  FAIL("no domain " << name);
  return {};
}

}  // namespace

// Exported (the build hides symbols by default): the loader must see them to bind libvirt's calls here.
extern "C" __attribute__((visibility("default"))) char* virDomainGetXMLDesc(virDomainPtr domain,
                                                                            unsigned int flags) {
  static const auto call = real<char* (*)(virDomainPtr, unsigned int)>("virDomainGetXMLDesc");
  xml_gate.pass();
  return call(domain, flags);
}

extern "C" __attribute__((visibility("default"))) int virDomainDestroy(virDomainPtr domain) {
  static const auto call = real<int (*)(virDomainPtr)>("virDomainDestroy");
  destroy_gate.pass();
  return call(domain);
}

TEST_CASE("libvirt: a listing held inside libvirt does not hold back a termination, a state or a listing") {
  auto hv = make_libvirt(fixture_uri);
  const std::string spot = uuid_of(*hv, "spot-b-pair");
  Listing listing;
  struct Seen {
    bool terminated = false;
    std::string state;
    std::size_t listed = 0;
  };
  std::future<Seen> others;
  GateUse gate_use{xml_gate};
  listing = held_in(xml_gate, [&] { return hv->list(); });
  REQUIRE(xml_gate.wait_held());  // the listing is between its round trips, inside one

  others = std::async(std::launch::async, [&] {
    Seen seen;
    auto all = hv->list();
    if (all) seen.listed = all->size();
    if (hv->record_termination(spot, record).has_value() && hv->destroy(spot).has_value())
      seen.terminated = true;
    if (auto s = hv->state(spot)) seen.state = *s;
    return seen;
  });
  const bool done_first = ready(others);
  CHECK_MESSAGE(done_first, "another thread's calls waited for the held listing");
  xml_gate.open();
  REQUIRE(ready(listing));
  auto listed = listing.get();
  REQUIRE(listed.has_value());
  CHECK(listed->size() == 8);
  REQUIRE(ready(others));
  const Seen seen = others.get();
  CHECK(seen.listed == 8);
  CHECK(seen.terminated);
  CHECK(seen.state == "shutoff");
}

TEST_CASE("libvirt: a termination held inside libvirt does not hold back a listing") {
  auto hv = make_libvirt(fixture_uri);
  const std::string spot = uuid_of(*hv, "spot-b-two");
  std::future<std::expected<void, VmError>> terminating;
  Listing listing;
  GateUse gate_use{destroy_gate};
  terminating = held_in(destroy_gate, [&] { return hv->destroy(spot); });
  REQUIRE(destroy_gate.wait_held());

  listing = std::async(std::launch::async, [&] { return hv->list(); });
  const bool done_first = ready(listing);
  CHECK_MESSAGE(done_first, "the listing waited for the held termination");
  destroy_gate.open();
  REQUIRE(ready(terminating));
  CHECK(terminating.get().has_value());
  REQUIRE(ready(listing));
  auto listed = listing.get();
  REQUIRE(listed.has_value());
  CHECK(listed->size() == 8);
  auto state = hv->state(spot);
  REQUIRE(state.has_value());
  CHECK(*state == "shutoff");
}

TEST_CASE("libvirt: dropping the connection (watch) does not close it under a listing still on it") {
  auto hv = make_libvirt(fixture_uri);
  REQUIRE(hv->list().has_value());
  Listing listing;
  Listing meanwhile;
  GateUse gate_use{xml_gate};
  listing = held_in(xml_gate, [&] { return hv->list(); });
  REQUIRE(xml_gate.wait_held());
  // Starting to watch drops the listing's connection; the next call opens another.
  meanwhile = std::async(std::launch::async, [&] {
    hv->watch([] {});
    return hv->list();
  });
  const bool done_first = ready(meanwhile);
  CHECK_MESSAGE(done_first, "watch() or the reconnect waited for the held listing");
  xml_gate.open();
  REQUIRE(ready(listing));
  auto listed = listing.get();  // finished on the old connection, still open for it
  REQUIRE(listed.has_value());
  CHECK(listed->size() == 8);
  REQUIRE(ready(meanwhile));
  auto again = meanwhile.get();
  REQUIRE(again.has_value());
  CHECK(again->size() == 8);
  CHECK(hv->connected());
  hv->watch({});
}

TEST_CASE("libvirt: calls from several threads at once, across reconnects, all answer") {
  auto hv = make_libvirt(fixture_uri);
  const std::vector<std::string> uuids{
      "a0000000-0000-4000-8000-000000000001", "b0000000-0000-4000-8000-000000000001",
      "c0000000-0000-4000-8000-000000000001", "e0000000-0000-4000-8000-000000000002"};
  std::atomic<int> wrong{0};
  std::atomic<int> answered{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        const std::string& uuid = uuids[static_cast<std::size_t>(t + i) % uuids.size()];
        auto all = hv->list();
        auto state = hv->state(uuid);
        auto recorded = hv->termination(uuid, Definition::persistent);  // not `record`: the one above
        if (!all || all->size() != 8 || !state || !recorded || recorded->has_value()) ++wrong;
        ++answered;
      }
    });
  }
  // Meanwhile the connection is dropped again and again (starting or stopping to watch does it):
  // the calls on it finish there, the next ones race to open a new one.
  int drops = 0;
  for (; answered.load() < 160; ++drops) {
    if (drops % 2 == 0)
      hv->watch([] {});
    else
      hv->watch({});
    std::this_thread::sleep_for(1ms);
  }
  for (auto& c : callers) c.join();
  CAPTURE(drops);
  hv->watch({});
  CHECK(answered.load() == 160);
  CHECK(wrong.load() == 0);
}

// Lifecycle events on test:///default, which is one host shared by every connection of the
// process: a plain libvirt connection of its own starts and destroys a transient domain in a loop
// on a thread, and the adapter's connections to test:///default hear it. It keeps a no-op callback
// registered too: libvirt's event queue reads its timer unlocked, so when the last callback of a
// host goes while an event is being queued, the queue can stall for good (seen with libvirt 9.0).
class Churn {
 public:
  Churn() : conn_(virConnectOpen("test:///default")) {
    REQUIRE(conn_ != nullptr);
    keep_ = virConnectDomainEventRegisterAny(conn_, nullptr, VIR_DOMAIN_EVENT_ID_LIFECYCLE,
                                             VIR_DOMAIN_EVENT_CALLBACK(ignore), nullptr, nullptr);
    REQUIRE(keep_ >= 0);
    thread_ = std::thread([this] {
      const char* xml =
          "<domain "
          "type='test'><name>gpunode-churn</name><memory>8192</memory><os><type>hvm</type></os></domain>";
      while (!stop_.load()) {
        if (virDomainPtr d = virDomainCreateXML(conn_, xml, 0)) {
          (void)virDomainDestroy(d);
          virDomainFree(d);
          ++count_;
        }
        std::this_thread::sleep_for(1ms);
      }
    });
  }
  Churn(const Churn&) = delete;
  Churn& operator=(const Churn&) = delete;
  ~Churn() {
    stop_ = true;
    thread_.join();
    (void)virConnectDomainEventDeregisterAny(conn_, keep_);
    virConnectClose(conn_);
  }
  // Returns once `n` more domains have come and gone (each a start and a stop event).
  void more(int n) const {
    const int target = count_.load() + n;
    while (count_.load() < target) std::this_thread::sleep_for(1ms);
  }

 private:
  static int ignore(virConnectPtr, virDomainPtr, int, int, void*) { return 0; }
  virConnectPtr conn_;
  int keep_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<int> count_{0};
  std::thread thread_;
};

TEST_CASE("libvirt: after watch() returns, the function it replaced has finished and never runs again") {
  std::optional<Churn> churn;

  // One per watcher. Its first run waits for `go` (the test says it is about to replace the
  // watcher), then lingers a little, so that replacing it finds it running: a watch() that did not
  // wait for it would return while it still runs. Any run seen after retirement is counted `late`.
  struct Probe {
    std::mutex mu;
    std::condition_variable cv;
    bool entered = false;
    bool go = false;
    std::atomic<int> runs{0};
    std::atomic<bool> retired{false};
    std::atomic<int> late{0};
  };
  auto watcher = [](Probe* p) {
    return [p] {
      if (p->retired.load()) ++p->late;
      if (p->runs++ == 0) {
        std::unique_lock lock{p->mu};
        p->entered = true;
        p->cv.notify_all();
        (void)p->cv.wait_for(lock, kLimit, [p] { return p->go; });
        lock.unlock();
        std::this_thread::sleep_for(5ms);
      }
      if (p->retired.load()) ++p->late;
    };
  };

  auto let_go = [](Probe& p) {
    std::lock_guard lock{p.mu};
    p.go = true;
    p.cv.notify_all();
  };

  constexpr int kRounds = 24;
  std::vector<std::unique_ptr<Probe>> probes;
  probes.push_back(std::make_unique<Probe>());
  {
    auto hv = make_libvirt("test:///default");
    hv->watch(watcher(probes.back().get()));  // starts libvirt's event loop, which the churn needs too
    churn.emplace();
    for (int round = 0; round < kRounds; ++round) {
      CAPTURE(round);
      Probe& p = *probes.back();
      REQUIRE(hv->list().has_value());  // (re)connects, subscribed
      {
        std::unique_lock lock{p.mu};
        REQUIRE(p.cv.wait_for(lock, kLimit, [&] { return p.entered; }));
      }
      let_go(p);
      // Replace it (odd rounds) or stop watching (even rounds) while its first run is going on.
      if (round % 2 == 1) {
        probes.push_back(std::make_unique<Probe>());
        hv->watch(watcher(probes.back().get()));
      } else {
        hv->watch({});
        probes.push_back(std::make_unique<Probe>());
        hv->watch(watcher(probes.back().get()));
      }
      p.retired = true;
    }
    let_go(*probes.back());
    hv->watch({});
    probes.back()->retired = true;
    churn->more(20);  // events keep coming with no watcher; then the adapter goes away while they do
  }
  churn->more(20);

  for (std::size_t i = 0; i + 1 < probes.size(); ++i) {
    CAPTURE(i);
    CHECK(probes[i]->runs.load() >= 1);
    CHECK(probes[i]->late.load() == 0);
  }
  CHECK(probes.back()->late.load() == 0);
}
