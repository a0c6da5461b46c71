// Terminations in process (the fake hypervisor): terminate-spot and reclaim, who may and what each
// reaches; terminations cut short and finished by the agent, failed stops, graces announced; dry
// runs; requests that need workloads; Idempotency-Key while the first call runs.
#include "workloads.hpp"

using namespace service_test;

TEST_CASE("terminate-spot: who may, the reach of each caller, and what is left running") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  const auto mgr = lab.token("org-mgr");
  auto x = lab.create(admin, {U1}, {"org-aud"}, {"org-mgr"});
  lab.create(admin, {U2}, {"org-aud2"}, {"org-mgr2"});
  const std::string rid(x.at("id").as_string());
  lab.hypervisor_->domains = {
      vm("spot-a", "uuid-a", {"0000:41:00.0"}, WorkloadLabel{"vm-a", "org-b", Tier::spot}),
      vm("spot-b", "uuid-b", {"0000:42:00.0"}, WorkloadLabel{"vm-b", "org-c", Tier::spot}),
      vm("spot-pair", "uuid-p", {"0000:41:00.0", "0000:42:00.0"}, WorkloadLabel{"vm-p", "org-c", Tier::spot}),
      vm("od", "uuid-od", {"0000:41:00.0"}, WorkloadLabel{"vm-od", "org-aud", Tier::on_demand}),
      vm("legacy", "uuid-l", {"0000:42:00.0"}, std::nullopt),
      vm("off", "uuid-off", {"0000:41:00.0"}, WorkloadLabel{"vm-off", "org-b", Tier::spot}, "shutoff"),
      vm("elsewhere", "uuid-e", {"0000:07:00.0"}, WorkloadLabel{"vm-e", "org-b", Tier::spot}),
  };
  const std::string ts = Lab::path("/terminate-spot");

  // Who may call at all.
  CHECK(code_of(lab.call("POST", ts, lab.token("org-platform", {"platform-operator"}), "{}")) == "forbidden");
  CHECK(code_of(lab.call("POST", ts, lab.token("org-aud"), "{}")) == "forbidden");
  CHECK(lab.call("POST", ts, lab.token("org-other"), "{}").status == 404);
  CHECK(lab.call("POST", ts, "", "{}").status == 401);
  // Bodies.
  for (const char* bad :
       {R"({"gracePeriodSeconds":301})", R"({"gracePeriodSeconds":-1})", R"({"gracePeriodSeconds":"5"})",
        R"({"unitIds":[]})", R"({"unitIds":"u"})", R"({"force":true})", "[1]", "{"}) {
    CAPTURE(bad);
    CHECK(code_of(lab.call("POST", ts, admin, bad)) == "invalid-request");
  }
  CHECK(code_of(lab.call("POST", ts, admin, R"({"unitIds":["u-0000-99-00-0"]})")) == "unknown-unit");
  CHECK(code_of(lab.call("POST", ts, admin, R"({"reservationId":"rsv_nope"})")) == "unknown-reservation");

  // A manager reaches nothing until a unit is released: a named unit is out of reach.
  auto none = lab.call("POST", ts, mgr, "{}");
  REQUIRE(none.status == 200);
  CHECK(Lab::body(none).at("terminated").as_array().empty());
  CHECK(Lab::body(none).at("leftRunning").as_array().empty());
  auto outside = lab.call("POST", ts, mgr, fmt::format(R"({{"unitIds":["{}"]}})", U1));
  CHECK(outside.status == 403);
  CHECK(code_of(outside) == "out-of-reach");
  for (const auto& d : lab.hypervisor_->domains) CHECK(d.state == (d.name == "off" ? "shutoff" : "running"));

  // Released: the manager reaches U1 only.
  REQUIRE(lab.call("POST", Lab::path("/reservations/" + rid + "/release"), mgr,
                   fmt::format(R"({{"unitIds":["{}"]}})", U1))
              .status == 200);
  CHECK(code_of(lab.call("POST", ts, mgr, fmt::format(R"({{"unitIds":["{}"]}})", U2))) == "out-of-reach");
  auto r = lab.call("POST", ts, mgr, R"({"reason":"we need it back"})");
  REQUIRE_MESSAGE(r.status == 200, r.body);
  auto b = Lab::body(r);
  CHECK(names_of(b.at("terminated")) == std::vector<std::string>{"spot-a"});
  const auto* t = entry(b.at("terminated"), "spot-a");
  REQUIRE(t);
  CHECK(t->at("vmId") == "vm-a");
  CHECK(t->at("domainUuid") == "uuid-a");
  CHECK(t->at("unitIds") == json::array{U1});
  CHECK(names_of(b.at("leftRunning")) == std::vector<std::string>{"od", "spot-pair"});
  const auto* pair = entry(b.at("leftRunning"), "spot-pair");
  CHECK(pair->at("reason") == "out-of-reach");
  CHECK(pair->at("unitIds") == json::array{U1});  // only the units the caller reaches
  CHECK(pair->at("tier") == "spot");
  CHECK(entry(b.at("leftRunning"), "od")->at("reason") == "not-spot");
  CHECK(lab.hypervisor_->find("uuid-a")->state == "shutoff");
  CHECK(lab.hypervisor_->find("uuid-p")->state == "running");
  CHECK(lab.hypervisor_->find("uuid-od")->state == "running");
  CHECK(lab.hypervisor_->find("uuid-e")->state == "running");  // on no unit: never in a manager's reach

  // The record in the domain names the caller and an audit record about this VM.
  const auto rec = lab.hypervisor_->find("uuid-a")->termination;
  REQUIRE(rec.has_value());
  CHECK(rec->reason == "capacity-reclaim");
  CHECK(rec->by == "org-mgr");
  auto terminations = lab.audits("workload.terminate");
  REQUIRE(terminations.size() == 2);  // written ahead (with the id the domain carries), then the outcome
  CHECK(terminations[0].at("id") == json::value(rec->audit_id));
  CHECK(terminations[0].at("vmIds") == json::array{"vm-a"});
  CHECK(terminations[0].at("reservationId") == json::value(rid));
  CHECK(terminations[0].at("actor").at("org") == "org-mgr");
  CHECK(std::string(terminations[0].at("detail").as_string()).find("we need it back") != std::string::npos);
  CHECK(terminations[0].at("result") == "pending");  // one VM stopped once has exactly one `ok` (CONTRACT §7)
  CHECK(terminations[1].at("result") == "ok");
  CHECK(terminations[1].at("vmIds") == terminations[0].at("vmIds"));
  CHECK(terminations[1].at("requestId") == terminations[0].at("requestId"));
  auto events = lab.events("workload.terminated");
  REQUIRE(events.size() == 1);
  const auto& data = events[0].at("data");
  CHECK(data.at("vmId") == "vm-a");
  CHECK(data.at("domainUuid") == "uuid-a");
  CHECK(data.at("by") == "org-mgr");
  CHECK(data.at("auditId") == json::value(rec->audit_id));
  CHECK(data.at("reason") == "capacity-reclaim");
  CHECK(data.at("reservationId") == json::value(rid));
  auto ws = Lab::body(lab.call("GET", Lab::path("/workloads"), admin)).at("workloads");
  CHECK(entry(ws, "spot-a")->at("terminationReason") == "capacity-reclaim");
  CHECK(entry(ws, "spot-a")->at("state") == "shutoff");
  // The node's state carries the workloads as last listed; a change of them moves the revision.
  auto st1 = Lab::body(lab.call("GET", Lab::path("/state"), admin));
  REQUIRE(entry(st1.at("workloads"), "spot-a") != nullptr);
  CHECK(entry(st1.at("workloads"), "spot-a")->at("state") == "shutoff");
  lab.refresh();
  CHECK(Lab::body(lab.call("GET", Lab::path("/state"), admin)).at("revision") ==
        st1.at("revision"));  // nothing changed
  lab.hypervisor_->find("uuid-off")->state = "running";
  lab.refresh();
  auto st2 = Lab::body(lab.call("GET", Lab::path("/state"), admin));
  CHECK(st2.at("revision").as_int64() > st1.at("revision").as_int64());
  CHECK(entry(st2.at("workloads"), "off")->at("state") == "running");
  lab.hypervisor_->find("uuid-off")->state = "shutoff";

  // The owner reaches the whole node: the pair and spot-b go; the unlabelled VM is listed, vmId and tier
  // null.
  auto o = lab.call("POST", ts, lab.token(kOwner), "{}");
  REQUIRE(o.status == 200);
  auto ob = Lab::body(o);
  CHECK(names_of(ob.at("terminated")) == std::vector<std::string>{"elsewhere", "spot-b", "spot-pair"});
  CHECK(names_of(ob.at("leftRunning")) == std::vector<std::string>{"legacy", "od"});
  const auto* legacy = entry(ob.at("leftRunning"), "legacy");
  CHECK(legacy->at("vmId").is_null());
  CHECK(legacy->at("tier").is_null());
  CHECK(legacy->at("reason") == "not-spot");
  CHECK(lab.hypervisor_->find("uuid-e")->state ==
        "shutoff");  // on no unit, but on the node the owner reaches whole
  CHECK(lab.hypervisor_->find("uuid-b")->termination->by == kOwner);
  // The admin socket's caller is local:UID.
  lab.hypervisor_->find("uuid-b")->state = "running";
  auto local =
      lab.call("POST", ts, "admin-socket", fmt::format(R"({{"unitIds":["{}"],"gracePeriodSeconds":0}})", U2));
  REQUIRE(local.status == 200);
  CHECK(lab.hypervisor_->find("uuid-b")->termination->by == "local:0");
  CHECK(lab.events("workload.terminated").back().at("data").at("by") == "local:0");
  // Hypervisor down: 503, nothing recorded.
  const auto before = lab.audits("workload.terminate").size();
  lab.hypervisor_->unavailable = true;
  auto down = lab.call("POST", ts, admin, "{}");
  CHECK(down.status == 503);
  CHECK(code_of(down) == "hypervisor-unavailable");
  CHECK(lab.audits("workload.terminate").size() == before);
}

