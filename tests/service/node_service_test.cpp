// The node's API in process: every route by every relation, the reservation rules as the API
// applies them, persistence across a reopen, terms by the clock, audit, idempotency, ETags, bodies and
// targets, history on disk. Workloads: workloads_test.cpp; terminations: terminate_test.cpp; domain
// admission and unentitled workloads: admission_test.cpp.
#include "lab.hpp"

using namespace service_test;

TEST_CASE("reserved-capacity: the node's id only for an org that sees the node (CONTRACT §10)") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  const auto node_id_for = [&](const std::string& org, const std::string& token) {
    auto r = lab.call("GET", "/v1/orgs/" + org + "/reserved-capacity", token);
    REQUIRE(r.status == 200);
    return boost::json::parse(r.body).at("nodeId");
  };
  // Nothing here for org-stranger: asking about itself, or an admin asking about it, learns no node id.
  CHECK(node_id_for("org-stranger", lab.token("org-stranger")).is_null());
  CHECK(node_id_for("org-stranger", admin).is_null());
  CHECK(node_id_for(kOwner, lab.token(kOwner)) == boost::json::value(kNode));  // the owner sees its node
  auto made = lab.create(admin, {"u-0000-41-00-0"}, {"org-aud"}, {});
  CHECK(node_id_for("org-aud", lab.token("org-aud")) == boost::json::value(kNode));
  lab.call("POST", Lab::path("/reservations/" + std::string(made.at("id").as_string()) + "/end"), admin);
  CHECK(node_id_for("org-aud", lab.token("org-aud")).is_null());  // an ended reservation shows nothing
}

TEST_CASE("every route by every relation") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  const auto oper = lab.token("org-platform", {"platform-operator"});
  const auto owner = lab.token(kOwner);
  const auto mgr = lab.token("org-mgr");
  const auto aud = lab.token("org-aud");
  const auto other = lab.token("org-other");
  const auto expired = lab.token("org-platform", {"platform-admin"}, -3600);
  auto r = lab.create(admin, {"u-0000-41-00-0"}, {"org-aud"}, {"org-mgr"});
  const std::string rid(r.at("id").as_string());

  struct Route {
    std::string method, path, body;
  };
  const std::vector<Route> routes{
      {"GET", Lab::path("/units"), ""},
      {"GET", Lab::path("/reservations"), ""},
      {"GET", Lab::path("/reservations/" + rid), ""},
      {"GET", Lab::path("/audit"), ""},
      {"GET", "/v1/orgs/org-aud/reserved-capacity", ""},
      {"PATCH", Lab::path("/reservations/" + rid), R"({"note":"x"})"},
      {"POST", Lab::path("/reservations"),
       R"({"unitIds":["u-0000-42-00-0"],"audienceOrgIds":["o"],"endsAt":"2099-01-01T00:00:00Z"})"},
  };
  // expected status per caller, in the order of `routes`
  const std::map<std::string, std::pair<std::string, std::vector<unsigned>>> table{
      {"admin", {admin, {200, 200, 200, 200, 200, 200, 201}}},
      {"operator", {oper, {200, 200, 200, 200, 200, 403, 403}}},
      {"owner", {owner, {200, 200, 200, 200, 404, 403, 403}}},
      {"manager", {mgr, {200, 200, 200, 403, 404, 403, 403}}},
      {"audience", {aud, {404, 200, 200, 403, 200, 403, 403}}},  // units: 404 (CONTRACT §7 Who reads units)
      {"unrelated", {other, {404, 404, 404, 404, 404, 404, 404}}},
      {"no token", {"", {401, 401, 401, 401, 401, 401, 401}}},
      {"expired token", {expired, {401, 401, 401, 401, 401, 401, 401}}},
      {"admin socket", {"admin-socket", {200, 200, 200, 200, 200, 200, 409}}},  // 409: admin already took 42
  };
  for (const auto& [who, spec] : table) {
    for (std::size_t i = 0; i < routes.size(); ++i) {
      CAPTURE(who);
      CAPTURE(routes[i].method);
      CAPTURE(routes[i].path);
      auto resp = lab.call(routes[i].method, routes[i].path, spec.first, routes[i].body);
      CHECK(resp.status == spec.second[i]);
      if (resp.status >= 400) {
        auto b = Lab::body(resp);
        REQUIRE(b.is_object());
        for (const char* k : {"type", "title", "status", "detail", "code", "errors"})
          CHECK(b.as_object().contains(k));
        CHECK(resp.header("Content-Type") == "application/problem+json");
      }
      if (resp.status == 401) CHECK(resp.header("WWW-Authenticate").value_or("").starts_with("Bearer"));
    }
  }
}

TEST_CASE("a 404 for an unseen node is byte-identical to an unknown node's") {
  Lab lab;
  const auto other = lab.token("org-other");
  auto a = lab.call("GET", Lab::path("/units"), other);
  auto b = lab.call("GET", "/v1/nodes/node-elsewhere/units", other);
  auto c =
      lab.call("GET", Lab::path("/reservations/rsv_nope"), lab.token("org-platform", {"platform-admin"}));
  CHECK(a.status == 404);
  CHECK(a.body == b.body);
  CHECK(a.body == c.body);
  CHECK(code_of(a) == "not-found");
}

