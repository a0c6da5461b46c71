// Workloads in process (the fake hypervisor): mapped to units by their PCI hostdevs, read from the
// snapshot, what occupies a unit for create; release, capacity and admission.
#include "workloads.hpp"

using namespace service_test;

TEST_CASE("workloads: mapped to units by their PCI hostdevs; labels per §5/§7") {
  Lab lab;
  using gpunode::vmctl::Tier;
  lab.hypervisor_->domains = {
      vm("spot-a", "u1", {"0000:41:00.0"}, gpunode::vmctl::WorkloadLabel{"vm-1", "org-b", Tier::spot}),
      vm("legacy", "u2", {"0000:42:00.0", "0000:99:00.0"}, std::nullopt),
      vm("off", "u3", {"0000:43:00.0"}, gpunode::vmctl::WorkloadLabel{"vm-3", "org-c", Tier::on_demand},
         "shutoff"),
  };
  const auto owner = lab.token(kOwner);
  auto r = lab.call("GET", Lab::path("/workloads"), owner);
  REQUIRE(r.status == 200);
  auto ws = Lab::body(r).at("workloads").as_array();
  REQUIRE(ws.size() == 3);
  CHECK(ws[0].at("name") == "legacy");
  CHECK(ws[0].at("vmId").is_null());
  CHECK(ws[0].at("tier").is_null());
  CHECK(ws[0].at("unitIds").as_array().size() == 1);  // 99:00.0 is no unit's
  CHECK(ws[2].at("name") == "spot-a");
  CHECK(ws[2].at("tier") == "spot");
  CHECK(ws[2].at("unitIds").as_array().at(0) == "u-0000-41-00-0");
  CHECK(lab.call("GET", Lab::path("/workloads"), lab.token("org-mgr")).status ==
        404);  // does not see the node
  lab.hypervisor_->unavailable = true;
  auto down = lab.call("GET", Lab::path("/workloads"), owner);
  CHECK(down.status == 503);
  CHECK(code_of(down) == "hypervisor-unavailable");
}

TEST_CASE(
    "workloads from the snapshot: a list the hypervisor's events keep current is read with no hop, "
    "until an event, a batch or a failed list") {
  Lab lab;
  using gpunode::vmctl::Tier;
  lab.hypervisor_->domains = {
      vm("spot-a", "u1", {"0000:41:00.0"}, gpunode::vmctl::WorkloadLabel{"vm-1", "org-b", Tier::spot})};
  const auto owner = lab.token(kOwner);
  const auto get = Lab::request("GET", Lab::path("/workloads"), owner);
  auto& node = *lab.service_;
  auto listing = [&](bool current) {
    return std::make_shared<const WorkloadListing>(
        WorkloadListing{lab.hypervisor_->list(), std::chrono::steady_clock::now(), current});
  };
  CHECK_FALSE(node.read(get, lab.now_));  // never listed: the state thread lists
  (void)node.observe_workloads(listing(false));
  CHECK_FALSE(node.read(get, lab.now_));  // listed, but no events say it holds
  (void)node.observe_workloads(listing(true));
  const auto read = node.read(get, lab.now_);
  REQUIRE(read);
  CHECK(read->status == 200);
  CHECK(Lab::body(*read).at("workloads").as_array().size() == 1);
  // The state thread answers the same bytes from the same list, without asking for another.
  const auto answered = node.handle(get);
  REQUIRE(std::holds_alternative<ApiResponse>(answered));
  CHECK(std::get<ApiResponse>(answered).body == read->body);
  CHECK_FALSE(node.read(Lab::request("GET", Lab::path("/workloads"), lab.token("org-b")), lab.now_));  // 404
  node.workloads_changed();  // an event: the next reader goes to the state thread, which lists
  CHECK_FALSE(node.read(get, lab.now_));
  CHECK(std::holds_alternative<NeedsWorkloads>(node.handle(get)));
  (void)node.observe_workloads(listing(true));
  REQUIRE(node.read(get, lab.now_));
  lab.hypervisor_->unavailable = true;
  (void)node.observe_workloads(listing(true));  // a failed list is never current
  CHECK_FALSE(node.read(get, lab.now_));
  CHECK(std::holds_alternative<NeedsWorkloads>(node.handle(get)));
}