TEST_CASE("reclaim: with and without terminateSpot; reclaiming until vacated") {
  Lab lab;
  lab.hypervisor_->domains = spot_market_vms();
  const auto admin = lab.token("org-platform", {"platform-admin"});
  const auto mgr = lab.token("org-mgr");
  auto x = lab.create(admin, {U1, U2}, {"org-aud"}, {"org-mgr"});
  const std::string rid(x.at("id").as_string()), p = Lab::path("/reservations/" + rid);
  auto later = lab.create(admin, {U1}, {"org-aud"}, {"org-mgr"}, iso(lab.now_ + std::chrono::hours(30)),
                          iso(lab.now_ + std::chrono::hours(40)));
  REQUIRE(lab.call("POST", p + "/release", mgr, fmt::format(R"({{"unitIds":["{}","{}"]}})", U1, U2)).status ==
          200);

  CHECK(lab.call("POST", p + "/reclaim", lab.token("org-aud"), fmt::format(R"({{"unitIds":["{}"]}})", U1))
            .status == 403);
  CHECK(code_of(lab.call("POST", p + "/reclaim", mgr, R"({"unitIds":["u-0000-43-00-0"]})")) ==
        "unknown-unit");
  CHECK(code_of(lab.call("POST", p + "/reclaim", mgr, R"({"unitIds":[]})")) == "invalid-request");
  CHECK(code_of(lab.call("POST", p + "/reclaim", mgr,
                         fmt::format(R"({{"unitIds":["{}"],"terminateSpot":"yes"}})", U1))) ==
        "invalid-request");
  CHECK(code_of(lab.call("POST",
                         Lab::path("/reservations/") + std::string(later.at("id").as_string()) + "/reclaim",
                         admin, fmt::format(R"({{"unitIds":["{}"]}})", U1))) == "reservation-not-active");

  // Without terminateSpot: U1 leaves the market at once and stays reclaiming while spot-a runs.
  auto r1 =
      lab.call("POST", p + "/reclaim", mgr, fmt::format(R"({{"unitIds":["{}"],"terminateSpot":false}})", U1));
  REQUIRE_MESSAGE(r1.status == 200, r1.body);
  auto b1 = Lab::body(r1);
  CHECK(b1.at("reservation").at("releasedUnitIds") == json::array{U2});
  CHECK(b1.at("reservation").at("reclaimingUnitIds") == json::array{U1});
  CHECK(b1.at("terminated").as_array().empty());
  CHECK(b1.at("leftRunning").as_array().empty());
  CHECK(lab.hypervisor_->find("uuid-a")->state == "running");
  CHECK(lab.events("units.reclaimed").size() == 1);
  // Spot capacity is gone at once; the manager may still terminate there (reclaiming is in reach).
  auto cap = Lab::body(lab.call("GET", Lab::path("/capacity?org=org-b"), admin));
  for (auto& e : cap.at("units").as_array()) CHECK(e.at("unitId") != U1);
  // spot-a stops on its own: the next refresh vacates U1.
  lab.refresh();
  CHECK(Lab::body(lab.call("GET", p, admin)).at("reclaimingUnitIds") == json::array{U1});  // still running
  lab.hypervisor_->find("uuid-a")->state = "shutoff";
  lab.refresh();
  CHECK(Lab::body(lab.call("GET", p, admin)).at("reclaimingUnitIds").as_array().empty());
  auto reclaims = lab.audits("units.reclaim");
  REQUIRE(reclaims.size() == 2);
  CHECK(reclaims[1].at("actor").at("via") == "agent");
  CHECK(reclaims[1].at("unitIds") == json::array{U1});

  // With terminateSpot: spot-b goes in the same call, the reserved VM stays, U2 is vacated at once.
  lab.grace_ = std::chrono::seconds(20);
  lab.open();  // libvirt.shutdown_grace 20s
  lab.hypervisor_->ignore_shutdown = {"uuid-b"};
  lab.slept_ = {};
  auto r2 =
      lab.call("POST", p + "/reclaim", mgr, fmt::format(R"({{"unitIds":["{}"],"terminateSpot":true}})", U2));
  REQUIRE_MESSAGE(r2.status == 200, r2.body);
  auto b2 = Lab::body(r2);
  CHECK(names_of(b2.at("terminated")) == std::vector<std::string>{"spot-b"});
  CHECK(names_of(b2.at("leftRunning")) == std::vector<std::string>{"od-b"});
  CHECK(entry(b2.at("leftRunning"), "od-b")->at("reason") == "not-spot");
  CHECK(b2.at("reservation").at("releasedUnitIds").as_array().empty());
  CHECK(b2.at("reservation").at("reclaimingUnitIds").as_array().empty());
  CHECK(r2.header("ETag") == fmt::format("\"{}\"", b2.at("reservation").at("version").as_int64()));
  CHECK(lab.slept_ == std::chrono::seconds(20));  // the default grace, then destroy
  CHECK(lab.hypervisor_->find("uuid-b")->state == "shutoff");
  CHECK(lab.hypervisor_->find("uuid-odb")->state == "running");
  // Not on the market any more: a no-op.
  auto again = lab.call("POST", p + "/reclaim", mgr, fmt::format(R"({{"unitIds":["{}"]}})", U2));
  CHECK(again.status == 200);
  CHECK(Lab::body(again).at("reservation").at("version") == b2.at("reservation").at("version"));

  // Hypervisor down: without terminateSpot the unit is taken back and kept reclaiming; with it, 503 and
  // nothing changes.
  REQUIRE(lab.call("POST", p + "/release", mgr, fmt::format(R"({{"unitIds":["{}","{}"]}})", U1, U2)).status ==
          200);
  lab.hypervisor_->unavailable = true;
  auto v_before = Lab::body(lab.call("GET", p, admin)).at("version");
  auto down =
      lab.call("POST", p + "/reclaim", mgr, fmt::format(R"({{"unitIds":["{}"],"terminateSpot":true}})", U1));
  CHECK(down.status == 503);
  CHECK(Lab::body(lab.call("GET", p, admin)).at("version") == v_before);
  auto blind = lab.call("POST", p + "/reclaim", mgr, fmt::format(R"({{"unitIds":["{}"]}})", U1));
  REQUIRE(blind.status == 200);
  CHECK(Lab::body(blind).at("reservation").at("reclaimingUnitIds") == json::array{U1});
  lab.hypervisor_->unavailable = false;
  lab.refresh();  // nothing runs on U1 now
  CHECK(Lab::body(lab.call("GET", p, admin)).at("reclaimingUnitIds").as_array().empty());
  // Ending the reservation takes every unit off the market.
  REQUIRE(lab.call("POST", p + "/end", admin, "").status == 200);
  CHECK(Lab::body(lab.call("GET", p, admin)).at("releasedUnitIds").as_array().empty());
}

