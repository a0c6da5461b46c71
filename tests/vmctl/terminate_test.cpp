// The termination rule over the fake hypervisor.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>

#include "gpunode/vmctl/fake_hypervisor.hpp"

using namespace gpunode::vmctl;
using gpunode::error::Errc;
using namespace std::chrono_literals;

namespace {

Domain make(std::string uuid, std::optional<WorkloadLabel> label, std::string state = "running") {
  return Domain{std::move(uuid), "vm", std::move(state), {"0000:41:00.0"}, std::move(label), std::nullopt};
}
const WorkloadLabel spot{"vm-1", "org-b", Tier::spot};
const TerminationRecord record{"capacity-reclaim", "2027-01-31T00:00:00Z", "org-a", "aud_7"};

struct SleepLog {
  std::chrono::milliseconds total{0};
  int calls = 0;
  auto fn() {
    return [this](std::chrono::milliseconds d) {
      total += d;
      ++calls;
    };
  }
};

}  // namespace

TEST_CASE("terminate_spot: grace 0 destroys at once, after the record") {
  FakeHypervisor hv{{make("u1", spot)}};
  SleepLog sleeper;
  auto r = terminate_spot(hv, hv.domains[0], record, 0s, sleeper.fn());
  REQUIRE(r.has_value());
  CHECK(r->terminated);
  CHECK(r->detail == "destroyed");
  CHECK(hv.domains[0].state == "shutoff");
  CHECK(hv.domains[0].termination == record);
  CHECK(hv.calls == std::vector<std::string>{"record u1", "state u1", "destroy u1", "state u1"});
  CHECK(sleeper.calls == 0);
}

TEST_CASE("terminate_spot: a guest that shuts down is not destroyed") {
  FakeHypervisor hv{{make("u1", spot)}};
  SleepLog sleeper;
  auto r = terminate_spot(hv, hv.domains[0], record, 30s, sleeper.fn());
  REQUIRE(r.has_value());
  CHECK(r->terminated);
  CHECK(r->detail == "shut down gracefully");
  CHECK(hv.calls == std::vector<std::string>{"record u1", "state u1", "shutdown u1", "state u1"});
  CHECK(sleeper.total == 0ms);
}

TEST_CASE("terminate_spot: a domain that ignores shutdown is destroyed after the grace") {
  FakeHypervisor hv{{make("u1", spot)}};
  hv.ignore_shutdown.insert("u1");
  SleepLog sleeper;
  auto r = terminate_spot(hv, hv.domains[0], record, 3s, sleeper.fn());
  REQUIRE(r.has_value());
  CHECK(r->terminated);
  CHECK(r->detail == "destroyed after the grace period");
  CHECK(sleeper.total == 3000ms);  // the whole grace, no more
  CHECK(hv.calls.back() == "state u1");
  CHECK(hv.calls[hv.calls.size() - 2] == "destroy u1");
  CHECK(hv.domains[0].state == "shutoff");
}

TEST_CASE("terminate_spot: never touches a domain that is not spot") {
  const std::vector<std::optional<WorkloadLabel>> labels{std::nullopt,
                                                         WorkloadLabel{"vm-2", "org-c", Tier::on_demand},
                                                         WorkloadLabel{"vm-3", "org-a", Tier::reserved}};
  for (const auto& label : labels) {
    FakeHypervisor hv{{make("u1", label)}};
    auto r = terminate_spot(hv, hv.domains[0], record, 0s, [](auto) {});
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == Errc::invalid);
    CHECK(r.error().detail == "not spot");
    CHECK(hv.calls.empty());
    CHECK(hv.domains[0].state == "running");
    CHECK_FALSE(hv.domains[0].termination.has_value());
  }
}

TEST_CASE("terminate_spot: unavailable before the record: nothing stopped, error") {
  FakeHypervisor hv{{make("u1", spot)}};
  hv.unavailable = true;
  auto r = terminate_spot(hv, hv.domains[0], record, 0s, [](auto) {});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::unavailable);
  CHECK(hv.calls == std::vector<std::string>{"record u1"});
  CHECK(hv.domains[0].state == "running");
}

TEST_CASE("terminate_spot: unavailable mid-terminate is never reported terminated") {
  // The hypervisor goes away at each later step in turn.
  for (const std::string step : {"state", "shutdown", "destroy"}) {
    CAPTURE(step);
    FakeHypervisor hv{{make("u1", spot)}};
    hv.ignore_shutdown.insert("u1");
    hv.before_call = [&hv, step, seen = 0](const std::string& call) mutable {
      if (call == step && ++seen == (step == "state" ? 2 : 1)) hv.unavailable = true;
    };
    auto r = terminate_spot(hv, hv.domains[0], record, 1s, [](auto) {});
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == Errc::unavailable);
    CHECK(hv.domains[0].termination == record);  // the record was written first
  }
  // ... and also when the destroy went through but its confirmation cannot be read.
  FakeHypervisor hv{{make("u1", spot)}};
  hv.before_call = [&hv, seen = 0](const std::string& call) mutable {
    if (call == "state" && ++seen == 2) hv.unavailable = true;
  };
  auto r = terminate_spot(hv, hv.domains[0], record, 0s, [](auto) {});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::unavailable);
}