TEST_CASE("create: validation, unknown units, reasons, overlap") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  SUBCASE("400 names every bad field") {
    auto r = lab.call("POST", Lab::path("/reservations"), admin,
                      R"({"unitIds":[],"audienceOrgIds":"x","colour":1})");
    CHECK(r.status == 400);
    std::set<std::string> fields;
    const auto b = Lab::body(r);
    for (auto& e : b.at("errors").as_array()) fields.insert(std::string(e.at("field").as_string()));
    CHECK(fields == std::set<std::string>{"unitIds", "audienceOrgIds", "colour", "endsAt"});
    CHECK(lab.call("POST", Lab::path("/reservations"), admin, "{not json").status == 400);
    CHECK(lab.call("POST", Lab::path("/reservations"), admin, "[1,2]").status == 400);
  }
  SUBCASE("422 unknown-unit, 409 unit-not-reservable with the unit's reasons") {
    auto r =
        lab.call("POST", Lab::path("/reservations"), admin,
                 R"({"unitIds":["u-0000-99-00-0"],"audienceOrgIds":["o"],"endsAt":"2099-01-01T00:00:00Z"})");
    CHECK(r.status == 422);
    CHECK(code_of(r) == "unknown-unit");
    r = lab.call("POST", Lab::path("/reservations"), admin,
                 R"({"unitIds":["u-0000-43-00-0"],"audienceOrgIds":["o"],"endsAt":"2099-01-01T00:00:00Z"})");
    CHECK(r.status == 409);
    CHECK(code_of(r) == "unit-not-reservable");
    CHECK(r.body.find("foreign-device") != std::string::npos);
  }
  SUBCASE("overlap names the blockers; back-to-back terms do not overlap") {
    auto a = lab.create(admin, {"u-0000-41-00-0"}, {"org-a"}, {}, "", "2099-01-01T00:00:00Z");
    auto r = lab.call(
        "POST", Lab::path("/reservations"), admin,
        R"({"unitIds":["u-0000-41-00-0","u-0000-42-00-0"],"audienceOrgIds":["o"],"startsAt":"2098-01-01T00:00:00Z","endsAt":"2100-01-01T00:00:00Z"})");
    CHECK(r.status == 409);
    CHECK(code_of(r) == "reservation-overlap");
    CHECK(r.body.find(std::string(a.at("id").as_string())) != std::string::npos);
    auto next =
        lab.create(admin, {"u-0000-41-00-0"}, {"org-b"}, {}, "2099-01-01T00:00:00Z", "2100-01-01T00:00:00Z");
    CHECK(next.at("state") == "scheduled");
  }
  SUBCASE("201 with Location, ETag and the reservation") {
    auto r = lab.call(
        "POST", Lab::path("/reservations"), admin,
        R"({"unitIds":["u-0000-42-00-0"],"audienceOrgIds":["org-a"],"endsAt":"2099-01-01T00:00:00Z","note":"n"})");
    REQUIRE(r.status == 201);
    auto b = Lab::body(r).as_object();
    CHECK(r.header("Location") == Lab::path("/reservations/") + std::string(b.at("id").as_string()));
    CHECK(r.header("ETag") == "\"1\"");
    CHECK(b.at("state") == "active");
    CHECK(b.at("spotWorkloads").as_array().empty());
    auto units = Lab::body(lab.call("GET", Lab::path("/units"), admin)).at("units").as_array();
    CHECK(units[1].at("reservationIds").as_array().at(0) == b.at("id"));
  }
}

TEST_CASE(
    "overlap is checked against each unit's live reservations: amends move them, ends free them, a restart "
    "keeps them") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  auto overlap_with = [&](const std::string& units, const char* from, const char* to) -> std::string {
    auto r = lab.call("POST", Lab::path("/reservations"), admin,
                      fmt::format(R"({{"unitIds":{},"audienceOrgIds":["o"],"startsAt":"{}","endsAt":"{}"}})",
                                  units, from, to));
    if (r.status == 201) return "created";
    REQUIRE_MESSAGE(r.status == 409, r.body);
    auto b = Lab::body(r);
    return std::string(b.at("blockingReservationIds").as_array().at(0).as_string());
  };
  auto a =
      lab.create(admin, {"u-0000-41-00-0"}, {"org-a"}, {}, "2098-01-01T00:00:00Z", "2098-02-01T00:00:00Z");
  auto c =
      lab.create(admin, {"u-0000-42-00-0"}, {"org-a"}, {}, "2098-03-01T00:00:00Z", "2098-04-01T00:00:00Z");
  const std::string a_id(a.at("id").as_string()), c_id(c.at("id").as_string());
  CHECK(overlap_with(R"(["u-0000-41-00-0"])", "2098-01-15T00:00:00Z", "2098-01-20T00:00:00Z") == a_id);
  lab.open();  // the index is rebuilt from what was stored
  CHECK(overlap_with(R"(["u-0000-41-00-0"])", "2098-01-15T00:00:00Z", "2098-01-20T00:00:00Z") == a_id);
  // c widened to unit 41: it blocks there now
  REQUIRE(lab.call("PATCH", Lab::path("/reservations/" + c_id), admin,
                   R"({"unitIds":["u-0000-41-00-0","u-0000-42-00-0"]})")
              .status == 200);
  CHECK(overlap_with(R"(["u-0000-41-00-0"])", "2098-03-10T00:00:00Z", "2098-03-20T00:00:00Z") == c_id);
  // ... and narrowed to unit 41 alone: unit 42 is free at that time
  REQUIRE(lab.call("PATCH", Lab::path("/reservations/" + c_id), admin, R"({"unitIds":["u-0000-41-00-0"]})")
              .status == 200);
  CHECK(overlap_with(R"(["u-0000-42-00-0"])", "2098-03-10T00:00:00Z", "2098-03-11T00:00:00Z") == "created");
  // an ended reservation blocks nothing
  REQUIRE(
      lab.call("POST", Lab::path("/reservations/" + a_id + "/end"), admin, R"({"reason":"test"})").status ==
      200);
  CHECK(overlap_with(R"(["u-0000-41-00-0"])", "2098-01-15T00:00:00Z", "2098-01-20T00:00:00Z") == "created");
  lab.open();
  CHECK(overlap_with(R"(["u-0000-41-00-0","u-0000-42-00-0"])", "2098-03-31T00:00:00Z",
                     "2098-04-02T00:00:00Z") == c_id);
}