TEST_CASE(
    "terminations cut short (libvirt goes away mid-request, or the agent dies) are finished by the agent") {
  Lab lab;
  lab.hypervisor_->domains = two_spot_vms();
  const auto owner = lab.token(kOwner);
  const std::string ts = Lab::path("/terminate-spot");

  // libvirt goes away after the record is written, before the destroy.
  lab.hypervisor_->before_call = [&](const std::string& call) {
    if (call == "destroy") lab.hypervisor_->unavailable = true;
  };
  auto r = lab.call("POST", ts, owner, fmt::format(R"({{"unitIds":["{}"]}})", U1));
  CHECK(r.status == 503);
  CHECK(code_of(r) == "hypervisor-unavailable");
  CHECK(Lab::body(r).at("terminated").as_array().empty());
  CHECK(lab.hypervisor_->find("uuid-a")->state == "running");
  CHECK(lab.hypervisor_->find("uuid-a")->termination.has_value());  // recorded before the stop
  CHECK(lab.events("workload.terminated").empty());                 // nothing recorded as terminated
  CHECK(lab.audits("workload.terminate").size() == 1);              // only the one written ahead
  lab.refresh();                                                    // still away: nothing decided
  CHECK(lab.audits("workload.terminate").size() == 1);
  // libvirt is back: the next refresh finishes it, as the agent.
  lab.hypervisor_->before_call = nullptr;
  lab.hypervisor_->unavailable = false;
  lab.refresh();
  CHECK(lab.hypervisor_->find("uuid-a")->state == "shutoff");
  auto recs = lab.audits("workload.terminate");
  REQUIRE(recs.size() == 2);
  CHECK(recs[1].at("actor").at("via") == "agent");
  CHECK(recs[1].at("result") == "ok");
  CHECK(recs[1].at("requestId").is_null());
  auto ev = lab.events("workload.terminated");
  REQUIRE(ev.size() == 1);
  CHECK(ev[0].at("data").at("by") == kOwner);  // who decided it, not who finished it
  CHECK(ev[0].at("data").at("auditId") == recs[0].at("id"));
  lab.refresh();
  CHECK(lab.events("workload.terminated").size() == 1);  // finished once

  // The agent dies between writing the termination ahead and running it: a restart finishes it.
  const ApiRequest q = Lab::request("POST", ts, owner, fmt::format(R"({{"unitIds":["{}"]}})", U2));
  auto parked = lab.handle_listed(q);
  REQUIRE(std::holds_alternative<RunBatch>(parked));
  REQUIRE(std::get<RunBatch>(parked).work.jobs.size() == 1);
  lab.open();  // "crash": the batch never ran
  CHECK(lab.hypervisor_->find("uuid-b")->state == "running");
  lab.refresh();
  CHECK(lab.hypervisor_->find("uuid-b")->state == "shutoff");
  CHECK(lab.events("workload.terminated").size() == 2);

  // A domain that stopped while the agent was away is reported gone, not stopped again.
  lab.hypervisor_->find("uuid-b")->state = "running";
  auto parked2 = lab.handle_listed(q);
  REQUIRE(std::holds_alternative<RunBatch>(parked2));
  lab.open();
  lab.hypervisor_->domains.erase(lab.hypervisor_->domains.begin() + 1);  // transient, gone
  lab.hypervisor_->calls.clear();
  lab.refresh();
  CHECK(lab.hypervisor_->calls == std::vector<std::string>{"list"});
  CHECK(lab.events("workload.terminated").size() == 3);
  CHECK(std::string(lab.audits("workload.terminate").back().at("detail").as_string()).find("gone") !=
        std::string::npos);
}

