// The mutating routes as plain functions (agent/service/decision.hpp): facts, a request and a
// caller in, a decision out. No SQLite, no hypervisor, no NodeService: the facts are built here,
// and the reads beyond them come from FakeLookups.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <map>

#include "decision.hpp"
#include "gpunode/reservations/rules.hpp"

namespace {

namespace r = gpunode::reservations;
namespace json = boost::json;
using namespace gpunode::service;
using namespace gpunode::service::detail;

const r::Time kNow = r::Time(std::chrono::seconds(1'800'000'000));

struct FakeLookups final : Lookups {
  std::optional<std::vector<Workload>> listed;  // nothing: NeedsWorkloads
  std::vector<Workload> starting_now;
  std::optional<ApiResponse> replay;  // an Idempotency-Key's stored answer
  mutable std::vector<std::chrono::milliseconds> asked;
  mutable int ids = 0;

  std::expected<std::optional<IdempotencyDraft>, ApiResponse> idempotency(const ApiRequest& q,
                                                                          const Caller&) const override {
    if (replay) return std::unexpected(*replay);
    if (auto key = q.header("idempotency-key"))
      return IdempotencyDraft{"caller", std::string(*key), "fp", {}};
    return std::nullopt;
  }
  WorkloadsOrNot workloads(std::chrono::milliseconds max_age) const override {
    asked.push_back(max_age);
    if (!listed) return std::unexpected(NeedsWorkloads{});
    return &*listed;
  }
  std::vector<Workload> starting() const override { return starting_now; }
  const r::Reservation* reservation(std::string_view, std::optional<r::Reservation>&) const override {
    return nullptr;
  }
  std::string new_id(std::string_view prefix) const override {
    return std::string(prefix) + std::to_string(++ids);
  }
};

Inventory inventory_of(std::initializer_list<std::string> ids) {
  std::vector<gpunode::discovery::Unit> units;
  for (const auto& id : ids) {
    gpunode::discovery::Unit u;
    u.id = id;
    u.sellable = u.reservable = true;
    units.push_back(u);
  }
  return Inventory{}.scan(units, {}, [](const std::string&) { return std::optional<json::object>(); }).next;
}

Caller admin() {
  return Caller{r::Caller{"ops", std::nullopt, {"platform-admin"}, "https"}};
}
Caller org(std::string o) {
  return Caller{r::Caller{"someone", std::move(o), {}, "https"}};
}

Workload vm(std::string name, std::string org_id, gpunode::vmctl::Tier tier, std::vector<std::string> units) {
  gpunode::vmctl::Domain d;
  d.uuid = "uuid-" + name;
  d.name = name;
  d.state = "running";
  d.label = gpunode::vmctl::WorkloadLabel{"vm-" + name, std::move(org_id), tier};
  return Workload{std::move(d), std::move(units)};
}

ApiRequest post(std::string path, json::object body) {
  ApiRequest q;
  q.method = "POST";
  q.path = q.target = std::move(path);
  q.body = json::serialize(body);
  q.request_id = "req-1";
  return q;
}

r::Reservation active(std::string id, std::vector<std::string> units,
                      std::vector<std::string> managers = {}) {
  r::Reservation x;
  x.id = std::move(id);
  x.node_id = "node-1";
  x.unit_ids = std::move(units);
  x.audience_org_ids = {"org-a"};
  x.managing_org_ids = std::move(managers);
  x.starts_at = kNow - std::chrono::hours(1);
  x.ends_at = kNow + std::chrono::hours(24);
  x.state = r::State::active;
  x.created_at = x.updated_at = x.starts_at;
  x.version = 1;
  return x;
}

// The facts of a node with units u-1..u-3 and the given reservations.
struct Node {
  FakeLookups ask;
  ReservationTable reservations;
  r::LiveIndex live;
  Inventory inventory = inventory_of({"u-1", "u-2", "u-3"});
  explicit Node(std::vector<r::Reservation> xs = {}) {
    for (const auto& x : xs) reservations.put(x);
    for (const auto& x : reservations) live.follow(nullptr, &x);
  }
  Facts facts() const {
    return Facts{.node = {"node-1", "owner"},
                 .reservations = reservations,
                 .live = live,
                 .inventory = inventory,
                 .now = kNow,
                 .shutdown_grace = std::chrono::seconds(30),
                 .ask = ask};
  }
};

json::object create_body(std::vector<std::string> units, std::string starts) {
  json::array u;
  for (auto& x : units) u.emplace_back(x);
  json::object b{
      {"unitIds", u}, {"audienceOrgIds", json::array{"org-a"}}, {"endsAt", "2030-01-01T00:00:00Z"}};
  if (!starts.empty()) b["startsAt"] = starts;
  return b;
}

int status_of(const Decision& d) {
  if (const auto* a = std::get_if<ApiResponse>(&d)) return static_cast<int>(a->status);
  if (const auto* c = std::get_if<CommitThen>(&d)) return static_cast<int>(c->answer.status);
  return 0;
}

}  // namespace

TEST_CASE("create: the change to commit and its answer, decided without a store") {
  Node n;
  n.ask.listed = std::vector<Workload>{};
  const auto q = post("/v1/nodes/node-1/reservations", create_body({"u-1"}, ""));
  auto d = routes::create(n.facts(), q, admin());
  auto* c = std::get_if<CommitThen>(&d);
  REQUIRE(c != nullptr);
  CHECK(c->answer.status == 201);
  REQUIRE(c->change.upserts.size() == 1);
  CHECK(c->change.upserts[0].id == "rsv_1");
  CHECK(c->change.upserts[0].state == r::State::active);
  REQUIRE(c->change.audits.size() == 1);
  CHECK(c->change.audits[0].action == "reservation.create");
  REQUIRE(c->change.events.size() == 1);
  CHECK(c->change.events[0].type == "reservation.created");
  CHECK(c->change.at == kNow);
  CHECK(c->log.has_value());
  CHECK_FALSE(c->apply_terms);
  CHECK(n.ask.asked == std::vector<std::chrono::milliseconds>{kOccupancyListAge});
}

TEST_CASE("create: refusals are answers, and nothing is asked of the hypervisor before the checks pass") {
  Node n({active("rsv_x", {"u-2"})});
  SUBCASE("a platform admin only") {
    CHECK(status_of(routes::create(n.facts(), post("/p", create_body({"u-1"}, "")), org("org-a"))) == 403);
  }
  SUBCASE("an unknown unit") {
    CHECK(status_of(routes::create(n.facts(), post("/p", create_body({"u-9"}, "")), admin())) == 422);
  }
  SUBCASE("overlap") {
    CHECK(status_of(routes::create(n.facts(), post("/p", create_body({"u-2"}, "")), admin())) == 409);
  }
  SUBCASE("a bad body") {
    CHECK(status_of(routes::create(n.facts(), post("/p", json::object{{"unitIds", 3}}), admin())) == 400);
  }
  CHECK(n.ask.asked.empty());
}

TEST_CASE("create: the occupancy check needs the domains only when the term starts now") {
  Node n;
  SUBCASE("starting now: needs the domains (nothing decided yet)") {
    auto d = routes::create(n.facts(), post("/p", create_body({"u-1"}, "")), admin());
    CHECK(std::holds_alternative<NeedsWorkloads>(d));
  }
  SUBCASE("starting tomorrow: no list asked") {
    auto d = routes::create(n.facts(), post("/p", create_body({"u-1"}, "2027-12-01T00:00:00Z")), admin());
    REQUIRE(std::holds_alternative<CommitThen>(d));
    CHECK(std::get<CommitThen>(d).change.upserts[0].state == r::State::scheduled);
    CHECK(n.ask.asked.empty());
  }
  SUBCASE("a foreign VM blocks; a spot VM is listed; the audience's own VM is allowed") {
    n.ask.listed = std::vector<Workload>{vm("foreign", "org-z", gpunode::vmctl::Tier::on_demand, {"u-1"})};
    CHECK(status_of(routes::create(n.facts(), post("/p", create_body({"u-1"}, "")), admin())) == 409);
    n.ask.listed = std::vector<Workload>{vm("spot", "org-z", gpunode::vmctl::Tier::spot, {"u-1"}),
                                         vm("own", "org-a", gpunode::vmctl::Tier::on_demand, {"u-1"})};
    auto d = routes::create(n.facts(), post("/p", create_body({"u-1"}, "")), admin());
    REQUIRE(std::holds_alternative<CommitThen>(d));
    const auto body = json::parse(std::get<CommitThen>(d).answer.body).as_object();
    CHECK(body.at("spotWorkloads").as_array().size() == 1);
  }
  SUBCASE("a domain the hook let through that is still starting blocks too") {
    n.ask.listed = std::vector<Workload>{};
    n.ask.starting_now = {vm("starting", "org-z", gpunode::vmctl::Tier::reserved, {"u-1"})};
    CHECK(status_of(routes::create(n.facts(), post("/p", create_body({"u-1"}, "")), admin())) == 409);
  }
}

TEST_CASE("an Idempotency-Key's stored answer is the decision, and the draft rides with the change") {
  Node n;
  n.ask.listed = std::vector<Workload>{};
  auto q = post("/p", create_body({"u-1"}, ""));
  q.headers.emplace_back("idempotency-key", "k-1");
  auto d = routes::create(n.facts(), q, admin());
  REQUIRE(std::holds_alternative<CommitThen>(d));
  REQUIRE(std::get<CommitThen>(d).change.idempotency.has_value());
  CHECK(std::get<CommitThen>(d).change.idempotency->key == "k-1");
  n.ask.replay = gpunode::service::problem(422, "idempotency-key-reuse", "x");
  CHECK(status_of(routes::create(n.facts(), q, admin())) == 422);
}

TEST_CASE("amend, end and release decide on the reservation as it is") {
  const auto x = active("rsv_a", {"u-1", "u-2"}, {"org-m"});
  Node n({x});
  SUBCASE("end: the ended reservation, its audit record and event") {
    auto d = routes::end(n.facts(), post("/p", json::object{{"reason", "done"}}), admin(), x);
    REQUIRE(std::holds_alternative<CommitThen>(d));
    const auto& c = std::get<CommitThen>(d);
    CHECK(c.change.upserts[0].state == r::State::ended);
    CHECK(c.change.upserts[0].version == 2);
    CHECK(c.change.audits[0].detail == std::optional<std::string>("done"));
    CHECK(c.change.events[0].type == "reservation.ended");
  }
  SUBCASE("end of an ended one: 409") {
    auto ended = x;
    ended.state = r::State::ended;
    CHECK(status_of(routes::end(n.facts(), post("/p", {}), admin(), ended)) == 409);
  }
  SUBCASE("amend: a new endsAt, then the term is looked at again") {
    auto q = post("/p", json::object{{"endsAt", "2031-01-01T00:00:00Z"}});
    q.method = "PATCH";
    q.headers.emplace_back("content-type", "application/merge-patch+json");
    auto d = routes::amend(n.facts(), q, admin(), x);
    REQUIRE(std::holds_alternative<CommitThen>(d));
    CHECK(std::get<CommitThen>(d).apply_terms);
    CHECK(std::get<CommitThen>(d).change.upserts[0].version == 2);
  }
  SUBCASE("release by a managing org; again: the answer alone, kept only with a key") {
    const auto q = post("/p", json::object{{"unitIds", json::array{"u-1"}}});
    auto d = routes::release(n.facts(), q, org("org-m"), x);
    REQUIRE(std::holds_alternative<CommitThen>(d));
    const auto& released = std::get<CommitThen>(d).change.upserts.at(0);
    CHECK(released.released_unit_ids == std::vector<std::string>{"u-1"});
    auto again = routes::release(n.facts(), q, org("org-m"), released);
    CHECK(std::holds_alternative<ApiResponse>(again));
    CHECK(status_of(again) == 200);
  }
  SUBCASE("release by the audience: 403") {
    CHECK(status_of(routes::release(n.facts(), post("/p", json::object{{"unitIds", json::array{"u-1"}}}),
                                    org("org-a"), x)) == 403);
  }
}

TEST_CASE("terminate-spot and reclaim: terminations decided from the domains listed for the request") {
  auto x = active("rsv_a", {"u-1", "u-2"}, {"org-m"});
  x.released_unit_ids = {"u-1"};
  Node n({x});
  SUBCASE("no list: NeedsWorkloads, with nothing decided; a list of age zero is what is asked") {
    auto d = routes::terminate_spot(n.facts(), post("/p", {}), admin());
    CHECK(std::holds_alternative<NeedsWorkloads>(d));
    CHECK(n.ask.asked == std::vector<std::chrono::milliseconds>{std::chrono::milliseconds(0)});
  }
  SUBCASE("a manager reaches the released unit's spot VM, not another's") {
    n.ask.listed = std::vector<Workload>{vm("s1", "org-z", gpunode::vmctl::Tier::spot, {"u-1"}),
                                         vm("s3", "org-z", gpunode::vmctl::Tier::spot, {"u-3"})};
    auto d = routes::terminate_spot(n.facts(), post("/p", {}), org("org-m"));
    REQUIRE(std::holds_alternative<Terminate>(d));
    const auto& t = std::get<Terminate>(d);
    REQUIRE(t.plan.terminate.size() == 1);
    CHECK(t.plan.terminate[0]->domain.name == "s1");
    CHECK(t.grace == std::chrono::seconds(30));
    CHECK(t.batch.kind == Batch::Kind::terminate_spot);
    CHECK(t.change.audits.empty());  // the committer writes each termination ahead
  }
  SUBCASE("a unit outside the caller's reach: 403 out-of-reach") {
    n.ask.listed = std::vector<Workload>{};
    CHECK(status_of(routes::terminate_spot(
              n.facts(), post("/p", json::object{{"unitIds", json::array{"u-3"}}}), org("org-m"))) == 403);
  }
  SUBCASE("reclaim with terminateSpot: the unit moves to reclaiming and its spot VM is planned") {
    n.ask.listed = std::vector<Workload>{vm("s1", "org-z", gpunode::vmctl::Tier::spot, {"u-1"})};
    auto d = routes::reclaim(
        n.facts(), post("/p", json::object{{"unitIds", json::array{"u-1"}}, {"terminateSpot", true}}),
        org("org-m"), x);
    REQUIRE(std::holds_alternative<Terminate>(d));
    const auto& t = std::get<Terminate>(d);
    REQUIRE(t.change.upserts.size() == 1);
    CHECK(t.change.upserts[0].reclaiming_unit_ids == std::vector<std::string>{"u-1"});
    CHECK(t.change.events.at(0).type == "units.reclaimed");
    CHECK(t.plan.terminate.size() == 1);
  }
  SUBCASE("reclaim without a list and without terminateSpot still asks for it first") {
    auto d = routes::reclaim(n.facts(), post("/p", json::object{{"unitIds", json::array{"u-1"}}}),
                             org("org-m"), x);
    CHECK(std::holds_alternative<NeedsWorkloads>(d));
  }
}
