// The libvirt adapter against libvirt's own test driver (test:///FILE.xml), which keeps a fake
// host in memory per connection: every make_libvirt() below starts from the fixture again.
#include <doctest/doctest.h>
#include <libvirt/virterror.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gpunode/vmctl/vmctl.hpp"

using namespace gpunode::vmctl;
using gpunode::error::Errc;
using gpunode::error::Native;
using namespace std::chrono_literals;

namespace {

const std::string fixture = std::string{GPUNODE_VMCTL_DATA} + "/node.xml";
std::string fixture_uri() {
  return "test://" + fixture;
}

const TerminationRecord record{"capacity-reclaim", "2027-01-31T00:00:00Z", "org-a", "aud_9"};

std::map<std::string, Domain> by_name(Hypervisor& hv) {
  auto domains = hv.list();
  REQUIRE(domains.has_value());
  std::map<std::string, Domain> out;
  for (auto& d : *domains) out.emplace(d.name, d);
  return out;
}

Domain named(Hypervisor& hv, const std::string& name) {
  auto all = by_name(hv);
  auto it = all.find(name);
  REQUIRE(it != all.end());
  return it->second;
}

void no_sleep(std::chrono::milliseconds) {}

// (std::expected == inside doctest's CHECK trips GCC 12, so these unwrap first.)
std::string state_of(Hypervisor& hv, const std::string& uuid) {
  auto s = hv.state(uuid);
  REQUIRE(s.has_value());
  return *s;
}
std::optional<TerminationRecord> term(Hypervisor& hv, const std::string& uuid, Definition which) {
  auto t = hv.termination(uuid, which);
  REQUIRE(t.has_value());
  return *t;
}

}  // namespace

TEST_CASE("libvirt test driver: list gives every domain exactly") {
  auto hv = make_libvirt(fixture_uri());
  CHECK_FALSE(hv->connected());  // lazily
  auto all = by_name(*hv);
  CHECK(hv->connected());

  struct Want {
    std::string uuid, state;
    std::vector<std::string> pci;
    std::optional<WorkloadLabel> label;
  };
  const std::map<std::string, Want> want{
      {"res-a",
       {"a0000000-0000-4000-8000-000000000001",
        "running",
        {"0000:41:00.0", "0000:41:00.1"},
        WorkloadLabel{"vm-a1", "org-a", Tier::reserved}}},
      {"spot-b-pair",
       {"b0000000-0000-4000-8000-000000000001",
        "running",
        {"0000:a3:00.0", "0000:a4:00.0"},
        WorkloadLabel{"vm-b1", "org-b", Tier::spot}}},
      {"spot-b-two",
       {"b0000000-0000-4000-8000-000000000002",
        "running",
        {"0000:81:00.0", "0000:c1:00.0"},
        WorkloadLabel{"vm-b2", "org-b", Tier::spot}}},
      {"od-c",
       {"c0000000-0000-4000-8000-000000000001",
        "running",
        {"0000:43:00.0"},
        WorkloadLabel{"vm-c1", "org-c", Tier::on_demand}}},
      {"bare", {"d0000000-0000-4000-8000-000000000001", "running", {"0000:61:00.0"}, std::nullopt}},
      {"malformed", {"d0000000-0000-4000-8000-000000000002", "running", {"0000:62:00.0"}, std::nullopt}},
      {"spot-d-paused",
       {"e0000000-0000-4000-8000-000000000001",
        "paused",
        {"0000:e1:00.0"},
        WorkloadLabel{"vm-d1", "org-d", Tier::spot}}},
      {"spot-d-off",
       {"e0000000-0000-4000-8000-000000000002",
        "shutoff",
        {"0000:43:00.0"},
        WorkloadLabel{"vm-d2", "org-d", Tier::spot}}},
  };
  REQUIRE(all.size() == want.size());
  for (const auto& [name, w] : want) {
    CAPTURE(name);
    REQUIRE(all.contains(name));
    const Domain& d = all.at(name);
    CHECK(d.uuid == w.uuid);
    CHECK(d.state == w.state);
    CHECK(d.pci_addresses == w.pci);
    CHECK(d.label == w.label);
    CHECK_FALSE(d.termination.has_value());
    CHECK(d.active() == (name != "spot-d-off"));
  }
}