TEST_CASE("create: unit-occupied by non-spot workloads of outsiders; spot workloads allowed and listed") {
  Lab lab;
  using gpunode::vmctl::Tier;
  lab.hypervisor_->domains = {
      vm("spot-a", "u1", {"0000:41:00.0"}, gpunode::vmctl::WorkloadLabel{"vm-1", "org-b", Tier::spot}),
      vm("legacy", "u2", {"0000:42:00.0"}, std::nullopt),
      vm("mine", "u4", {"0000:42:00.0"}, gpunode::vmctl::WorkloadLabel{"vm-4", "org-aud", Tier::on_demand}),
  };
  const auto admin = lab.token("org-platform", {"platform-admin"});
  auto occupied = lab.call(
      "POST", Lab::path("/reservations"), admin,
      R"({"unitIds":["u-0000-42-00-0"],"audienceOrgIds":["org-aud"],"endsAt":"2099-01-01T00:00:00Z"})");
  CHECK(occupied.status == 409);
  CHECK(code_of(occupied) == "unit-occupied");
  auto blockers = Lab::body(occupied).at("workloads").as_array();
  REQUIRE(blockers.size() == 1);  // the audience's own VM does not block
  CHECK(blockers[0].at("name") == "legacy");
  CHECK(blockers[0].at("vmId").is_null());
  // a term that has not started is not checked
  CHECK(
      lab.call(
             "POST", Lab::path("/reservations"), admin,
             R"({"unitIds":["u-0000-42-00-0"],"audienceOrgIds":["org-aud"],"startsAt":"2098-01-01T00:00:00Z","endsAt":"2099-01-01T00:00:00Z"})")
          .status == 201);
  auto ok = lab.call(
      "POST", Lab::path("/reservations"), admin,
      R"({"unitIds":["u-0000-41-00-0"],"audienceOrgIds":["org-aud"],"endsAt":"2099-01-01T00:00:00Z"})");
  REQUIRE(ok.status == 201);
  auto spot = Lab::body(ok).at("spotWorkloads").as_array();
  REQUIRE(spot.size() == 1);
  CHECK(spot[0].at("vmId") == "vm-1");
  lab.hypervisor_->unavailable = true;
  auto down = lab.call(
      "POST", Lab::path("/reservations"), admin,
      R"({"unitIds":["u-0000-42-00-0"],"audienceOrgIds":["org-aud"],"startsAt":"2097-01-01T00:00:00Z","endsAt":"2097-06-01T00:00:00Z"})");
  CHECK(down.status == 201);  // scheduled: occupancy is not asked
}

TEST_CASE("release, capacity and admission") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  const auto oper = lab.token("org-platform", {"platform-operator"});
  auto r = lab.create(admin, {"u-0000-41-00-0"}, {"org-aud"}, {"org-mgr"});
  const std::string id(r.at("id").as_string()), p = Lab::path("/reservations/" + id);
  auto later = lab.create(admin, {"u-0000-42-00-0"}, {"org-aud"}, {"org-mgr"},
                          iso(lab.now_ + std::chrono::hours(5)), iso(lab.now_ + std::chrono::hours(6)));

  auto cap = [&](const char* org) {
    std::map<std::string, std::pair<std::string, json::value>> out;
    auto b = Lab::body(lab.call("GET", Lab::path(std::string("/capacity?org=") + org), oper));
    for (auto& e : b.at("units").as_array())
      out[std::string(e.at("unitId").as_string())] = {std::string(e.at("tier").as_string()),
                                                      e.at("reservationId")};
    return out;
  };
  auto aud = cap("org-aud");
  CHECK(aud.size() == 2);  // 43 is not sellable (a foreign NIC in its group)
  CHECK(aud["u-0000-41-00-0"].first == "reserved");
  CHECK(aud["u-0000-41-00-0"].second == json::value(id));
  CHECK(aud["u-0000-42-00-0"].first == "on-demand");  // a scheduled reservation does not hold its units yet
  CHECK(aud["u-0000-42-00-0"].second.is_null());
  CHECK(cap("org-other").count("u-0000-41-00-0") == 0);  // nothing of anyone else's reservation

  CHECK(lab.call("POST", p + "/release", lab.token("org-aud"), R"({"unitIds":["u-0000-41-00-0"]})").status ==
        403);
  CHECK(code_of(lab.call("POST", p + "/release", lab.token("org-mgr"),
                         R"({"unitIds":["u-0000-42-00-0"]})")) == "unknown-unit");
  CHECK(code_of(lab.call("POST",
                         Lab::path("/reservations/") + std::string(later.at("id").as_string()) + "/release",
                         admin, R"({"unitIds":["u-0000-42-00-0"]})")) == "reservation-not-active");
  auto rel = lab.call("POST", p + "/release", lab.token("org-mgr"), R"({"unitIds":["u-0000-41-00-0"]})");
  REQUIRE(rel.status == 200);
  CHECK(Lab::body(rel).at("reservation").at("releasedUnitIds").as_array().at(0) == "u-0000-41-00-0");
  auto again = lab.call("POST", p + "/release", lab.token("org-mgr"), R"({"unitIds":["u-0000-41-00-0"]})");
  CHECK(again.status == 200);
  CHECK(Lab::body(again).at("reservation").at("version") ==
        Lab::body(rel).at("reservation").at("version"));  // a no-op
  CHECK(again.header("ETag") == rel.header("ETag"));      // answered like a change: the reservation's ETag

  CHECK(cap("org-other")["u-0000-41-00-0"].first == "spot");
  CHECK(cap("org-other")["u-0000-41-00-0"].second.is_null());  // a spot entry never names a reservation
  CHECK(cap("org-aud")["u-0000-41-00-0"].first == "spot");

  auto admit = [&](const std::string& body) {
    return Lab::body(lab.call("POST", Lab::path("/admission"), oper, body));
  };
  CHECK(admit(R"({"orgId":"org-x","tier":"spot","unitIds":["u-0000-41-00-0"]})").at("allowed") == true);
  auto no = admit(
      R"({"orgId":"org-aud","tier":"reserved","unitIds":["u-0000-41-00-0","u-0000-42-00-0","u-0000-43-00-0","u-0000-99-00-0"]})");
  CHECK(no.at("allowed") == false);
  std::vector<std::string> codes;
  for (auto& x : no.at("reasons").as_array()) codes.emplace_back(x.at("code").as_string());
  CHECK(codes == std::vector<std::string>{"unit-released", "not-reserved", "not-sellable", "unknown-unit"});
  auto bad_tier = admit(R"({"orgId":"org-aud","tier":"gold","unitIds":["u-0000-41-00-0"]})");
  CHECK(bad_tier.at("reasons").as_array().at(0).at("code") == "invalid-tier");
  CHECK(bad_tier.at("reasons").as_array().at(0).at("unitId").is_null());
  CHECK(lab.call("POST", Lab::path("/admission"), oper, R"({"orgId":"org-aud","tier":"spot","unitIds":[]})")
            .status == 400);
  CHECK(lab.call("POST", Lab::path("/admission"), oper, R"({"tier":"spot","unitIds":["u-0000-41-00-0"]})")
            .status == 400);
  CHECK(lab.call("POST", Lab::path("/admission"), lab.token(kOwner),
                 R"({"orgId":"o","tier":"spot","unitIds":["u"]})")
            .status == 403);
  // Idempotency-Key: the first answer replays; another body with the key is 422 (CONTRACT §4).
  const std::vector<std::pair<std::string, std::string>> key{{"idempotency-key", "adm-1"}};
  const std::string q1 = R"({"orgId":"org-x","tier":"spot","unitIds":["u-0000-41-00-0"]})";
  auto first = lab.call("POST", Lab::path("/admission"), oper, q1, key);
  REQUIRE(first.status == 200);
  auto replayed = lab.call("POST", Lab::path("/admission"), oper, q1, key);
  CHECK(replayed.body == first.body);
  CHECK(replayed.header("Idempotent-Replayed") == "true");
  CHECK(code_of(lab.call("POST", Lab::path("/admission"), oper,
                         R"({"orgId":"org-y","tier":"spot","unitIds":["u-0000-41-00-0"]})", key)) ==
        "idempotency-key-reuse");

  auto ended = lab.call("POST", p + "/end", admin, "");
  REQUIRE(ended.status == 200);
  CHECK(Lab::body(ended).at("releasedUnitIds").as_array().empty());  // released units leave the spot market
                                                                     // with it
  CHECK(cap("org-other")["u-0000-41-00-0"].first == "on-demand");
  auto records = Lab::body(lab.call("GET", Lab::path("/audit"), admin)).at("records").as_array();
  bool released = false;
  for (auto& rec : records) released = released || rec.at("action") == "units.release";
  CHECK(released);
}

