// Faults at the daemon's edges, in process (issue 15, item 4): libvirt going away in the middle of a
// list and of a termination (the fake hypervisor fails from a given call on), the wall clock
// stepping back an hour and forward a day (the daemon's clock is the test's), and the system
// clock set under the daemon (the kernel's notice, with a step of microseconds). Each ends with the
// daemon serving, nothing acknowledged lost, and the log line that says what happened (the
// daemon's log is stderr, captured here).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "node.hpp"

using namespace daemon_test;

namespace {

// stderr into a file while it lives (the daemon logs there), readable at any time.
class CapturedLog {
 public:
  CapturedLog() {
    char name[] = "/tmp/gpunode-faults-log-XXXXXX";
    fd_ = ::mkstemp(name);
    REQUIRE(fd_ >= 0);
    path_ = name;
    std::fflush(stderr);
    saved_ = ::dup(2);
    REQUIRE(::dup2(fd_, 2) == 2);
  }
  ~CapturedLog() {
    std::fflush(stderr);
    // A sanitizer's report written meanwhile goes where it would have gone.
    if (const auto t = text(); t.find("Sanitizer") != std::string::npos)
      (void)!::write(saved_, t.data(), t.size());
    ::dup2(saved_, 2);
    ::close(saved_);
    ::close(fd_);
    fs::remove(path_);
  }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;