TEST_CASE("terminate_spot: a destroy that does not stop the domain is not terminated") {
  // A destroy that libvirt refuses (e.g. a process stuck in D state) leaves the domain running.
  struct Stubborn final : FakeHypervisor {
    std::expected<void, VmError> destroy(const std::string&) override {
      return std::unexpected(VmError{Errc::io, "Failed to terminate process 1234 with SIGKILL"});
    }
  };
  Stubborn stubborn;
  stubborn.domains.push_back(make("u1", spot));
  auto r = terminate_spot(stubborn, stubborn.domains[0], record, 0s, [](auto) {});
  REQUIRE(r.has_value());
  CHECK_FALSE(r->terminated);
  CHECK(r->detail == "destroy failed: Failed to terminate process 1234 with SIGKILL");
  CHECK(stubborn.domains[0].state == "running");
}

TEST_CASE("terminate_spot: already stopped or vanished counts as gone") {
  FakeHypervisor hv{{make("u1", spot, "shutoff")}};
  auto r = terminate_spot(hv, hv.domains[0], record, 0s, [](auto) {});
  REQUIRE(r.has_value());
  CHECK(r->terminated);
  CHECK(r->detail == "already stopped");

  // A transient domain disappears when destroyed.
  struct Transient final : FakeHypervisor {
    std::expected<void, VmError> destroy(const std::string& uuid) override {
      std::erase_if(domains, [&](const Domain& d) { return d.uuid == uuid; });
      return {};
    }
  };
  Transient t;
  t.domains.push_back(make("u2", spot));
  const Domain copy = t.domains[0];
  auto r2 = terminate_spot(t, copy, record, 0s, [](auto) {});
  REQUIRE(r2.has_value());
  CHECK(r2->terminated);
}

TEST_CASE("terminate_spot: a record that cannot be written stops nothing") {
  FakeHypervisor hv{{make("u1", spot)}};
  Domain ghost = make("nope", spot);
  auto r = terminate_spot(hv, ghost, record, 0s, [](auto) {});
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::not_found);
  CHECK(hv.calls == std::vector<std::string>{"record nope"});
}

TEST_CASE("terminate_spot_all: a batch shares one grace period, records come before any stop") {
  FakeHypervisor hv{{make("a", spot), make("b", spot), make("c", spot),
                     make("od", WorkloadLabel{"vm-2", "org-b", Tier::on_demand})}};
  hv.ignore_shutdown = {"b", "c"};
  std::vector<TerminationJob> jobs;
  for (const auto& d : hv.domains) jobs.push_back(TerminationJob{d, record, 10s});
  std::chrono::milliseconds slept{0};
  auto out = terminate_spot_all(hv, jobs, [&](std::chrono::milliseconds d) {
    slept += d;
    return true;
  });
  REQUIRE(out.size() == 4);
  CHECK(out[0].uuid == "a");
  REQUIRE(out[0].result.has_value());
  CHECK(out[0].result->terminated);
  CHECK(out[0].result->detail == "shut down gracefully");
  REQUIRE(out[1].result.has_value());
  CHECK(out[1].result->terminated);
  CHECK(out[1].result->detail == "destroyed after the grace period");
  CHECK(out[2].result->terminated);
  REQUIRE_FALSE(out[3].result.has_value());
  CHECK(out[3].result.error().detail == "not spot");
  CHECK(hv.domains[3].state == "running");
  CHECK_FALSE(hv.domains[3].termination.has_value());
  CHECK(slept == 10s);  // one grace for the batch, not one per domain
  // Every record was written before the first shutdown.
  const auto first_stop = std::find_if(hv.calls.begin(), hv.calls.end(),
                                       [](const std::string& c) { return c.starts_with("shutdown"); });
  CHECK(std::count_if(hv.calls.begin(), first_stop,
                      [](const std::string& c) { return c.starts_with("record"); }) == 3);
}

TEST_CASE("terminate_spot_all: a stop during the grace decides nothing") {
  FakeHypervisor hv{{make("a", spot)}};
  hv.ignore_shutdown = {"a"};
  int sleeps = 0;
  auto out = terminate_spot_all(hv, {TerminationJob{hv.domains[0], record, 30s}},
                                [&](std::chrono::milliseconds) { return ++sleeps < 3; });
  REQUIRE_FALSE(out[0].result.has_value());
  CHECK(out[0].result.error().code == Errc::unavailable);
  CHECK(hv.domains[0].state == "running");
  CHECK(hv.domains[0].termination == record);  // the record stays: the agent finishes it after a restart
}

TEST_CASE("terminate_spot_all: a domain that vanished before the record is not reported terminated") {
  FakeHypervisor hv{{make("a", spot)}};
  auto job = TerminationJob{hv.domains[0], record, 0s};
  hv.domains.clear();
  auto out = terminate_spot_all(hv, {job}, [](auto) { return true; });
  REQUIRE_FALSE(out[0].result.has_value());
  CHECK(out[0].result.error().code == Errc::not_found);
}