// Everything a dry run must leave as it was: the revision, the state, the audit chain, the outbox.
struct Untouched {
  std::string state;
  std::size_t audits = 0, events = 0;
  static Untouched of(Lab& lab) {
    auto db = gpunode::store::Database::open(lab.state_ / "state.db");
    REQUIRE(db);
    auto count = [&](const char* sql) {
      auto st = db->prepare(sql);
      REQUIRE(st);
      (void)st->step();
      return static_cast<std::size_t>(st->column_int64(0));
    };
    return {lab.call("GET", Lab::path("/state"), "admin-socket").body, count("SELECT count(*) FROM audit"),
            count("SELECT count(*) FROM outbox")};
  }
  bool operator==(const Untouched&) const = default;
};

TEST_CASE(
    "dry runs (CONTRACT §12): the answer the call gives next, and nothing changed, audited or reported") {
  Lab lab;
  lab.hypervisor_->domains = spot_market_vms();
  const auto admin = lab.token("org-platform", {"platform-admin"});
  const auto mgr = lab.token("org-mgr");
  auto x = lab.create(admin, {U1, U2}, {"org-aud"}, {"org-mgr"});
  const std::string p = Lab::path("/reservations/" + std::string(x.at("id").as_string()));
  REQUIRE(lab.call("POST", p + "/release", mgr, fmt::format(R"({{"unitIds":["{}","{}"]}})", U1, U2)).status ==
          200);
  const std::vector<std::pair<std::string, std::string>> key{{"idempotency-key", "dry-1"}};

  // reclaim with terminateSpot: the VMs it would stop, the one it leaves, the reservation after.
  const auto reclaim = fmt::format(R"({{"unitIds":["{}","{}"],"terminateSpot":true}})", U1, U2);
  const auto before = Untouched::of(lab);
  auto dry = lab.call("POST", p + "/reclaim", mgr,
                      reclaim.substr(0, reclaim.size() - 1) + R"(,"dryRun":true})", key);
  REQUIRE_MESSAGE(dry.status == 200, dry.body);
  const auto d = Lab::body(dry);
  CHECK(d.at("dryRun") == true);
  CHECK(names_of(d.at("terminated")) == std::vector<std::string>{"spot-a", "spot-b"});
  CHECK(names_of(d.at("leftRunning")) == std::vector<std::string>{"od-b"});
  CHECK(Untouched::of(lab) == before);
  CHECK(lab.hypervisor_->find("uuid-a")->state == "running");
  CHECK(lab.hypervisor_->find("uuid-b")->state == "running");
  CHECK_FALSE(lab.hypervisor_->find("uuid-a")->termination);
  // Its Idempotency-Key kept nothing: the key is free for the real call.
  auto real = lab.call("POST", p + "/reclaim", mgr, reclaim, key);
  REQUIRE_MESSAGE(real.status == 200, real.body);
  const auto b = Lab::body(real);
  CHECK_FALSE(b.as_object().contains("dryRun"));
  CHECK(b.at("terminated") == d.at("terminated"));
  CHECK(b.at("leftRunning") == d.at("leftRunning"));
  CHECK(b.at("reservation") == d.at("reservation"));  // as it became, version and all
  CHECK(real.header("ETag") == dry.header("ETag"));
  CHECK(lab.hypervisor_->find("uuid-a")->state == "shutoff");

  // terminate-spot: the same, and the dry run's answer is what the real call answers next.
  lab.hypervisor_->find("uuid-a")->state = "running";
  lab.hypervisor_->find("uuid-a")->termination.reset();
  lab.refresh();  // the agent sees spot-a running again: a listing's own change, not the dry run's
  const auto owner = lab.token(kOwner);
  const auto before2 = Untouched::of(lab);
  auto dry2 =
      lab.call("POST", Lab::path("/terminate-spot"), owner, R"({"dryRun":true,"gracePeriodSeconds":30})");
  REQUIRE(dry2.status == 200);
  CHECK(Lab::body(dry2).at("dryRun") == true);
  CHECK(Untouched::of(lab) == before2);
  CHECK(lab.hypervisor_->find("uuid-a")->state == "running");
  CHECK(code_of(lab.call("POST", Lab::path("/terminate-spot"), owner, R"({"dryRun":"yes"})")) ==
        "invalid-request");
  auto real2 = lab.call("POST", Lab::path("/terminate-spot"), owner, R"({"gracePeriodSeconds":30})");
  REQUIRE(real2.status == 200);
  auto expected = Lab::body(dry2).as_object();
  expected.erase("dryRun");
  CHECK(Lab::body(real2) == json::value(expected));
}