TEST_CASE("libvirt test driver: terminate with grace 0 destroys and the record stays") {
  auto hv = make_libvirt(fixture_uri());
  const Domain d = named(*hv, "spot-b-pair");
  auto r = terminate_spot(*hv, d, record, 0s, no_sleep);
  REQUIRE(r.has_value());
  CHECK(r->terminated);
  CHECK(r->detail == "destroyed");
  CHECK(state_of(*hv, d.uuid) == std::string{"shutoff"});

  // The domain is inactive now: its current definition is the persistent one, which kept the record.
  const Domain after = named(*hv, "spot-b-pair");
  CHECK(after.state == "shutoff");
  CHECK(after.termination == record);
  CHECK(after.label == d.label);  // the workload element is untouched
  CHECK(term(*hv, d.uuid, Definition::persistent) == std::optional{record});
  // The live definition is gone with the run: libvirt refuses to read it.
  auto live = hv->termination(d.uuid, Definition::live);
  REQUIRE_FALSE(live.has_value());
  CHECK(live.error().code == Errc::invalid);
  CHECK(live.error().native == VIR_ERR_OPERATION_INVALID);

  // Everything else is as it was.
  auto all = by_name(*hv);
  CHECK(all.at("spot-b-two").state == "running");
  CHECK(all.at("res-a").state == "running");
}

TEST_CASE("libvirt test driver: the record lands in the live and the persistent definition") {
  auto hv = make_libvirt(fixture_uri());
  const Domain d = named(*hv, "spot-b-two");
  CHECK(term(*hv, d.uuid, Definition::live) == std::optional<TerminationRecord>{});
  REQUIRE(hv->record_termination(d.uuid, record).has_value());
  CHECK(term(*hv, d.uuid, Definition::live) == std::optional{record});
  CHECK(term(*hv, d.uuid, Definition::persistent) == std::optional{record});
  CHECK(named(*hv, "spot-b-two").termination == record);
  CHECK(state_of(*hv, d.uuid) == std::string{"running"});

  // A second record replaces the first (one element per namespace).
  const TerminationRecord again{"capacity-reclaim", "2027-02-01T00:00:00Z", "local:0", "aud_10"};
  REQUIRE(hv->record_termination(d.uuid, again).has_value());
  CHECK(term(*hv, d.uuid, Definition::persistent) == std::optional{again});

  // An inactive domain gets it in its persistent definition only.
  const Domain off = named(*hv, "spot-d-off");
  REQUIRE(hv->record_termination(off.uuid, record).has_value());
  CHECK(term(*hv, off.uuid, Definition::persistent) == std::optional{record});
}

TEST_CASE("libvirt test driver: graceful shutdown within the grace") {
  auto hv = make_libvirt(fixture_uri());
  const Domain d = named(*hv, "spot-b-two");
  int sleeps = 0;
  auto r = terminate_spot(*hv, d, record, 30s, [&](std::chrono::milliseconds) { ++sleeps; });
  REQUIRE(r.has_value());
  CHECK(r->terminated);
  CHECK(r->detail == "shut down gracefully");  // the test driver shuts down at once
  CHECK(sleeps == 0);
  const Domain after = named(*hv, "spot-b-two");
  CHECK(after.state == "shutoff");
  CHECK(after.termination == record);

  // A paused spot domain is terminated too.
  const Domain paused = named(*hv, "spot-d-paused");
  auto p = terminate_spot(*hv, paused, record, 5s, no_sleep);
  REQUIRE(p.has_value());
  CHECK(p->terminated);
  CHECK(state_of(*hv, paused.uuid) == std::string{"shutoff"});
}

TEST_CASE("libvirt test driver: a domain that is not spot is never touched") {
  auto hv = make_libvirt(fixture_uri());
  for (const char* name : {"res-a", "od-c", "bare", "malformed"}) {
    CAPTURE(name);
    const Domain d = named(*hv, name);
    auto r = terminate_spot(*hv, d, record, 0s, no_sleep);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().detail == "not spot");
    const Domain after = named(*hv, name);
    CHECK(after.state == "running");
    CHECK_FALSE(after.termination.has_value());
    CHECK(term(*hv, d.uuid, Definition::persistent) == std::optional<TerminationRecord>{});
  }
}

