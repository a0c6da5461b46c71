// The Driver's one answer (driver.hpp): a request it lets go unanswered (its list or its batch
// dropped with an executor that never ran them, a parked poll dropped with the driver) is answered
// 500 and logged naming it, once; at stop a parked poll is answered as its wait had ended. A change's
// snapshot is published after its answer, and a read in between is left to the state thread.
// Over tests/service's Lab (a node with three units, the fake hypervisor, a clock of its own).
#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lab.hpp"

using namespace service_test;  // NOLINT(google-build-using-namespace): the Lab and its helpers

namespace {

using gpunode::daemon::Driver;

// A Driver over the Lab's node and state thread, whose lists or terminations go to `side`, an
// io_context that no thread runs: what is posted there is dropped when the test destroys it.
struct Dropping {
  Lab lab;
  std::optional<boost::asio::io_context> side{std::in_place};
  std::vector<std::string> logs;
  std::vector<ApiResponse> answers;
  std::unique_ptr<Driver> driver;

  enum class Drop { lists, terminations, none };
  explicit Dropping(Drop where) {
    Driver::Options o;
    o.lists = where == Drop::lists ? side->get_executor() : lab.io_.get_executor();
    o.terminations = where == Drop::terminations ? side->get_executor() : lab.io_.get_executor();
    o.sleeper = [](std::chrono::milliseconds) { return true; };
    driver = std::make_unique<Driver>(lab.io_, *lab.service_, lab.hypervisor_, std::move(o),
                                      [this](LogLevel, const std::string& line) { logs.push_back(line); });
  }
  ~Dropping() {
    if (!driver) return;
    driver->stop();
    lab.drain();
  }
  Dropping(const Dropping&) = delete;
  Dropping& operator=(const Dropping&) = delete;

  void submit(ApiRequest q) {
    driver->submit(std::move(q), [this](ApiResponse r) { answers.push_back(std::move(r)); });
    lab.drain();
  }
  bool logged(const std::string& line) const {
    return std::find(logs.begin(), logs.end(), line) != logs.end();
  }
};

std::string dropped_line(const std::string& method, const std::string& target) {
  return "REQUEST=req-test " + method + " " + target +
         ": internal: the request was dropped unanswered; answered 500";
}

}  // namespace

TEST_CASE("driver: a request whose list is dropped with its executor is answered 500, once") {
  Dropping d(Dropping::Drop::lists);
  d.submit(Lab::request("GET", Lab::path("/workloads"), "admin-socket"));
  CHECK(d.answers.empty());  // its list waits in `side`
  d.side.reset();
  REQUIRE(d.answers.size() == 1);
  CHECK(d.answers[0].status == 500);
  CHECK(code_of(d.answers[0]) == "internal");
  CHECK(d.logged(dropped_line("GET", Lab::path("/workloads"))));
  d.lab.drain();
  CHECK(d.answers.size() == 1);
}

TEST_CASE("driver: a terminate-spot whose batch is dropped with its executor is answered 500") {
  Dropping d(Dropping::Drop::terminations);
  gpunode::vmctl::Domain spot;
  spot.name = "spot-a";
  spot.uuid = "uuid-a";
  spot.state = "running";
  spot.pci_addresses = {"0000:41:00.0"};
  spot.label = gpunode::vmctl::WorkloadLabel{"vm-a", "org-b", gpunode::vmctl::Tier::spot};
  d.lab.hypervisor_->domains = {spot};
  d.submit(Lab::request("POST", Lab::path("/terminate-spot"), "admin-socket", "{}"));
  CHECK(d.answers.empty());  // listed on the state thread, its batch waits in `side`
  d.side.reset();
  REQUIRE(d.answers.size() == 1);
  CHECK(d.answers[0].status == 500);
  CHECK(d.logged(dropped_line("POST", Lab::path("/terminate-spot"))));
  CHECK(d.lab.hypervisor_->domains.front().state == "running");  // nothing was done to it
}

TEST_CASE("driver: a parked poll is answered at stop (304), and 500 when the driver goes without a stop") {
  const auto poll = [](const Dropping& d) {
    return Lab::request("GET", Lab::path(fmt::format("/state?after={}&wait=60s", d.lab.service_->revision())),
                        "admin-socket");
  };
  {
    Dropping d(Dropping::Drop::none);
    d.submit(poll(d));
    CHECK(d.answers.empty());
    CHECK(d.driver->parked() == 1);
    d.driver->stop();
    d.lab.drain();
    REQUIRE(d.answers.size() == 1);
    CHECK(d.answers[0].status == 304);
  }
  Dropping d(Dropping::Drop::none);
  d.submit(poll(d));
  CHECK(d.driver->parked() == 1);
  // Its timer's cancelled handler stays queued in the Lab's io_context, which is not run again.
  d.driver.reset();
  REQUIRE(d.answers.size() == 1);
  CHECK(d.answers[0].status == 500);
  CHECK(d.logged(dropped_line("GET", Lab::path("/state"))));
}

TEST_CASE(
    "driver: a change is published after its answer, and a read before that is answered by the state "
    "thread") {
  Dropping d(Dropping::Drop::none);
  const auto admin = d.lab.token("org-platform", {"platform-admin"});
  const auto units = Lab::request("GET", Lab::path("/units"), admin);  // shows each unit's reservations
  const auto at = d.lab.now_;
  d.submit(units);  // answered by the state thread, which publishes after it
  REQUIRE(d.answers.size() == 1);
  CHECK(d.answers[0].status == 200);
  REQUIRE(d.lab.service_->read(units, at));  // current: the network thread answers it
  const std::string body =
      R"({"unitIds":["u-0000-42-00-0"],"audienceOrgIds":["org-a"],"startsAt":"2098-01-01T00:00:00Z",)"
      R"("endsAt":"2099-01-01T00:00:00Z"})";
  std::optional<std::optional<ApiResponse>> read_at_answer;
  std::optional<ApiResponse> created;
  d.driver->submit(Lab::request("POST", Lab::path("/reservations"), admin, body), [&](ApiResponse r) {
    // The answer is on its way and the snapshot not yet published: a read finds it behind and is
    // left to the state thread (which holds the change and publishes before anything else).
    read_at_answer = d.lab.service_->read(units, at);
    created = std::move(r);
  });
  d.lab.drain();
  REQUIRE(created);
  REQUIRE(created->status == 201);
  const auto id = std::string(Lab::body(*created).at("id").as_string());
  REQUIRE(read_at_answer);
  CHECK_FALSE(*read_at_answer);
  // Published once answered: the network thread's read shows it.
  const auto after = d.lab.service_->read(units, at);
  REQUIRE(after);
  CHECK(after->status == 200);
  CHECK(after->body.find(id) != std::string::npos);
}