TEST_CASE(
    "an amendment that makes a term due answers as the amendment, the same on a replay; the term follows as "
    "its own change") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  auto r = lab.create(admin, {"u-0000-41-00-0"}, {"org-a"}, {}, iso(lab.now_ + std::chrono::hours(5)),
                      iso(lab.now_ + std::chrono::hours(6)));
  const std::string p = Lab::path("/reservations/" + std::string(r.at("id").as_string()));
  const std::string body = fmt::format(R"({{"startsAt":"{}"}})", iso(lab.now_));
  auto first = lab.call("PATCH", p, admin, body, {{"idempotency-key", "amend-now"}});
  REQUIRE_MESSAGE(first.status == 200, first.body);
  CHECK(Lab::body(first).at("version") == 2);
  CHECK(Lab::body(first).at("state") == "scheduled");
  CHECK(first.header("ETag") == "\"2\"");
  auto now = Lab::body(lab.call("GET", p, admin));
  CHECK(now.at("state") == "active");
  CHECK(now.at("version") == 3);
  auto replay = lab.call("PATCH", p, admin, body, {{"idempotency-key", "amend-now"}});
  CHECK(replay.status == 200);
  CHECK(replay.body == first.body);
  CHECK(replay.header("Idempotent-Replayed") == "true");
  CHECK(lab.audits("reservation.activate").size() == 1);
}

TEST_CASE("amend is all or nothing, with If-Match; end once") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  auto r = lab.create(admin, {"u-0000-41-00-0"}, {"org-a"}, {});
  const std::string id(r.at("id").as_string()), p = Lab::path("/reservations/" + id);
  auto stale = lab.call("PATCH", p, admin, R"({"note":"a"})", {{"if-match", "\"7\""}});
  CHECK(stale.status == 412);
  CHECK(code_of(stale) == "version-mismatch");
  // one bad field: nothing changes
  auto bad = lab.call("PATCH", p, admin, R"({"note":"b","unitIds":["u-0000-41-00-0","u-0000-99-00-0"]})");
  CHECK(bad.status == 422);
  auto now = Lab::body(lab.call("GET", p, admin));
  CHECK(now.at("version") == 1);
  CHECK(now.at("note") == "");
  auto ok = lab.call("PATCH", p, admin, R"({"note":"b","unitIds":["u-0000-41-00-0","u-0000-42-00-0"]})",
                     {{"if-match", "\"1\""}});
  REQUIRE(ok.status == 200);
  CHECK(ok.header("ETag") == "\"2\"");
  CHECK(Lab::body(ok).at("unitIds").as_array().size() == 2);
  CHECK(lab.call("PATCH", p, admin, R"({"startsAt":"2099-01-01T00:00:00Z"})").status ==
        400);  // active: startsAt fixed
  auto ended = lab.call("POST", p + "/end", admin, R"({"reason":"test"})");
  REQUIRE(ended.status == 200);
  CHECK(Lab::body(ended).at("endReason") == "ended-early");
  CHECK(code_of(lab.call("POST", p + "/end", admin, "")) == "reservation-ended");
  CHECK(code_of(lab.call("PATCH", p, admin, R"({"note":"c"})")) == "reservation-ended");
}

TEST_CASE("idempotent replays") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  const std::string body =
      R"({"unitIds":["u-0000-41-00-0"],"audienceOrgIds":["o"],"endsAt":"2099-01-01T00:00:00Z"})";
  auto first = lab.call("POST", Lab::path("/reservations"), admin, body, {{"idempotency-key", "k1"}});
  REQUIRE(first.status == 201);
  auto again = lab.call("POST", Lab::path("/reservations"), admin, body, {{"idempotency-key", "k1"}});
  CHECK(again.status == 201);
  CHECK(again.body == first.body);
  auto other = lab.call("POST", Lab::path("/reservations"), admin, body + " ", {{"idempotency-key", "k1"}});
  CHECK(other.status == 422);
  CHECK(code_of(other) == "idempotency-key-reuse");
  CHECK(Lab::body(lab.call("GET", Lab::path("/reservations"), admin)).at("reservations").as_array().size() ==
        1);
}