TEST_CASE(
    "a graceful termination is announced (workload.terminating) with its deadline before the guest is "
    "asked to stop, and destroyed no earlier") {
  Lab lab;
  lab.hypervisor_->domains = two_spot_vms();
  lab.hypervisor_->ignore_shutdown = {"uuid-b"};
  const auto owner = lab.token(kOwner);
  const auto started = lab.now_;
  auto r = lab.call("POST", Lab::path("/terminate-spot"), owner,
                    fmt::format(R"({{"unitIds":["{}"],"gracePeriodSeconds":30}})", U2));
  REQUIRE(r.status == 200);
  const auto notices = lab.events("workload.terminating");
  REQUIRE(notices.size() == 1);
  const auto& n = notices[0].at("data").as_object();
  CHECK(n.at("vmId") == "vm-b");
  CHECK(n.at("domainUuid") == "uuid-b");
  CHECK(n.at("unitIds") == json::array{U2});
  CHECK(n.at("by") == kOwner);
  CHECK(n.at("deadline") == json::value(iso(started + std::chrono::seconds(30))));
  const auto pending = lab.audits("workload.terminate").front();
  CHECK(n.at("auditId") == pending.at("id"));  // the write-ahead record, the domain's audit-id
  const auto done = lab.events("workload.terminated");
  REQUIRE(done.size() == 1);
  CHECK(notices[0].at("seq").as_int64() < done[0].at("seq").as_int64());
  // The guest was asked first; the destroy came after the whole grace was waited out.
  const auto& calls = lab.hypervisor_->calls;
  const auto shut = std::find(calls.begin(), calls.end(), "shutdown uuid-b");
  const auto destroy = std::find(calls.begin(), calls.end(), "destroy uuid-b");
  REQUIRE(shut != calls.end());
  REQUIRE(destroy != calls.end());
  CHECK(shut < destroy);
  CHECK(lab.slept_ >= std::chrono::seconds(30));
  // Without a grace there is nothing to announce: destroyed at once.
  lab.hypervisor_->find("uuid-a")->state = "running";
  REQUIRE(lab.call("POST", Lab::path("/terminate-spot"), owner,
                   fmt::format(R"({{"unitIds":["{}"],"gracePeriodSeconds":0}})", U1))
              .status == 200);
  CHECK(lab.events("workload.terminating").size() == 1);
}