// A release that changes nothing (the units are released already) keeps its Idempotency-Key answer
// like any other: its retry, after the units were reclaimed and even across a restart, replays it
// and does not release them again (found by the crash loop, tests/soak/).
TEST_CASE("release: a no-op release keeps its Idempotency-Key answer across a reclaim and a restart") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  auto r = lab.create(admin, {"u-0000-41-00-0"}, {"org-aud"}, {"org-mgr"});
  const std::string p = Lab::path("/reservations/" + std::string(r.at("id").as_string()));
  const std::string units = R"({"unitIds":["u-0000-41-00-0"]})";
  REQUIRE(lab.call("POST", p + "/release", admin, units, {{"idempotency-key", "rel-1"}}).status == 200);
  const std::vector<std::pair<std::string, std::string>> key{{"idempotency-key", "rel-2"}};
  auto noop = lab.call("POST", p + "/release", admin, units, key);
  REQUIRE(noop.status == 200);
  auto reclaimed = lab.call("POST", p + "/reclaim", admin, units);
  REQUIRE(reclaimed.status == 200);
  REQUIRE(Lab::body(reclaimed).at("reservation").at("releasedUnitIds").as_array().empty());
  for (int restart = 0; restart < 2; ++restart) {
    CAPTURE(restart);
    auto replay = lab.call("POST", p + "/release", admin, units, key);
    CHECK(replay.status == 200);
    CHECK(replay.body == noop.body);
    CHECK(replay.header("Idempotent-Replayed") == "true");
    CHECK(replay.header("ETag") == noop.header("ETag"));
    lab.open();
  }
  // Nothing was released again: the reservation is as the reclaim left it.
  auto now = Lab::body(lab.call("GET", p, admin));
  CHECK(now.at("releasedUnitIds").as_array().empty());
  CHECK(now.at("version") == Lab::body(reclaimed).at("reservation").at("version"));
  CHECK(lab.audits("units.release").size() == 1);
}
