// NodeState (agent/service/state.hpp): what a snapshot shows, private behind the mutators that
// commit it and move its generation. Forgetting a step is impossible rather than wrong: at compile
// time, nothing but NodeState can write a change or move the generation, and its views are const;
// at run time, a table of every kind of mutation, each of which moves the generation exactly when
// what a snapshot shows changed (and the revision exactly when it stored something).
#include "state.hpp"

#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "temp_dir.hpp"

namespace {

namespace r = gpunode::reservations;
namespace json = boost::json;
using namespace gpunode::service;
using namespace gpunode::service::detail;
using Wall = std::chrono::system_clock::time_point;

// ---- at compile time: there is no other way in ----------------------------------------------------
template <class T>
constexpr bool read_only = std::is_const_v<std::remove_reference_t<T>>;
static_assert(read_only<decltype(std::declval<NodeState&>().reservations())>);
static_assert(read_only<decltype(std::declval<NodeState&>().live())>);
static_assert(read_only<decltype(std::declval<NodeState&>().term_queue())>);
static_assert(read_only<decltype(std::declval<NodeState&>().inventory())>);
static_assert(read_only<decltype(std::declval<NodeState&>().workloads())>);
static_assert(read_only<decltype(std::declval<NodeState&>().workloads_current())>);
static_assert(read_only<decltype(std::declval<NodeState&>().generation())>);
// The store's writes are NodeState's alone, and so is moving the generation.
template <class S>
concept stores_changes = requires(S& s, const Change& c) {
  s.commit(c, Wall{});
};
template <class S>
concept bumps_revision = requires(S& s) {
  s.bump_revision();
};
template <class S>
concept moves_generation = requires(S& s) {
  s.moved();
};
static_assert(!stores_changes<StateStore>);
static_assert(!bumps_revision<StateStore>);
static_assert(!moves_generation<NodeState>);

// ---- at run time ----------------------------------------------------------------------------------
const r::Time kNow = r::Time(std::chrono::seconds(1'800'000'000));

Caller agent() {
  return Caller{r::Caller{"gpunode-agent", std::nullopt, {}, "agent"}};
}

r::Reservation reservation(r::State state, int version, std::chrono::hours ends_in) {
  r::Reservation x;
  x.id = "rsv_1";
  x.node_id = "node-1";
  x.unit_ids = {"u-1"};
  x.audience_org_ids = {"org-a"};
  x.starts_at = kNow + std::chrono::hours(1);
  x.ends_at = kNow + ends_in;
  x.state = state;
  x.created_at = x.updated_at = kNow;
  x.version = version;
  return x;
}

Change upsert(r::Reservation x) {
  Change c{.actor = agent(), .at = kNow, .upserts = {std::move(x)}};
  c.audits.push_back(AuditDraft{"reservation.create", "rsv_1", {"u-1"}, {}, "ok", std::nullopt});
  return c;
}

Inventory units(std::initializer_list<const char*> ids) {
  std::vector<gpunode::discovery::Unit> present;
  for (const auto* id : ids) {
    gpunode::discovery::Unit u;
    u.id = id;
    present.push_back(std::move(u));
  }
  return Inventory{}.scan(present, {}, [](const std::string&) { return std::optional<json::object>(); }).next;
}

// Everything a snapshot is built from, as one string.
std::string shown(const NodeState& s) {
  std::string out;
  for (const auto& x : s.reservations())
    out += x.id + "/" + std::to_string(x.version) + "/" + std::string(r::to_string(x.state)) + ";";
  for (const auto& [at, id] : s.term_queue())
    out += id + "@" + std::to_string(at.time_since_epoch().count()) + ";";
  for (const auto& u : s.inventory().present()) out += "unit " + u.id + ";";
  out += json::serialize(s.workloads());
  out += s.workloads_current() ? " current" : " stale";
  out += " mode " + std::to_string(static_cast<int>(s.enforcement()));
  return out;
}

struct Mutation {
  const char* what;
  std::function<void(NodeState&)> mutate;
  bool shows_change;  // what a snapshot shows changed: the generation must move, else it must not
  bool stores;        // it wrote a change that moves the revision
};

TEST_CASE("every mutation of what a snapshot shows moves its generation, and only such a one does") {
  gpunode::test::TempDir dir;
  auto opened = StateStore::open(dir / "state.db", "node-1");
  REQUIRE(opened);
  StateStore store = std::move(*opened);
  TerminationLedger ledger;
  HealthBook health;
  NodeState state(store, ledger, health, gpunode::config::EnforcementMode::enforce);
  auto ok = [](auto done) { REQUIRE(done); };
  Change unit_rows{.actor = agent(), .at = kNow, .units = {{"u-1", {R"({"unitId":"u-1"})", false}}}};
  unit_rows.events.push_back(EventDraft{"inventory.changed", json::object{{"units", json::array{}}}});
  unit_rows.inventory_digest = "digest-1";
  Change answer_alone{.actor = agent(), .at = kNow};
  answer_alone.idempotency = IdempotencyDraft{"caller", "key-1", "fp", {}};
  const std::vector<Mutation> table{
      {"a reservation stored",
       [&](NodeState& s) {
         ok(s.apply(upsert(reservation(r::State::scheduled, 1, std::chrono::hours(5))), Wall{}));
       },
       true, true},
      {"the reservation amended",
       [&](NodeState& s) {
         ok(s.apply(upsert(reservation(r::State::scheduled, 2, std::chrono::hours(9))), Wall{}));
       },
       true, true},
      {"the reservation ended",
       [&](NodeState& s) {
         ok(s.apply(upsert(reservation(r::State::ended, 3, std::chrono::hours(9))), Wall{}));
       },
       true, true},
      {"the units, stored with a scan's change",
       [&](NodeState& s) { ok(s.replace_inventory(units({"u-1"}), &unit_rows, Wall{})); }, true, true},
      {"the units, with nothing to store",
       [&](NodeState& s) {
         ok(s.replace_inventory(units({"u-1", "u-2"}), nullptr, Wall{}));
       },
       true, false},
      {"a new list of the workloads",
       [&](NodeState& s) {
         ok(s.replace_workloads(json::array{json::object{{"name", "vm-1"}}}, "list-1"));
       },
       true, true},
      {"the same list again",
       [&](NodeState& s) {
         ok(s.replace_workloads(json::array{json::object{{"name", "vm-1"}}}, "list-1"));
       },
       false, false},
      {"the list current", [&](NodeState& s) { s.set_workloads_current(true); }, true, false},
      {"the list still current", [&](NodeState& s) { s.set_workloads_current(true); }, false, false},
      {"the enforcement mode",
       [&](NodeState& s) { s.set_enforcement(gpunode::config::EnforcementMode::audit); }, true, false},
      {"an idempotent answer alone", [&](NodeState& s) { ok(s.apply(answer_alone, Wall{})); }, false, false},
  };
  for (const auto& m : table) {
    CAPTURE(m.what);
    const auto generation = state.generation().load();
    const auto revision = store.revision();
    const auto before = shown(state);
    m.mutate(state);
    CHECK((shown(state) != before) == m.shows_change);
    CHECK((state.generation().load() != generation) == m.shows_change);
    CHECK((store.revision() != revision) == m.stores);
  }
}

}  // namespace