TEST_CASE("a termination cut short is finished within what is left of its grace (CONTRACT §11)") {
  Lab lab;
  lab.hypervisor_->domains = two_spot_vms();
  lab.hypervisor_->ignore_shutdown = {"uuid-b"};  // its guest ignores the shutdown: the grace is waited out
  const auto owner = lab.token(kOwner);
  const ApiRequest q = Lab::request("POST", Lab::path("/terminate-spot"), owner,
                                    fmt::format(R"({{"unitIds":["{}"],"gracePeriodSeconds":60}})", U2));
  auto parked = lab.handle_listed(q);
  REQUIRE(std::holds_alternative<RunBatch>(parked));
  CHECK(std::get<RunBatch>(parked).work.jobs.at(0).grace == std::chrono::seconds(60));
  // The agent stops 45 s into the grace; the next one has 15 s of it left, no more.
  lab.now_ += std::chrono::seconds(45);
  lab.open();
  lab.slept_ = {};
  lab.refresh();
  CHECK(lab.hypervisor_->find("uuid-b")->state == "shutoff");
  CHECK(lab.slept_ > std::chrono::seconds(0));
  CHECK(lab.slept_ <= std::chrono::seconds(15));
  // Past its grace: destroyed at once, with no wait.
  lab.hypervisor_->find("uuid-b")->state = "running";
  REQUIRE(std::holds_alternative<RunBatch>(lab.handle_listed(q)));
  lab.now_ += std::chrono::seconds(90);
  lab.open();
  lab.slept_ = {};
  lab.refresh();
  CHECK(lab.hypervisor_->find("uuid-b")->state == "shutoff");
  CHECK(lab.slept_ == std::chrono::milliseconds(0));
}