TEST_CASE("terms apply by the clock, also across a restart, in time order, audited") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  auto t0 = lab.now_;
  auto a = lab.create(admin, {"u-0000-41-00-0"}, {"org-a"}, {}, iso(t0 + std::chrono::hours(1)),
                      iso(t0 + std::chrono::hours(2)));
  auto b = lab.create(admin, {"u-0000-42-00-0"}, {"org-b"}, {}, iso(t0 + std::chrono::minutes(30)),
                      iso(t0 + std::chrono::hours(5)));
  CHECK(a.at("state") == "scheduled");
  lab.now_ = t0 + std::chrono::minutes(45);
  auto next = lab.service_->tick();
  CHECK(next == std::chrono::time_point_cast<std::chrono::seconds>(t0 + std::chrono::hours(1)));
  auto admin2 = lab.token("org-platform", {"platform-admin"});  // the first one has expired by now
  CHECK(Lab::body(lab.call("GET", Lab::path("/reservations/") + std::string(b.at("id").as_string()), admin2))
            .at("state") == "active");
  // down for three hours: a starts and ends, both recorded, in time order, on start
  lab.service_.reset();
  lab.now_ = t0 + std::chrono::hours(3);
  lab.open();
  const auto admin3 = lab.token("org-platform", {"platform-admin"});
  auto ra =
      Lab::body(lab.call("GET", Lab::path("/reservations/") + std::string(a.at("id").as_string()), admin3));
  CHECK(ra.at("state") == "ended");
  CHECK(ra.at("endReason") == "term-expired");
  CHECK(ra.at("endedAt") == json::value(iso(t0 + std::chrono::hours(2))));
  auto records = Lab::body(lab.call("GET", Lab::path("/audit"), admin3)).at("records").as_array();
  std::vector<std::string> actions;
  for (auto& rec : records) {
    if (rec.at("reservationId") == a.at("id")) actions.emplace_back(rec.at("action").as_string());
  }
  CHECK(actions ==
        std::vector<std::string>{"reservation.create", "reservation.activate", "reservation.expire"});
  for (auto& rec : records) {
    if (rec.at("action") == "reservation.expire") {
      CHECK(rec.at("actor").at("via") == "agent");
      CHECK(rec.at("requestId").is_null());
    }
  }
  std::vector<json::object> chain;
  for (auto& rec : records) chain.push_back(rec.as_object());
  CHECK(gpunode::store::verify_chain(chain).has_value());
}

TEST_CASE("the audit log pages and chains") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  for (int i = 0; i < 5; ++i) {
    auto r =
        lab.create(admin, {"u-0000-41-00-0"}, {"org-a"}, {}, iso(lab.now_ + std::chrono::hours(10 * i + 1)),
                   iso(lab.now_ + std::chrono::hours(10 * i + 2)));
  }
  auto page1 = Lab::body(lab.call("GET", Lab::path("/audit?limit=2"), admin)).as_object();
  CHECK(page1.at("records").as_array().size() == 2);
  REQUIRE(page1.at("nextPageToken").is_string());
  auto page2 = Lab::body(lab.call("GET",
                                  Lab::path("/audit?limit=10&pageToken=") +
                                      std::string(page1.at("nextPageToken").as_string()),
                                  admin))
                   .as_object();
  CHECK(page2.at("records").as_array().size() == 3);
  CHECK(page2.at("nextPageToken").is_null());
  CHECK(page2.at("records").as_array()[0].at("prevHash") == page1.at("records").as_array()[1].at("hash"));
  auto after = Lab::body(lab.call("GET", Lab::path("/audit?after=aud_4"), admin)).at("records").as_array();
  REQUIRE(after.size() == 1);
  CHECK(after[0].at("id") == "aud_5");
  CHECK(lab.call("GET", Lab::path("/audit?limit=501"), admin).status == 400);
  CHECK(lab.call("GET", Lab::path("/audit?after=x"), admin).status == 400);
}

TEST_CASE("across a restart the chain goes on from its last record, which a commit does not copy into meta") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  auto window = [&](int i) {
    return std::pair{iso(lab.now_ + std::chrono::hours(10 * i + 1)),
                     iso(lab.now_ + std::chrono::hours(10 * i + 2))};
  };
  auto create = [&](int i) {
    auto [from, to] = window(i);
    lab.create(admin, {"u-0000-41-00-0"}, {"org-a"}, {}, from, to);
  };
  auto meta = [&](const char* key) {
    auto db = gpunode::store::Database::open(lab.state_ / "state.db");
    REQUIRE(db);
    auto st = db->prepare(fmt::format("SELECT value FROM meta WHERE key = '{}'", key));
    REQUIRE(st);
    REQUIRE(st->step().value_or(gpunode::store::Statement::Step::done) ==
            gpunode::store::Statement::Step::row);
    return st->column_text(0);
  };
  create(0);
  create(1);
  CHECK(meta("audit_seq") == "0");  // as the first migration left it
  lab.open();
  create(2);
  lab.open();
  create(3);
  auto records = Lab::body(lab.call("GET", Lab::path("/audit"), admin)).at("records").as_array();
  REQUIRE(records.size() == 4);
  CHECK(records.back().at("id") == "aud_4");
  std::vector<json::object> chain;
  for (auto& rec : records) chain.push_back(rec.as_object());
  CHECK(gpunode::store::verify_chain(chain).has_value());

  // A state an older agent left, its head in meta as well: read the same way.
  {
    auto db = gpunode::store::Database::open(lab.state_ / "state.db");
    REQUIRE(db);
    REQUIRE(db->exec(fmt::format(
        "UPDATE meta SET value = '4' WHERE key = 'audit_seq'; UPDATE meta SET value = '{}' WHERE key = "
        "'audit_last_hash'",
        std::string(records.back().at("hash").as_string()))));
  }
  lab.open();
  create(4);
  records = Lab::body(lab.call("GET", Lab::path("/audit?after=aud_4"), admin)).at("records").as_array();
  REQUIRE(records.size() == 1);
  CHECK(records[0].at("id") == "aud_5");
  CHECK(records[0].at("prevHash") == chain.back().at("hash"));

  // meta ahead of the table (records lost from it) is a state the agent refuses to open, naming both.
  lab.driver_->stop();
  lab.drain();
  lab.driver_.reset();
  lab.service_.reset();
  {
    auto db = gpunode::store::Database::open(lab.state_ / "state.db");
    REQUIRE(db);
    REQUIRE(db->exec("UPDATE meta SET value = '9' WHERE key = 'audit_seq'"));
  }
  ServiceOptions o;
  o.node_id = kNode;
  o.owner_org = kOwner;
  o.host_root = lab.tree_.root();
  o.state_dir = lab.state_;
  auto refused = NodeService::open(
      o, nullptr, nullptr, [&] { return lab.now_; }, nullptr);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().detail.find("the last audit record is aud_5, meta says aud_9 was written") !=
        std::string::npos);
  // The store's code passed on; the detail its words as they always read, the kind in front.
  CHECK(refused.error().code == gpunode::error::Errc::corrupt);
  CHECK(refused.error().detail.starts_with("corrupt (SQLITE_CORRUPT): "));
}

