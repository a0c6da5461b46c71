// Domain admission in process (the libvirt hook's question, CONTRACT §9): the entitlement table per
// unit on the admin socket, audit mode, the race with create; unentitled workloads.
#include <fmt/format.h>

#include "workloads.hpp"

using namespace service_test;

namespace {

// A domain definition as libvirt hands it to the qemu hook: name, uuid, the label, PCI hostdevs.
std::string domain_xml(const std::string& name, const std::string& uuid,
                       const std::vector<std::string>& addresses, const std::string& label = "") {
  std::string devices;
  for (const auto& a : addresses) {
    devices += fmt::format(
        "<hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x{}' bus='0x{}' "
        "slot='0x{}' "
        "function='0x{}'/></source></hostdev>",
        a.substr(0, 4), a.substr(5, 2), a.substr(8, 2), a.substr(11, 1));
  }
  return fmt::format(
      "<domain "
      "type='kvm'><name>{}</name><uuid>{}</uuid><metadata>{}</metadata><devices>{}</devices></domain>",
      name, uuid, label, devices);
}

std::string label_xml(const char* vm_id, const char* org, const char* tier) {
  return fmt::format(R"(<w:workload xmlns:w="urn:gpunode:workload:1" vm-id="{}" org="{}" tier="{}"/>)", vm_id,
                     org, tier);
}

struct Admission {
  unsigned status = 0;
  bool allowed = false;
  std::string mode;
  std::vector<std::string> unit_ids;
  std::vector<std::string> codes;  // "UNIT:CODE", "-:CODE" for a hostdev of no unit
};

Admission admit(Lab& lab, const std::string& xml, const std::string& via = "admin-socket") {
  auto r =
      lab.call("POST", "/v1/admin/domain-admission", via, json::serialize(json::object{{"domainXml", xml}}));
  Admission a;
  a.status = r.status;
  if (r.status != 200) return a;
  auto b = Lab::body(r).as_object();
  a.allowed = b.at("allowed").as_bool();
  a.mode = std::string(b.at("mode").as_string());
  for (const auto& u : b.at("unitIds").as_array()) a.unit_ids.emplace_back(u.as_string());
  for (const auto& rv : b.at("reasons").as_array()) {
    const auto& o = rv.as_object();
    a.codes.push_back(fmt::format("{}:{}",
                                  o.at("unitId").is_null() ? "-" : std::string(o.at("unitId").as_string()),
                                  std::string(o.at("code").as_string())));
  }
  return a;
}

}  // namespace