TEST_CASE("terminate-spot: a failed stop is reported, audited failed, never terminated") {
  Lab lab;
  lab.hypervisor_->domains = {
      vm("stuck", "uuid-s", {"0000:41:00.0"}, WorkloadLabel{"vm-s", "org-b", Tier::spot})};
  bool destroyed = false;  // destroy "works", but the domain never stops
  lab.hypervisor_->before_call = [&](const std::string& call) {
    if (call == "destroy") destroyed = true;
    if (call == "state" && destroyed) lab.hypervisor_->find("uuid-s")->state = "paused";
  };
  auto r = lab.call("POST", Lab::path("/terminate-spot"), lab.token("org-platform", {"platform-admin"}),
                    R"({"gracePeriodSeconds":0})");
  REQUIRE(r.status == 200);
  auto b = Lab::body(r);
  CHECK(b.at("terminated").as_array().empty());
  REQUIRE(b.at("leftRunning").as_array().size() == 1);
  CHECK(b.at("leftRunning").as_array()[0].at("reason") == "terminate-failed");
  CHECK(b.at("leftRunning").as_array()[0].at("vmId") == "vm-s");
  auto recs = lab.audits("workload.terminate");
  REQUIRE(recs.size() == 2);
  CHECK(recs[0].at("result") == "pending");
  CHECK(recs[1].at("result") == "failed");
  CHECK(lab.events("workload.terminated").empty());
  lab.refresh();  // not pending: not tried again behind the caller's back
  CHECK(lab.audits("workload.terminate").size() == 2);
}

TEST_CASE("terminate-spot: a termination underway is not started twice; Idempotency-Key replays the answer") {
  Lab lab;
  lab.hypervisor_->domains = two_spot_vms();
  const auto owner = lab.token(kOwner);
  const ApiRequest q = Lab::request("POST", Lab::path("/terminate-spot"), owner,
                                    fmt::format(R"({{"unitIds":["{}"],"gracePeriodSeconds":60}})", U1));
  auto first = lab.handle_listed(q);  // started, not run yet (its domain waits out a grace)
  REQUIRE(std::holds_alternative<RunBatch>(first));
  auto second = lab.call("POST", Lab::path("/terminate-spot"), owner, "{}");
  REQUIRE(second.status == 200);
  auto b = Lab::body(second);
  CHECK(names_of(b.at("terminated")) == std::vector<std::string>{"spot-b"});
  REQUIRE(b.as_object().contains("terminating"));
  CHECK(names_of(b.at("terminating")) == std::vector<std::string>{"spot-a"});
  CHECK(lab.hypervisor_->find("uuid-a")->state == "running");  // only the first call stops it
  const auto& w = std::get<RunBatch>(first).work;
  auto out = lab.service_->finish(
      w.batch, gpunode::vmctl::terminate_spot_all(*lab.hypervisor_, w.jobs, [](auto) { return true; }),
      lab.hypervisor_->list());
  CHECK(out.status == 200);
  CHECK(names_of(Lab::body(out).at("terminated")) == std::vector<std::string>{"spot-a"});
  CHECK(lab.events("workload.terminated").size() == 2);  // one per VM, never two for one

  // The same key and body replay the first answer; another body with the key is 422.
  lab.hypervisor_->find("uuid-a")->state = "running";
  const std::vector<std::pair<std::string, std::string>> key{{"idempotency-key", "k-1"}};
  auto r1 = lab.call("POST", Lab::path("/terminate-spot"), owner, "{}", key);
  REQUIRE(r1.status == 200);
  CHECK(names_of(Lab::body(r1).at("terminated")) == std::vector<std::string>{"spot-a"});
  lab.hypervisor_->find("uuid-a")->state = "running";
  auto r2 = lab.call("POST", Lab::path("/terminate-spot"), owner, "{}", key);
  CHECK(r2.status == 200);
  CHECK(r2.body == r1.body);
  CHECK(r2.header("Idempotent-Replayed") == "true");
  CHECK(lab.hypervisor_->find("uuid-a")->state == "running");  // replayed, not done again
  CHECK(code_of(lab.call("POST", Lab::path("/terminate-spot"), owner, R"({"reason":"x"})", key)) ==
        "idempotency-key-reuse");
}