TEST_CASE("GETs carry an ETag and answer If-None-Match with 304") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  auto first = lab.call("GET", Lab::path("/units"), admin);
  REQUIRE(first.header("ETag"));
  auto again = lab.call("GET", Lab::path("/units"), admin, "",
                        {{"if-none-match", std::string(*first.header("ETag"))}});
  CHECK(again.status == 304);
  CHECK(again.body.empty());
}

TEST_CASE("the backstop rescan reads the host again only when a function, a driver or a group changed") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  auto reservable = [&](const char* id) {
    const auto units = Lab::body(lab.call("GET", Lab::path("/units"), admin));
    for (const auto& u : units.at("units").as_array()) {
      if (u.at("id") == id) return u.at("reservable").as_bool();
    }
    FAIL("no such unit");
    return false;
  };
  CHECK(reservable("u-0000-41-00-0"));
  const auto revision = lab.service_->revision();
  // A change no uevent announces (nor the fingerprint): the backstop does not read the host...
  lab.tree_.write(lab.tree_.dev("0000:41:00.0") / "sriov_numvfs", "garbage\n");
  lab.service_->rescan_if_changed();
  CHECK(lab.service_->revision() == revision);
  // ...an explicit rescan does (an unreadable sriov_numvfs is a fault: not reservable).
  lab.service_->rescan();
  CHECK(lab.service_->revision() > revision);
  CHECK_FALSE(reservable("u-0000-41-00-0"));
  lab.tree_.write(lab.tree_.dev("0000:41:00.0") / "sriov_numvfs", "0\n");
  lab.service_->rescan();
  CHECK(reservable("u-0000-41-00-0"));

  // A driver unbound: the backstop sees it.
  const auto before = lab.service_->revision();
  fs::remove(lab.tree_.dev("0000:42:00.0") / "driver");
  lab.service_->rescan_if_changed();
  CHECK(lab.service_->revision() > before);
  CHECK_FALSE(reservable("u-0000-42-00-0"));
  const auto after = lab.service_->revision();
  lab.service_->rescan_if_changed();  // and nothing more since
  CHECK(lab.service_->revision() == after);
}