  std::string text() const {
    std::ifstream in(path_);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  bool has(const std::string& needle) const { return text().find(needle) != std::string::npos; }
  std::size_t count(const std::string& needle) const {
    const auto t = text();
    std::size_t n = 0;
    for (auto at = t.find(needle); at != std::string::npos; at = t.find(needle, at + needle.size())) ++n;
    return n;
  }
  // Whether `needle` is logged within `wait`.
  bool wait_for(const std::string& needle, std::chrono::milliseconds wait) const {
    return eventually([&] { return has(needle); }, wait);
  }

 private:
  int fd_ = -1, saved_ = -1;
  fs::path path_;
};

// How long a test waits for what must come (a log line, a state): a hang guard, not a bound on the
// daemon's speed; it returns as soon as the thing is there.
constexpr std::chrono::seconds kPatience{30};

std::vector<json::object> audit(Node& n) {
  std::vector<json::object> out;
  const auto page = Node::body(n.call("GET", Node::path("/audit?limit=500"), n.admin()));
  for (const auto& r : page.at("records").as_array()) out.push_back(r.as_object());
  return out;
}

// libvirtd answers again.
void libvirt_back(Node& n) {
  std::lock_guard lock{n.hv_->mu};
  n.hv_->before_call = {};
  n.hv_->unavailable = false;
}

std::string str(const json::value& v) {
  return v.is_string() ? std::string(v.as_string()) : std::string();
}

std::size_t records(const std::vector<json::object>& a, const std::string& action, const std::string& rid) {
  return static_cast<std::size_t>(std::count_if(a.begin(), a.end(), [&](const json::object& r) {
    return str(r.at("action")) == action && str(r.at("reservationId")) == rid;
  }));
}

}  // namespace

TEST_CASE(
    "faults: libvirt gone in the middle of a list: 503 hypervisor-unavailable and the reason logged, then "
    "served again") {
  CapturedLog log;
  Node n;
  n.log_at("info");
  n.hv_->domains = {spot_vm("s1", "uuid-s1", "0000:41:00.0")};
  n.start();
  const auto rid = n.create(U2);
  auto first = n.call("GET", Node::path("/workloads"), n.admin());
  REQUIRE(first.status == 200);

  // libvirtd dies once the list call has started: the call fails as libvirt's adapter fails it.
  std::atomic<int> died = 0;
  {
    std::lock_guard lock{n.hv_->mu};
    n.hv_->before_call = [&](const std::string& call) {
      if (call == "list" && died++ == 0) n.hv_->unavailable = true;
    };
  }
  n.hv_->emit();  // a lifecycle event: the kept list is dropped, the next request lists
  auto gone = n.call("GET", Node::path("/workloads"), n.admin());
  CHECK_MESSAGE(gone.status == 503, gone.body);
  CHECK(gone.body.find("hypervisor-unavailable") != std::string::npos);
  CHECK(gone.body.find("fake hypervisor unavailable") != std::string::npos);
  CHECK(died.load() >= 1);
  CHECK(log.wait_for("hypervisor: fake hypervisor unavailable", kPatience));
  // What needs no hypervisor is served meanwhile; what was acknowledged is there.
  CHECK(n.call("GET", "/healthz", "").status == 200);
  CHECK(n.call("GET", Node::path("/reservations/" + rid), n.admin()).status == 200);

  libvirt_back(n);
  auto back = n.call("GET", Node::path("/workloads"), n.admin());
  CHECK_MESSAGE(back.status == 200, back.body);
  CHECK(back.body.find("vm-s1") != std::string::npos);
}

TEST_CASE(
    "faults: libvirt gone in the middle of a termination: 503, only the write-ahead record, finished by the "
    "agent once libvirt is back") {
  CapturedLog log;
  Node n;
  n.log_at("info");
  n.hv_->domains = {spot_vm("s1", "uuid-s1", "0000:41:00.0")};
  n.hv_->ignore_shutdown.insert("uuid-s1");  // the guest ignores ACPI: after the grace, a destroy
  n.start();
  {
    std::lock_guard lock{n.hv_->mu};
    n.hv_->before_call = [&](const std::string& call) {
      if (call == "destroy") n.hv_->unavailable = true;  // libvirtd dies as the grace ends
    };
  }
  auto term = n.call("POST", Node::path("/terminate-spot"), n.token(kOwner), R"({"gracePeriodSeconds":1})");
  CHECK_MESSAGE(term.status == 503, term.body);
  CHECK(term.body.find("hypervisor-unavailable") != std::string::npos);
  CHECK(
      log.wait_for("VM=vm-s1 DOMAIN=uuid-s1 termination cut short, left pending for the agent to finish: "
                   "fake hypervisor unavailable",
                   kPatience));
  CHECK(n.vm_state("uuid-s1") == "running");  // nothing recorded as terminated that was not
  auto terminations = [&] {
    std::vector<std::string> results;
    for (const auto& r : audit(n)) {
      if (str(r.at("action")) == "workload.terminate") results.push_back(str(r.at("result")));
    }
    return results;
  };
  CHECK(terminations() == std::vector<std::string>{"pending"});
  CHECK(n.call("GET", "/healthz", "").status == 200);

  // libvirtd is back: the agent finishes the termination as itself, without a request.
  libvirt_back(n);
  CHECK(eventually([&] { return n.vm_state("uuid-s1") == "shutoff"; }, kPatience));
  CHECK(log.wait_for("VM=vm-s1 DOMAIN=uuid-s1 terminated for capacity reclaim", kPatience));
  CHECK(eventually([&] { return terminations().size() >= 2; }, kPatience));
  CHECK(terminations() == std::vector<std::string>{"pending", "ok"});
  const auto last = audit(n).back();
  CHECK(str(last.at("actor").at("sub")) == "gpunode-agent");
}

TEST_CASE(
    "faults: the wall clock steps back an hour and forward a day: every term fires once, none twice, none "
    "missed") {
  CapturedLog log;
  auto offset = std::make_shared<std::atomic<std::int64_t>>(0);  // seconds added to the system clock
  Node n;
  n.clock_ = [offset] { return std::chrono::system_clock::now() + std::chrono::seconds(offset->load()); };
  n.log_at("info");
  n.start();
  const auto t = std::chrono::time_point_cast<std::chrono::seconds>(n.clock_());
  const auto r0 = n.create(U1, iso(t + 2s), iso(t + 3s));    // passes before the step back
  const auto r1 = n.create(U1, iso(t + 6s), iso(t + 7s));    // due in the hour the clock goes back
  const auto r2 = n.create(U2, iso(t + 2h), iso(t + 3h));    // within the day the clock jumps
  const auto r3 = n.create(U2, iso(t + 48h), iso(t + 49h));  // after it
  auto state = [&](const std::string& id) {
    return str(Node::body(n.call("GET", Node::path("/reservations/" + id), n.admin())).at("state"));
  };
  REQUIRE(log.wait_for("RESERVATION=" + r0 + " expired", 6s));
  CHECK(state(r0) == "ended");

  // Back an hour: r0 stays ended (it does not start again), r1 is not due for another hour.
  offset->store(-3600);
  std::this_thread::sleep_until(std::chrono::system_clock::time_point(t + 8s) + 500ms);
  CHECK(state(r0) == "ended");
  CHECK(state(r1) == "scheduled");
  CHECK(log.count("RESERVATION=" + r0 + " activated") == 1);
  CHECK(log.count("RESERVATION=" + r0 + " expired") == 1);
  CHECK(log.count("RESERVATION=" + r1 + " activated") == 0);
  const auto made_back =
      n.create(U2, iso(n.clock_() + 5h), iso(n.clock_() + 6h));  // and changes are taken meanwhile

  // Forward a day: r1 and r2 both start and end, once each, in time order; r3 waits.
  offset->store(86400);
  CHECK(log.wait_for("RESERVATION=" + r2 + " expired", 3s));
  CHECK(state(r1) == "ended");
  CHECK(state(r2) == "ended");
  CHECK(state(r3) == "scheduled");

  // And back to the true time: nothing fires again. A request applies the terms due before it is
  // answered, as the timer does: what fires at the true time has fired once this one is answered.
  offset->store(0);
  REQUIRE(n.call("GET", Node::path("/state"), n.admin()).status == 200);
  auto a = audit(n);
  for (const auto& id : {r0, r1, r2}) {
    CAPTURE(id);
    CHECK(records(a, "reservation.activate", id) == 1);
    CHECK(records(a, "reservation.expire", id) == 1);
    CHECK(log.count("RESERVATION=" + id + " activated") == 1);
    CHECK(log.count("RESERVATION=" + id + " expired") == 1);
    auto x = Node::body(n.call("GET", Node::path("/reservations/" + id), n.admin()));
    CHECK(x.at("endedAt") == x.at("endsAt"));  // an expired term ends at its endsAt, whenever applied
    CHECK(x.at("endReason") == "term-expired");
  }
  CHECK(records(a, "reservation.activate", r3) == 0);
  CHECK(state(r3) == "scheduled");
  CHECK(state(made_back) == "ended");  // its hours were inside the day the clock jumped over
  // In time order: r1's records before r2's, each activation before its expiry.
  std::vector<std::string> order;
  for (const auto& r : a) {
    const auto act = str(r.at("action"));
    if (act == "reservation.activate" || act == "reservation.expire")
      order.push_back(act.substr(12) + " " + str(r.at("reservationId")));
  }
  CHECK(order == std::vector<std::string>{"activate " + r0, "expire " + r0, "activate " + r1, "expire " + r1,
                                          "activate " + r2, "expire " + r2, "activate " + made_back,
                                          "expire " + made_back});
  CHECK(n.call("GET", "/healthz", "").status == 200);
}

TEST_CASE(
    "faults: the system clock set under the daemon: the kernel tells it, it looks at the terms again, each "
    "still fires once at its instant" *
    doctest::test_suite("root")) {
  CapturedLog log;
  Node n;
  n.log_at("info");
  n.start();
  const auto t = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
  const auto id = n.create(U1, iso(t + 2s), iso(t + 3s));
  std::this_thread::sleep_for(300ms);
  // Set to what it reads (a step of microseconds): the kernel cancels the daemon's CANCEL_ON_SET
  // timer as for any step. Needs CAP_SYS_TIME.
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  REQUIRE_MESSAGE(::clock_settime(CLOCK_REALTIME, &now) == 0,
                  "clock_settime as root: " << std::strerror(errno));
  CHECK(log.wait_for("the system clock was set: looking at the reservations' terms again", kPatience));
  CHECK(eventually([&] { return log.has("RESERVATION=" + id + " expired"); }, kPatience));
  std::this_thread::sleep_for(500ms);
  const auto a = audit(n);
  CHECK(records(a, "reservation.activate", id) == 1);
  CHECK(records(a, "reservation.expire", id) == 1);
  for (const auto& r : a) {
    if (str(r.at("reservationId")) != id) continue;
    if (str(r.at("action")) == "reservation.activate") CHECK(str(r.at("at")) == iso(t + 2s));
    if (str(r.at("action")) == "reservation.expire") CHECK(str(r.at("at")) == iso(t + 3s));
  }
}

TEST_CASE(
    "faults: a slow log does not delay an acknowledgement: a create's log line is written after its answer "
    "has gone") {
  CapturedLog log;
  Node n;
  n.log_at("info");
  n.start();
  json::object b{{"unitIds", json::array{json::value(U1)}},
                 {"audienceOrgIds", json::array{"org-a"}},
                 {"endsAt", iso(std::chrono::system_clock::now() + 24h)}};
  // The answer's callback runs on the state thread, inside the request's dispatch: what the log
  // holds at that moment is what was written before the answer.
  auto promise = std::make_shared<std::promise<std::pair<ApiResponse, bool>>>();
  auto answered = promise->get_future();
  n.daemon_->submit(n.request("POST", Node::path("/reservations"), n.admin(), json::serialize(b)),
                    [&log, promise](ApiResponse r) {
                      std::fflush(stderr);
                      const bool logged_before = log.has(" created by ");
                      promise->set_value({std::move(r), logged_before});
                    });
  REQUIRE(answered.wait_for(kPatience) == std::future_status::ready);
  auto [r, logged_before] = answered.get();
  REQUIRE_MESSAGE(r.status == 201, r.body);
  CHECK_FALSE(logged_before);
  const std::string id(Node::body(r).at("id").as_string());
  CHECK(log.wait_for("RESERVATION=" + id + " created by", kPatience));
}