TEST_CASE(
    "a request that needs workloads asks for them and changes nothing until then: the service never calls "
    "libvirt") {
  Lab lab;
  lab.hypervisor_->domains = two_spot_vms();
  const auto admin = lab.token("org-platform", {"platform-admin"});
  lab.hypervisor_->calls.clear();
  for (const auto& [method, target, body] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"GET", Lab::path("/workloads"), ""},
           {"POST", Lab::path("/terminate-spot"), "{}"},
           {"POST", Lab::path("/reservations"),
            fmt::format(R"({{"unitIds":["{}"],"audienceOrgIds":["o"],"endsAt":"2099-01-01T00:00:00Z"}})",
                        U1)}}) {
    CAPTURE(target);
    auto q = Lab::request(method, target, admin, body);
    const auto before = lab.service_->revision();
    auto asked = lab.service_->handle(q);
    CHECK(std::holds_alternative<NeedsWorkloads>(asked));
    CHECK(lab.service_->revision() == before);
    CHECK(lab.hypervisor_->calls.empty());  // the state thread never called libvirt
    q.workloads = std::make_shared<const WorkloadListing>(WorkloadListing{lab.hypervisor_->list()});
    auto answered = lab.service_->handle(q);
    CHECK((std::holds_alternative<ApiResponse>(answered) ||
           std::holds_alternative<RunBatch>(answered)));  // answered, or terminations to run
    lab.hypervisor_->calls.clear();
  }
  // A listing that failed is the hypervisor being unavailable.
  auto q = Lab::request("GET", Lab::path("/workloads"), admin);
  q.workloads = std::make_shared<const WorkloadListing>(
      WorkloadListing{std::unexpected(gpunode::vmctl::VmError{gpunode::error::Errc::unavailable, "gone"})});
  auto failed = lab.service_->handle(q);
  REQUIRE(std::holds_alternative<ApiResponse>(failed));
  CHECK(code_of(std::get<ApiResponse>(failed)) == "hypervisor-unavailable");
}

TEST_CASE(
    "Idempotency-Key: a retry while the first call still runs is 409, never a second call; rows go after 24 "
    "h") {
  Lab lab;
  lab.hypervisor_->domains = two_spot_vms();
  const auto owner = lab.token(kOwner);
  auto q = Lab::request("POST", Lab::path("/terminate-spot"), owner, R"({"gracePeriodSeconds":60})");
  q.headers.emplace_back("idempotency-key", "k-run");
  auto first = lab.handle_listed(q);  // written ahead, waiting out its grace
  REQUIRE(std::holds_alternative<RunBatch>(first));
  auto retry = lab.call_request(q);
  CHECK(retry.status == 409);
  CHECK(code_of(retry) == "idempotency-key-in-use");
  CHECK(retry.header("Retry-After") == "1");
  const auto& w = std::get<RunBatch>(first).work;
  auto out = lab.service_->finish(
      w.batch, gpunode::vmctl::terminate_spot_all(*lab.hypervisor_, w.jobs, [](auto) { return true; }),
      lab.hypervisor_->list());
  REQUIRE(out.status == 200);
  auto replay = lab.call_request(q);  // now the first answer, replayed
  CHECK(replay.body == out.body);
  CHECK(replay.header("Idempotent-Replayed") == "true");

  auto rows = [&] {
    auto db = gpunode::store::Database::open(lab.state_ / "state.db");
    REQUIRE(db);
    auto st = db->prepare("SELECT count(*) FROM idempotency");
    REQUIRE(st);
    REQUIRE(st->step().value_or(gpunode::store::Statement::Step::done) ==
            gpunode::store::Statement::Step::row);
    return st->column_int64(0);
  };
  CHECK(rows() == 1);
  lab.now_ += std::chrono::hours(23);
  lab.service_->tick();
  CHECK(rows() == 1);
  lab.now_ += std::chrono::hours(2);
  lab.service_->tick();
  CHECK(rows() == 0);
}