TEST_CASE(
    "snapshot reads: any thread answers GET units, state and reservations from the published snapshot, "
    "until anything it shows may change") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"}, 120);
  const auto other = lab.token("org-platform", {"platform-admin"}, 600);
  const auto aud = lab.token("org-a", {}, 600);
  const auto& node = *lab.service_;
  const auto units = Lab::request("GET", Lab::path("/units"), admin);
  // Published at open: the first read needs no hop. Then the same bytes as the state thread.
  auto read = node.read(units, lab.now_);
  REQUIRE(read);
  const auto first = lab.call_request(units);
  REQUIRE(first.status == 200);
  CHECK(read->status == 200);
  CHECK(read->body == first.body);
  CHECK(read->header("ETag") == first.header("ETag"));
  CHECK(read->header("Content-Type") == first.header("Content-Type"));
  auto conditional = units;
  conditional.headers.emplace_back("if-none-match", std::string(*first.header("ETag")));
  auto not_modified = node.read(conditional, lab.now_);
  REQUIRE(not_modified);
  CHECK(not_modified->status == 304);
  CHECK(not_modified->body.empty());

  // Another token of the same class, another query, the admin socket: the same answer.
  CHECK(node.read(Lab::request("GET", Lab::path("/units"), other), lab.now_)->body == first.body);
  CHECK(node.read(Lab::request("GET", Lab::path("/units?x=1"), admin), lab.now_)->body == first.body);
  CHECK(node.read(Lab::request("GET", Lab::path("/units"), "admin-socket"), lab.now_)->body == first.body);
  // What the state thread answers: anything but a 200 or a 304 of these routes.
  CHECK_FALSE(node.read(Lab::request("POST", Lab::path("/units"), admin), lab.now_));
  CHECK_FALSE(node.read(Lab::request("GET", Lab::path("/units"), aud), lab.now_));              // a 404
  CHECK_FALSE(node.read(Lab::request("GET", Lab::path("/units"), "no-such-token"), lab.now_));  // a 401
  CHECK_FALSE(node.read(Lab::request("GET", Lab::path("/audit"), admin), lab.now_));
  CHECK_FALSE(node.read(Lab::request("GET", Lab::path("/workloads"), admin), lab.now_));
  CHECK_FALSE(node.read(Lab::request("GET", Lab::path("/reservations?limit=0"), admin), lab.now_));  // a 400
  CHECK_FALSE(node.read(Lab::request("GET", "/healthz", ""), lab.now_));

  // The token's expiry (exp + the 60 s leeway) ends it: the state thread answers 401 then.
  CHECK(node.read(units, lab.now_ + std::chrono::seconds(180)));
  CHECK_FALSE(node.read(units, lab.now_ + std::chrono::seconds(181)));

  // A commit moves the generation, and the committer publishes the next snapshot before the
  // change's answer is given: the old one is never answered from again, the new one at once.
  const auto t0 = lab.now_;
  auto created = lab.create(admin, {"u-0000-41-00-0"}, {"org-a"}, {}, iso(t0 + std::chrono::seconds(30)),
                            iso(t0 + std::chrono::hours(1)));
  const auto fresh = node.read(units, lab.now_);
  REQUIRE(fresh);
  CHECK(fresh->header("ETag") != first.header("ETag"));
  const auto after = lab.call_request(units);
  CHECK(fresh->body == after.body);
  // The audience sees its reservation, alone, from the snapshot too.
  const auto id = created.at("id").as_string();
  const auto mine =
      node.read(Lab::request("GET", Lab::path(fmt::format("/reservations/{}", id.c_str())), aud), lab.now_);
  REQUIRE(mine);
  CHECK(mine->header("ETag") == std::optional<std::string_view>("\"1\""));
  const auto list = node.read(Lab::request("GET", Lab::path("/reservations?state=scheduled"), aud), lab.now_);
  REQUIRE(list);
  CHECK(list->body == lab.call("GET", Lab::path("/reservations?state=scheduled"), aud).body);
  // A list that holds ended reservations is paged from the store, on the state thread.
  CHECK_FALSE(node.read(Lab::request("GET", Lab::path("/reservations"), aud), lab.now_));
  CHECK_FALSE(node.read(Lab::request("GET", Lab::path("/reservations?state=ended"), admin), lab.now_));
  // Capacity too: what org-a may place on now, the same bytes as the state thread's.
  const auto capacity = Lab::request("GET", Lab::path("/capacity?org=org-a"), admin);
  const auto from_snapshot = node.read(capacity, lab.now_);
  REQUIRE(from_snapshot);
  CHECK(from_snapshot->body == lab.call_request(capacity).body);
  CHECK_FALSE(node.read(Lab::request("GET", Lab::path("/capacity"), admin), lab.now_));          // a 400
  CHECK_FALSE(node.read(Lab::request("GET", Lab::path("/capacity?org=org-a"), aud), lab.now_));  // a 403
  // The next term (startsAt in 30 s) ends it too: the clock changes what the node shows then.
  CHECK(node.read(units, t0 + std::chrono::seconds(29)));
  CHECK_FALSE(node.read(units, t0 + std::chrono::seconds(30)));

  // State polls: one answered at once is read (the full answer past its revision, a 304 that does
  // not wait); one that waits parks on the state thread.
  const auto rev = node.revision();
  const auto past = Lab::request("GET", Lab::path(fmt::format("/state?after={}&wait=30s", rev - 1)), admin);
  CHECK(lab.call_request(past).status == 200);
  auto full = node.read(past, lab.now_);
  REQUIRE(full);
  CHECK(full->status == 200);
  CHECK(full->body == lab.call_request(past).body);
  const auto now_poll = Lab::request("GET", Lab::path(fmt::format("/state?after={}&wait=0s", rev)), admin);
  auto not_yet = node.read(now_poll, lab.now_);
  REQUIRE(not_yet);
  CHECK(not_yet->status == 304);
  CHECK(not_yet->header("ETag") == std::optional<std::string_view>(fmt::format("\"{}\"", rev)));
  const auto waiting = Lab::request("GET", Lab::path(fmt::format("/state?after={}&wait=30s", rev)), admin);
  CHECK_FALSE(node.read(waiting, lab.now_));
  CHECK(std::holds_alternative<gpunode::service::Park>(lab.service_->handle(waiting)));
  // A change ends the 304 before its own answer: the next poll sees the new revision.
  lab.create(admin, {"u-0000-42-00-0"}, {"org-a"}, {}, iso(t0 + std::chrono::hours(2)),
             iso(t0 + std::chrono::hours(3)));
  REQUIRE(node.read(now_poll, lab.now_));
  CHECK(node.read(now_poll, lab.now_)->status == 200);
  CHECK(lab.call_request(now_poll).status == 200);

  // New token keys: the old token is refused, here as on the state thread.
  REQUIRE(node.read(units, lab.now_));
  lab.service_->set_verifier(nullptr);
  CHECK_FALSE(node.read(units, lab.now_));
  CHECK(lab.call_request(units).status == 401);
}

TEST_CASE("a snapshot keeps at most 64 renderings") {
  gpunode::service::detail::Snapshot s;
  int rendered = 0;
  const auto answer_class = [](const std::string& org) {
    return gpunode::service::detail::AnswerClass{"units", "https", org, {}};
  };
  for (int i = 0; i < 200; ++i) {
    const auto org = fmt::format("org-{}", i);
    s.answer(answer_class(org), [&] {
      ++rendered;
      return ApiResponse{};
    });
  }
  CHECK(rendered == 200);
  s.answer(answer_class("org-199"), [&] {
    ++rendered;
    return ApiResponse{};
  });
  CHECK(rendered == 200);  // kept
}

TEST_CASE(
    "a restart keeps every change; a unit that disappears stays listed as absent with its reservation") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  auto r = lab.create(admin, {"u-0000-42-00-0"}, {"org-a"}, {});
  lab.service_.reset();
  fs::remove_all(lab.tree_.root() / "sys/bus/pci/devices/0000:42:00.0");
  lab.open();
  auto units = Lab::body(lab.call("GET", Lab::path("/units"), admin)).at("units").as_array();
  REQUIRE(units.size() == 3);
  auto& gone = units[1].as_object();
  CHECK(gone.at("id") == "u-0000-42-00-0");
  CHECK(gone.at("reservable") == false);
  CHECK(gone.at("notReservableReasons").as_array().back().at("code") == "absent");
  CHECK(gone.at("reservationIds").as_array().at(0) == r.at("id"));
  auto records = Lab::body(lab.call("GET", Lab::path("/audit"), admin)).at("records").as_array();
  CHECK(records.back().at("action") == "unit.absent");
  CHECK(records.back().at("actor").at("sub") == "gpunode-agent");
}