TEST_CASE("libvirt test driver: unknown domains are not_found") {
  auto hv = make_libvirt(fixture_uri());
  const std::string ghost = "f0000000-0000-4000-8000-00000000000f";
  auto s = hv->state(ghost);
  REQUIRE_FALSE(s.has_value());
  CHECK(s.error().code == Errc::not_found);
  // libvirt's own code, kept.
  CHECK(s.error().native == VIR_ERR_NO_DOMAIN);
  CHECK(s.error().origin == Native::libvirt);
  CAPTURE(s.error().detail);
  CHECK(s.error().detail.find("Domain not found") != std::string::npos);
  CHECK(s.error().detail.find(ghost) != std::string::npos);
  CHECK(s.error().to_string() == "not found: " + s.error().detail);  // no code name for libvirt's
  CHECK(hv->destroy(ghost).error().code == Errc::not_found);
  CHECK(hv->record_termination(ghost, record).error().code == Errc::not_found);
  CHECK(hv->connected());  // a missing domain does not drop the connection
  // Destroying a domain that is not running is refused by libvirt: invalid (OPERATION_INVALID),
  // neither unavailable nor not_found, with its message.
  const Domain off = named(*hv, "spot-d-off");
  auto d = hv->destroy(off.uuid);
  REQUIRE_FALSE(d.has_value());
  CHECK(d.error().code == Errc::invalid);
  CHECK(d.error().native == VIR_ERR_OPERATION_INVALID);
  CHECK(d.error().origin == Native::libvirt);
  CHECK(d.error().detail.find("not running") != std::string::npos);
  CHECK(hv->connected());
}

TEST_CASE("libvirt: a URI that cannot be opened is unavailable; the next call reconnects") {
  char pattern[] = "/tmp/gpunode-vmctl-XXXXXX";
  REQUIRE(mkdtemp(pattern) != nullptr);
  const std::filesystem::path dir{pattern};
  const auto node = dir / "node.xml";
  auto hv = make_libvirt("test://" + node.string());

  auto first = hv->list();
  REQUIRE_FALSE(first.has_value());
  CHECK(first.error().code == Errc::unavailable);
  // Whatever libvirt's code for it (kept), a connection that cannot be opened is unavailable.
  CHECK(first.error().origin == Native::libvirt);
  CHECK(first.error().native != 0);
  CAPTURE(first.error().native);
  CAPTURE(first.error().detail);
  CHECK(first.error().detail.find(node.string()) != std::string::npos);  // libvirt's own words name the file
  CHECK(first.error().detail.find("failed to parse xml document") != std::string::npos);
  CHECK_FALSE(hv->connected());
  CHECK(hv->state("a0000000-0000-4000-8000-000000000001").error().code == Errc::unavailable);

  std::filesystem::copy_file(fixture, node);
  auto second = hv->list();
  REQUIRE(second.has_value());
  CHECK(second->size() == 8);
  CHECK(hv->connected());
  CHECK(state_of(*hv, "a0000000-0000-4000-8000-000000000001") == std::string{"running"});
  std::filesystem::remove_all(dir);
}

TEST_CASE("libvirt: a driver that does not exist is unavailable") {
  auto hv = make_libvirt("gpunode-nonexistent+unix:///nowhere?socket=/nonexistent/sock");
  auto r = hv->list();
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::unavailable);
  CHECK_FALSE(r.error().detail.empty());
  CHECK(r.error().origin == Native::libvirt);
  CHECK(r.error().native == VIR_ERR_SYSTEM_ERROR);  // "Failed to connect socket to '/nonexistent/sock'"
}

TEST_CASE("libvirt test driver: a watcher hears a domain stop (lifecycle events on libvirt's event loop)") {
  auto hv = make_libvirt(fixture_uri());
  std::atomic<int> heard{0};
  hv->watch([&heard] { ++heard; });
  auto spot = named(*hv, "spot-b-pair");
  REQUIRE(spot.active());
  const int before = heard.load();
  REQUIRE(hv->destroy(spot.uuid).has_value());
  // Until heard (30 s: a hang guard, not a bound on libvirt's event loop).
  for (int i = 0; i < 3000 && heard.load() == before; ++i) std::this_thread::sleep_for(10ms);
  CHECK(heard.load() > before);
}
