// The node's API in process: every route by every relation, the reservation rules as the API
// applies them, persistence across a reopen, terms by the clock, audit, idempotency, ETags.
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

namespace {

gpunode::vmctl::Domain vm(std::string name, std::string uuid, std::vector<std::string> addresses,
                          std::optional<gpunode::vmctl::WorkloadLabel> label, std::string state = "running") {
  gpunode::vmctl::Domain d;
  d.name = std::move(name);
  d.uuid = std::move(uuid);
  d.pci_addresses = std::move(addresses);
  d.label = std::move(label);
  d.state = std::move(state);
  return d;
}

}  // namespace

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

namespace {

using gpunode::vmctl::Tier;
using gpunode::vmctl::WorkloadLabel;
constexpr const char* U1 = "u-0000-41-00-0";
constexpr const char* U2 = "u-0000-42-00-0";

std::vector<std::string> names_of(const json::value& list) {
  std::vector<std::string> out;
  for (const auto& x : list.as_array()) out.emplace_back(x.at("name").as_string());
  return out;
}

// spot-a on U1 (org-b) and spot-b on U2 (org-c), both running.
std::vector<gpunode::vmctl::Domain> two_spot_vms() {
  return {vm("spot-a", "uuid-a", {"0000:41:00.0"}, WorkloadLabel{"vm-a", "org-b", Tier::spot}),
          vm("spot-b", "uuid-b", {"0000:42:00.0"}, WorkloadLabel{"vm-b", "org-c", Tier::spot})};
}

// A spot VM on each of U1 and U2, and a reserved VM of the audience beside the one on U2.
std::vector<gpunode::vmctl::Domain> spot_market_vms() {
  return {vm("spot-a", "uuid-a", {"0000:41:00.0"}, WorkloadLabel{"vm-a", "org-b", Tier::spot}),
          vm("spot-b", "uuid-b", {"0000:42:00.0"}, WorkloadLabel{"vm-b", "org-c", Tier::spot}),
          vm("od-b", "uuid-odb", {"0000:42:00.0"}, WorkloadLabel{"vm-odb", "org-aud", Tier::reserved})};
}

const json::object* entry(const json::value& list, const std::string& name) {
  for (const auto& x : list.as_array()) {
    if (x.at("name").as_string() == name) return &x.as_object();
  }
  return nullptr;
}

}  // namespace

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