TEST_CASE(
    "a token accepted once is refused once it expires (verified tokens are remembered, their times are "
    "not)") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"}, 120);
  CHECK(lab.call("GET", Lab::path("/units"), admin).status == 200);
  CHECK(lab.call("GET", Lab::path("/units"), admin).status == 200);
  lab.now_ += std::chrono::seconds(120 + 61);  // past exp and the 60 s leeway
  auto late = lab.call("GET", Lab::path("/units"), admin);
  CHECK(late.status == 401);
  CHECK(late.body.find("expired") != std::string::npos);
}

TEST_CASE("units: an org that is only audience gets 404, byte for byte an unseen node's") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  lab.create(admin, {"u-0000-41-00-0"}, {"org-aud"}, {});
  auto aud = lab.call("GET", Lab::path("/units"), lab.token("org-aud"));
  auto unseen = lab.call("GET", "/v1/nodes/other-node/units", lab.token("org-aud"));
  CHECK(aud.status == 404);
  CHECK(aud.body == unseen.body);
  CHECK(lab.call("GET", Lab::path("/reservations"), lab.token("org-aud")).status ==
        200);  // it still sees the node
}

TEST_CASE(
    "bodies: lengths count characters; JSON errors say where; pageToken is checked; endsAt without "
    "startsAt") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  std::string note;
  for (int i = 0; i < 600; ++i) note += "\xC3\xA9";  // 600 characters, 1,200 bytes
  auto ok = lab.call(
      "POST", Lab::path("/reservations"), admin,
      fmt::format(R"({{"unitIds":["u-0000-41-00-0"],"audienceOrgIds":["o"],"endsAt":"{}","note":"{}"}})",
                  iso(lab.now_ + std::chrono::hours(1)), note));
  CHECK_MESSAGE(ok.status == 201, ok.body);
  auto dup = lab.call(
      "POST", Lab::path("/reservations"), admin,
      R"({"unitIds":["u-0000-42-00-0"],"audienceOrgIds":["o"],"endsAt":"2099-01-01T00:00:00Z","endsAt":"2098-01-01T00:00:00Z"})");
  CHECK(dup.status == 400);
  const auto detail = std::string(Lab::body(dup).at("detail").as_string());
  CHECK(detail.find("line 1, column") != std::string::npos);
  CHECK(detail.find("repeated") != std::string::npos);
  auto past =
      lab.call("POST", Lab::path("/reservations"), admin,
               R"({"unitIds":["u-0000-42-00-0"],"audienceOrgIds":["o"],"endsAt":"2001-01-01T00:00:00Z"})");
  CHECK(past.status == 400);
  CHECK(past.body.find("after startsAt") == std::string::npos);
  CHECK(past.body.find("in the future") != std::string::npos);
  CHECK(lab.call("GET", Lab::path("/reservations?pageToken=garbage"), admin).status == 400);
  CHECK(lab.call("GET", Lab::path("/audit?pageToken=garbage"), admin).status == 400);
  auto none = lab.call("GET", Lab::path("/units"), "");
  CHECK(none.status == 401);
  CHECK(none.header("WWW-Authenticate") == "Bearer");
  auto bad = lab.call("GET", Lab::path("/units"), "not-a-token");
  CHECK(bad.header("WWW-Authenticate") == "Bearer error=\"invalid_token\"");
}

TEST_CASE("the target: paths and queries are percent-decoded; a malformed one is 400 saying which part") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  // %2D is '-': the node id and the route name match once decoded.
  CHECK(lab.call("GET", std::string("/v1/nodes/") + std::string(kNode) + "/unit%73", admin).status == 200);
  // '+' and %20 are spaces in a query; a state filter with a space is not a state: 400 on `state`.
  auto spaced = lab.call("GET", Lab::path("/reservations?state=act+ive"), admin);
  CHECK(spaced.status == 400);
  CHECK(Lab::body(spaced).at("errors").at(0).at("field") == "state");
  CHECK(lab.call("GET", Lab::path("/reservations?state=%61ctive"), admin).status == 200);
  auto limit = lab.call("GET", Lab::path("/reservations?li%6Dit=1"), admin);
  CHECK(limit.status == 200);
  for (const char* target :
       {"/reservations?after=%zz", "/reservations?limit=%4", "/audit?after=aud_1&x=%G0"}) {
    auto bad = lab.call("GET", Lab::path(target), admin);
    CHECK_MESSAGE(bad.status == 400, target);
    CHECK(std::string(Lab::body(bad).at("detail").as_string())
              .starts_with("the query is not a valid URL query"));
  }
  auto bad_path = lab.call("GET", Lab::path("/units%"), admin);
  CHECK(bad_path.status == 400);
  CHECK(std::string(Lab::body(bad_path).at("detail").as_string())
            .starts_with("the path is not a valid URL path"));
}