TEST_CASE(
    "domain admission (the libvirt hook, CONTRACT §9): the entitlement table per unit, on the admin socket "
    "only") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  const std::string u41 = "u-0000-41-00-0", u42 = "u-0000-42-00-0";
  using V = std::vector<std::string>;

  // Free units: unlabelled and on-demand start; reserved and spot do not.
  auto unlabelled = admit(lab, domain_xml("legacy", "d-1", {"0000:41:00.0"}));
  CHECK(unlabelled.allowed);
  CHECK(unlabelled.mode == "enforce");
  CHECK(unlabelled.unit_ids == V{u41});
  CHECK(
      admit(lab, domain_xml("od", "d-2", {"0000:41:00.0"}, label_xml("vm-2", "org-x", "on-demand"))).allowed);
  CHECK(admit(lab, domain_xml("rs", "d-3", {"0000:41:00.0"}, label_xml("vm-3", "org-a", "reserved"))).codes ==
        V{u41 + ":not-reserved"});
  CHECK(admit(lab, domain_xml("sp", "d-4", {"0000:41:00.0"}, label_xml("vm-4", "org-x", "spot"))).codes ==
        V{u41 + ":not-released"});
  // A domain without PCI hostdevs has no units: nothing to refuse.
  auto none = admit(lab, domain_xml("plain", "d-5", {}));
  CHECK(none.allowed);
  CHECK(none.unit_ids.empty());

  // u41 reserved for org-a (active now), once the domains let through above are no longer
  // starting (they never showed up as running: their hold ends after 120 s).
  lab.now_ += std::chrono::seconds(121);
  const auto x = lab.create(admin, {u41}, {"org-a"}, {"org-a"});
  const std::string rid(x.at("id").as_string());
  CHECK(admit(lab, domain_xml("legacy2", "d-6", {"0000:41:00.0"})).codes == V{u41 + ":unit-reserved"});
  CHECK(
      admit(lab, domain_xml("od2", "d-7", {"0000:41:00.0"}, label_xml("vm-7", "org-x", "on-demand"))).codes ==
      V{u41 + ":unit-reserved"});
  CHECK(admit(lab, domain_xml("mine", "d-8", {"0000:41:00.0"}, label_xml("vm-8", "org-a", "reserved")))
            .allowed);
  CHECK(admit(lab, domain_xml("theirs", "d-9", {"0000:41:00.0"}, label_xml("vm-9", "org-x", "reserved")))
            .codes == V{u41 + ":not-in-audience"});
  CHECK(admit(lab, domain_xml("sp2", "d-10", {"0000:41:00.0"}, label_xml("vm-10", "org-x", "spot"))).codes ==
        V{u41 + ":not-released"});

  // Spanning a free and a reserved unit: refused for the reserved one only, both listed.
  auto spanning = admit(lab, domain_xml("wide", "d-11", {"0000:41:00.0", "0000:42:00.0"},
                                        label_xml("vm-11", "org-x", "on-demand")));
  CHECK_FALSE(spanning.allowed);
  CHECK(spanning.unit_ids == V{u41, u42});
  CHECK(spanning.codes == V{u41 + ":unit-reserved"});

  // Released: spot of anyone starts; the audience's reserved VMs do not.
  REQUIRE(lab.call("POST", Lab::path("/reservations/" + rid + "/release"), admin,
                   R"({"unitIds":["u-0000-41-00-0"]})")
              .status == 200);
  CHECK(admit(lab, domain_xml("sp3", "d-12", {"0000:41:00.0"}, label_xml("vm-12", "org-x", "spot"))).allowed);
  CHECK(admit(lab, domain_xml("mine2", "d-13", {"0000:41:00.0"}, label_xml("vm-13", "org-a", "reserved")))
            .codes == V{u41 + ":unit-released"});

  // Not sellable (u43 has a NIC in its group), a GPU of no unit, a device never seen, an unreadable address.
  CHECK(admit(lab, domain_xml("nic-group", "d-14", {"0000:43:00.0"})).codes ==
        V{"u-0000-43-00-0:not-sellable"});
  lab.tree_.add("0000:05:00.0", "8086", "56c0", "030000", "i915", 5);  // a GPU of a vendor not in gpu_vendors
  lab.tree_.add("0000:06:00.0", "15b3", "101e", "020000", "mlx5_core", 6);  // a NIC
  REQUIRE(lab.call("POST", "/v1/admin/rescan", "admin-socket").status == 200);
  CHECK(admit(lab, domain_xml("stray", "d-15", {"0000:05:00.0"})).codes == V{"-:unknown-unit"});
  CHECK(admit(lab, domain_xml("ghost", "d-16", {"0000:77:00.0"})).codes == V{"-:unknown-unit"});
  auto nic = admit(lab, domain_xml("nic", "d-17", {"0000:06:00.0"}));
  CHECK(nic.allowed);  // not a GPU: not the agent's to decide
  CHECK(nic.unit_ids.empty());
  CHECK(admit(lab,
              "<domain><name>bad</name><uuid>d-18</uuid><devices><hostdev "
              "type='pci'><source/></hostdev></devices></domain>")
            .codes == V{"-:unknown-unit"});

  // Each refusal is a workload.refused event (CONTRACT §6) with the domain, label and reasons.
  auto refused = lab.events("workload.refused");
  REQUIRE(refused.size() == 12);
  const auto& d = refused[4].at("data").as_object();  // "theirs" is the 5th refusal
  CHECK(d.at("name") == "theirs");
  CHECK(d.at("domainUuid") == "d-9");
  CHECK(d.at("vmId") == "vm-9");
  CHECK(d.at("org") == "org-x");
  CHECK(d.at("tier") == "reserved");
  CHECK(d.at("unitIds") == json::array{json::value(u41)});
  CHECK(d.at("reasons").as_array().at(0).at("code") == "not-in-audience");
  CHECK(d.at("mode") == "enforce");
  CHECK(refused[0].at("data").at("org") == "org-a");  // "rs"
  CHECK(refused[2].at("data").at("vmId").is_null());  // "legacy2" is unlabelled
  CHECK(refused[2].at("data").at("org").is_null());
  CHECK(refused[2].at("data").at("tier") == "on-demand");
  const auto counts = lab.service_->gauges().admissions;  // allowed, refused, audit-refused
  CHECK(counts[0] == 6);
  CHECK(counts[1] == 12);
  CHECK(counts[2] == 0);

  // Only on the admin socket; bad bodies are 400.
  CHECK(admit(lab, domain_xml("x", "d-19", {}), admin).status == 404);
  CHECK(lab.call("POST", "/v1/admin/domain-admission", "admin-socket", R"({"domainXml":"<network/>"})")
            .status == 400);
  CHECK(lab.call("POST", "/v1/admin/domain-admission", "admin-socket", R"({})").status == 400);
  CHECK(lab.call("GET", "/v1/admin/domain-admission", "admin-socket").status == 405);
}