TEST_CASE("a damaged stored unit is read without throwing: an absent unit without reasons is still refused") {
  Lab lab;
  {
    auto db = gpunode::store::Database::open(lab.state_ / "state.db");
    REQUIRE(db);
    auto st = db->prepare(
        "INSERT INTO units (id, doc, absent) VALUES ('u-0000-99-00-0', "
        "'{\"id\":\"u-0000-99-00-0\",\"notReservableReasons\":7}', 1)");
    REQUIRE(st);
    REQUIRE(st->run());
  }
  lab.open();
  auto r =
      lab.call("POST", Lab::path("/reservations"), lab.token("org-platform", {"platform-admin"}),
               R"({"unitIds":["u-0000-99-00-0"],"audienceOrgIds":["o"],"endsAt":"2099-01-01T00:00:00Z"})");
  CHECK(r.status == 409);
  CHECK(code_of(r) == "unit-not-reservable");
  CHECK(r.body.find("absent") != std::string::npos);
}

TEST_CASE(
    "history stays on disk: ended reservations leave memory and GET state, and are paged from the store") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  const std::string u41 = "u-0000-41-00-0", u42 = "u-0000-42-00-0";
  auto end = [&](const json::object& x) {
    REQUIRE(lab.call("POST", Lab::path(fmt::format("/reservations/{}/end", x.at("id").as_string().c_str())),
                     admin)
                .status == 200);
  };
  auto ids = [](const ApiResponse& r) {
    REQUIRE_MESSAGE(r.status == 200, r.body);
    std::vector<std::string> out;
    const auto body = Lab::body(r);
    for (const auto& x : body.at("reservations").as_array()) out.emplace_back(x.at("id").as_string());
    return out;
  };
  auto id = [](const json::object& x) { return std::string(x.at("id").as_string()); };
  // Lists are in id order (ids made in one millisecond of the lab's fixed clock sort at random).
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  auto a = lab.create(admin, {u41}, {"org-a"}, {"org-m"});
  end(a);
  auto b = lab.create(admin, {u42}, {"org-b"}, {});
  end(b);
  // e: org-x was its audience and is no more (amended) when it ends; the rules decide, not the index.
  auto e = lab.create(admin, {u42}, {"org-x"}, {});
  REQUIRE(lab.call("PATCH", Lab::path("/reservations/" + id(e)), admin, R"({"audienceOrgIds":["org-y"]})")
              .status == 200);
  end(e);
  auto d = lab.create(admin, {u41}, {"org-a", "org-x"}, {});  // live: org-a and org-x see the node

  // GET state holds the live one only.
  auto state = Lab::body(lab.call("GET", Lab::path("/state"), admin));
  REQUIRE(state.at("reservations").as_array().size() == 1);
  CHECK(state.at("reservations").at(0).at("id") == d.at("id"));
  auto ended_index = *gpunode::metrics::index_of(gpunode::metrics::kReservationStates, "ended");
  CHECK(lab.service_->gauges().reservations[ended_index] == 3);

  // Paged from the store, in id order, for each caller what it sees.
  const auto all_ended = sorted({id(a), id(b), id(e)});
  CHECK(ids(lab.call("GET", Lab::path("/reservations?state=ended"), admin)) == all_ended);
  auto first = lab.call("GET", Lab::path("/reservations?state=ended&limit=2"), admin);
  CHECK(ids(first) == std::vector<std::string>{all_ended[0], all_ended[1]});
  const std::string token(Lab::body(first).at("nextPageToken").as_string());
  auto second = lab.call("GET", Lab::path("/reservations?state=ended&limit=2&pageToken=" + token), admin);
  CHECK(ids(second) == std::vector<std::string>{all_ended[2]});
  CHECK(Lab::body(second).at("nextPageToken").is_null());
  CHECK(ids(lab.call("GET", Lab::path("/reservations"), admin)) == sorted({id(a), id(b), id(e), id(d)}));
  const auto org_a = lab.token("org-a"), org_x = lab.token("org-x"), org_b = lab.token("org-b");
  CHECK(ids(lab.call("GET", Lab::path("/reservations"), org_a)) == sorted({id(a), id(d)}));
  CHECK(ids(lab.call("GET", Lab::path("/reservations?state=ended"), org_a)) ==
        std::vector<std::string>{id(a)});
  CHECK(ids(lab.call("GET", Lab::path("/reservations?state=ended&limit=1"), org_x)).empty());
  CHECK(ids(lab.call("GET", Lab::path("/reservations"), org_x)) == std::vector<std::string>{id(d)});
  CHECK(lab.call("GET", Lab::path("/reservations"), org_b).status == 404);  // sees the node no more

  // One ended reservation: read from the store, by whom may see it; acting on it is 409.
  auto got = lab.call("GET", Lab::path("/reservations/" + id(a)), org_a);
  REQUIRE(got.status == 200);
  CHECK(Lab::body(got).at("state") == "ended");
  CHECK(got.header("ETag") == std::optional<std::string_view>("\"2\""));
  CHECK(lab.call("GET", Lab::path("/reservations/" + id(e)), org_x).status == 404);
  CHECK(code_of(lab.call("POST", Lab::path("/reservations/" + id(a) + "/end"), admin)) ==
        "reservation-ended");
  CHECK(code_of(lab.call("PATCH", Lab::path("/reservations/" + id(b)), admin, R"({"note":"c"})")) ==
        "reservation-ended");
  CHECK(lab.call("GET", Lab::path("/reservations/rsv_00000000000000000000000000"), admin).status == 404);

  // After a restart: the same answers, the ended ones counted, not loaded.
  const auto before = lab.call("GET", Lab::path("/reservations"), admin).body;
  lab.open();
  const auto admin2 = lab.token("org-platform", {"platform-admin"});
  CHECK(lab.call("GET", Lab::path("/reservations"), admin2).body == before);
  CHECK(lab.service_->gauges().reservations[ended_index] == 3);
  CHECK(Lab::body(lab.call("GET", Lab::path("/state"), admin2)).at("reservations").as_array().size() == 1);
}