TEST_CASE("domain admission: audit mode lets a refused domain start and counts it; off decides nothing") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  lab.create(admin, {"u-0000-41-00-0"}, {"org-a"}, {});
  lab.service_->set_enforcement(gpunode::config::EnforcementMode::audit);
  auto audit =
      admit(lab, domain_xml("outsider", "d-1", {"0000:41:00.0"}, label_xml("vm-1", "org-x", "on-demand")));
  CHECK_FALSE(audit.allowed);
  CHECK(audit.mode == "audit");
  CHECK(audit.codes == std::vector<std::string>{"u-0000-41-00-0:unit-reserved"});
  CHECK(lab.service_->gauges().admissions[2] == 1);  // audit-refused
  CHECK(lab.service_->gauges().admissions[1] == 0);  // refused
  auto refused = lab.events("workload.refused");
  REQUIRE(refused.size() == 1);
  CHECK(refused[0].at("data").at("mode") == "audit");
  lab.service_->set_enforcement(gpunode::config::EnforcementMode::off);
  auto off =
      admit(lab, domain_xml("outsider", "d-1", {"0000:41:00.0"}, label_xml("vm-1", "org-x", "on-demand")));
  CHECK(off.allowed);
  CHECK(off.mode == "off");
  CHECK(off.codes.empty());
  CHECK(lab.events("workload.refused").size() == 1);
}

TEST_CASE("domain admission and create race: a domain let through and still starting holds its units") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  const std::string body =
      R"({"unitIds":["u-0000-42-00-0"],"audienceOrgIds":["org-a"],"endsAt":"2099-01-01T00:00:00Z"})";
  // The hook lets an outsider's on-demand VM start on the free unit; libvirt does not list it yet.
  REQUIRE(admit(lab, domain_xml("starting", "d-1", {"0000:42:00.0"}, label_xml("vm-1", "org-x", "on-demand")))
              .allowed);
  auto blocked = lab.call("POST", Lab::path("/reservations"), admin, body);
  CHECK(blocked.status == 409);
  CHECK(code_of(blocked) == "unit-occupied");
  CHECK(Lab::body(blocked).at("workloads").at(0).at("domainUuid") == "d-1");
  // Once libvirt lists it running, the listing itself holds the unit.
  lab.hypervisor_->domains = {
      vm("starting", "d-1", {"0000:42:00.0"},
         gpunode::vmctl::WorkloadLabel{"vm-1", "org-x", gpunode::vmctl::Tier::on_demand})};
  CHECK(lab.call("POST", Lab::path("/reservations"), admin, body).status == 409);
  // It stopped; and a start that never happened is forgotten after its hold.
  lab.hypervisor_->domains.clear();
  REQUIRE(admit(lab, domain_xml("never", "d-2", {"0000:42:00.0"}, label_xml("vm-2", "org-x", "on-demand")))
              .allowed);
  CHECK(lab.call("POST", Lab::path("/reservations"), admin, body).status == 409);
  lab.now_ += std::chrono::seconds(121);
  CHECK(lab.call("POST", Lab::path("/reservations"), admin, body).status == 201);
  // Now reserved: the same start is refused, so the two cannot both pass.
  CHECK(admit(lab, domain_xml("late", "d-3", {"0000:42:00.0"}, label_xml("vm-3", "org-x", "on-demand")))
            .codes == std::vector<std::string>{"u-0000-42-00-0:unit-reserved"});
}

TEST_CASE(
    "unentitled workloads (CONTRACT §9): a reservation starting under a running domain; one event while it "
    "stays; gauge and route") {
  Lab lab;
  using gpunode::vmctl::Tier;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  const auto t0 = lab.now_;
  lab.hypervisor_->domains = {
      vm("od-1", "uuid-od-1", {"0000:41:00.0"},
         gpunode::vmctl::WorkloadLabel{"vm-od-1", "org-x", Tier::on_demand}),
      vm("od-off", "uuid-od-off", {"0000:41:00.0"},
         gpunode::vmctl::WorkloadLabel{"vm-off", "org-x", Tier::on_demand}, "shutoff"),
      vm("aud", "uuid-aud", {"0000:42:00.0"},
         gpunode::vmctl::WorkloadLabel{"vm-aud", "org-a", Tier::reserved}),
  };
  // A scheduled reservation of 41 (created while od-1 runs: the term has not started) and one of 42 for
  // org-a.
  lab.create(admin, {"u-0000-41-00-0"}, {"org-a"}, {}, iso(t0 + std::chrono::minutes(10)),
             iso(t0 + std::chrono::hours(2)));
  lab.create(admin, {"u-0000-42-00-0"}, {"org-a"}, {}, iso(t0 + std::chrono::minutes(10)),
             iso(t0 + std::chrono::hours(2)));
  auto listed = [&] { return lab.call("GET", Lab::path("/workloads"), admin); };
  REQUIRE(listed().status == 200);
  // Before the terms: od-1 is entitled (no active reservation); aud is a reserved workload without its
  // reservation.
  auto route = Lab::body(lab.call("GET", "/v1/admin/unentitled", "admin-socket")).at("workloads").as_array();
  REQUIRE(route.size() == 1);
  CHECK(route[0].at("name") == "aud");
  CHECK(route[0].at("reasons").as_array().at(0).at("code") == "not-reserved");
  CHECK(lab.events("workload.unentitled").size() == 1);

  lab.now_ = t0 + std::chrono::minutes(11);
  lab.service_->tick();  // both terms start
  REQUIRE(listed().status == 200);
  route = Lab::body(lab.call("GET", "/v1/admin/unentitled", "admin-socket")).at("workloads").as_array();
  REQUIRE(route.size() == 1);  // aud is entitled now; od-1 runs on a reserved unit; od-off is not active
  CHECK(route[0].at("name") == "od-1");
  CHECK(route[0].at("domainUuid") == "uuid-od-1");
  CHECK(route[0].at("vmId") == "vm-od-1");
  CHECK(route[0].at("org") == "org-x");
  CHECK(route[0].at("tier") == "on-demand");
  CHECK(route[0].at("unitIds") == json::array{"u-0000-41-00-0"});
  CHECK(route[0].at("reasons").as_array().at(0).at("code") == "unit-reserved");
  CHECK(lab.service_->gauges().unentitled_workloads == 1);
  auto events = lab.events("workload.unentitled");
  REQUIRE(events.size() == 2);
  CHECK(events[1].at("data").at("name") == "od-1");
  CHECK(events[1].at("data").at("reasons").as_array().at(0).at("unitId") == "u-0000-41-00-0");

  // Listed again and again: no second event while it stays unentitled; the agent never stops it.
  REQUIRE(listed().status == 200);
  REQUIRE(listed().status == 200);
  CHECK(lab.events("workload.unentitled").size() == 2);
  CHECK(lab.hypervisor_->domains.at(0).state == "running");

  // Gone (shut off): it leaves the count; started again, it is reported again.
  lab.hypervisor_->domains.at(0).state = "shutoff";
  REQUIRE(listed().status == 200);
  CHECK(lab.service_->gauges().unentitled_workloads == 0);
  lab.hypervisor_->domains.at(0).state = "running";
  REQUIRE(listed().status == 200);
  CHECK(lab.events("workload.unentitled").size() == 3);
  CHECK(lab.call("GET", "/v1/admin/unentitled", admin).status == 404);  // the admin socket's route only
}

TEST_CASE("unentitled workloads: a spot domain on a unit its reservation is reclaiming is not counted") {
  Lab lab;
  using gpunode::vmctl::Tier;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  lab.hypervisor_->domains = {vm("spot-1", "uuid-spot-1", {"0000:41:00.0"},
                                 gpunode::vmctl::WorkloadLabel{"vm-s", "org-x", Tier::spot})};
  auto r = lab.create(admin, {"u-0000-41-00-0"}, {"org-a"}, {"org-m"});
  const std::string rid(r.at("id").as_string());
  REQUIRE(lab.call("POST", Lab::path("/reservations/" + rid + "/release"), admin,
                   R"({"unitIds":["u-0000-41-00-0"]})")
              .status == 200);
  REQUIRE(lab.call("GET", Lab::path("/workloads"), admin).status == 200);
  CHECK(lab.service_->gauges().unentitled_workloads == 0);  // spot on a released unit
  REQUIRE(lab.call("POST", Lab::path("/reservations/" + rid + "/reclaim"), admin,
                   R"({"unitIds":["u-0000-41-00-0"]})")
              .status == 200);
  REQUIRE(lab.call("GET", Lab::path("/workloads"), admin).status == 200);
  CHECK(lab.service_->gauges().unentitled_workloads ==
        0);  // reclaiming: within its managers' reach until it goes
  REQUIRE(lab.call("POST", Lab::path("/reservations/" + rid + "/end"), admin).status == 200);
  REQUIRE(lab.call("GET", Lab::path("/workloads"), admin).status == 200);
  CHECK(lab.service_->gauges().unentitled_workloads ==
        1);  // its reservation ended: a spot VM on a unit off the market
}
