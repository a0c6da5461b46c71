// may(): CONTRACT §4's relation table, row by row: every action against every relation a caller can
// have to the node. The expected column is written from the contract's table, not from the code.
#include "gpunode/reservations/permissions.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

using namespace gpunode::reservations;

namespace {

Reservation rsv(std::string id, std::vector<std::string> audience, std::vector<std::string> managers,
                State state) {
  Reservation r;
  r.id = std::move(id);
  r.node_id = "node-1";
  r.unit_ids = {"u1"};
  r.audience_org_ids = std::move(audience);
  r.managing_org_ids = std::move(managers);
  r.state = state;
  return r;
}

const NodeView kNode{"node-1", "org-owner"};

// The callers: one per relation, and a stranger. "ex-*" held the relation through a reservation that
// has ended.
const std::map<std::string, Caller> kCallers = {
    {"admin", Caller{"a", std::nullopt, {"platform-admin"}, "https"}},
    {"operator", Caller{"o", std::nullopt, {"platform-operator"}, "https"}},
    {"owner", Caller{"w", "org-owner", {}, "https"}},
    {"manager", Caller{"m", "org-mgr", {}, "https"}},
    {"audience", Caller{"u", "org-aud", {}, "https"}},
    {"ex-manager", Caller{"x", "org-old-mgr", {}, "https"}},
    {"ex-audience", Caller{"y", "org-old-aud", {}, "https"}},
    {"stranger", Caller{"s", "org-other", {}, "https"}},
    {"no-org", Caller{"n", std::nullopt, {}, "https"}},
};

// Row: an action and the callers allowed it (on the live reservation R for actions on one, on
// org-aud for reserved-capacity); every caller not listed is refused.
struct Row {
  Action action;
  std::vector<std::string> allowed;
};

const std::vector<Row> kTable = {
    {Action::see_node, {"admin", "operator", "owner", "manager", "audience"}},
    {Action::list_units, {"admin", "operator", "owner", "manager"}},
    {Action::list_all_reservations, {"admin", "operator", "owner"}},
    {Action::see_reservation, {"admin", "operator", "owner", "manager", "audience"}},
    {Action::create, {"admin"}},
    {Action::amend, {"admin"}},
    {Action::end, {"admin"}},
    {Action::release, {"admin", "manager"}},
    {Action::reclaim, {"admin", "manager"}},
    {Action::terminate_spot, {"admin", "owner", "manager"}},
    {Action::list_workloads, {"admin", "operator", "owner"}},
    {Action::read_capacity, {"admin", "operator"}},
    {Action::ask_admission, {"admin", "operator"}},
    {Action::read_audit, {"admin", "operator", "owner"}},
    {Action::read_state, {"admin", "operator"}},
    {Action::read_reserved_capacity, {"admin", "operator", "audience"}},
};

}  // namespace

TEST_CASE("may(): CONTRACT §4's relation table, every action by every relation") {
  const std::vector<Reservation> all = {
      rsv("rsv_live", {"org-aud"}, {"org-mgr"}, State::active),
      rsv("rsv_old", {"org-old-aud"}, {"org-old-mgr"}, State::ended),
  };
  const Reservation& live = all[0];
  for (const auto& row : kTable) {
    for (const auto& [name, caller] : kCallers) {
      const bool expected = std::find(row.allowed.begin(), row.allowed.end(), name) != row.allowed.end();
      const Subject s{kNode, all, &live, "org-aud"};
      CHECK_MESSAGE(may(row.action, caller, s) == expected,
                    fmt::format("{} by {}: expected {}", to_string(row.action), name,
                                expected ? "allowed" : "refused"));
    }
  }
}

TEST_CASE("may(): an ended reservation's managers and audience still read it, and act on nothing else") {
  const std::vector<Reservation> all = {rsv("rsv_old", {"org-old-aud"}, {"org-old-mgr"}, State::ended)};
  const Subject on_old{kNode, all, &all[0], ""};
  for (const char* who : {"ex-manager", "ex-audience"}) {
    const Caller& c = kCallers.at(who);
    CHECK_MESSAGE(may(Action::see_reservation, c, on_old), who);
    CHECK_MESSAGE(!may(Action::see_node, c, on_old), who);
    CHECK_MESSAGE(!may(Action::list_units, c, on_old), who);
    CHECK_MESSAGE(!may(Action::terminate_spot, c, on_old), who);
  }
  // The manager of an ended reservation may still ask to release or reclaim it; the route answers
  // 409 reservation-not-active, not 403 (the relation is to the reservation, not to its term).
  CHECK(may(Action::release, kCallers.at("ex-manager"), on_old));
  CHECK(!may(Action::release, kCallers.at("ex-audience"), on_old));
}

TEST_CASE("may(): an action on a reservation without one named is refused, even to an admin") {
  const std::vector<Reservation> none;
  const Subject bare{kNode, none, nullptr, ""};
  for (auto a : {Action::see_reservation, Action::release, Action::reclaim})
    CHECK_MESSAGE(!may(a, kCallers.at("admin"), bare), to_string(a));
  CHECK(may(Action::see_node, kCallers.at("admin"), bare));
  CHECK(!may(Action::see_node, kCallers.at("manager"), bare));  // no reservation: no relation through one
}

TEST_CASE("may(): the org named decides reserved-capacity, not the caller's other relations") {
  const std::vector<Reservation> all = {rsv("rsv_live", {"org-aud"}, {"org-mgr"}, State::active)};
  CHECK(may(Action::read_reserved_capacity, kCallers.at("stranger"),
            Subject{kNode, all, nullptr, "org-other"}));
  CHECK(!may(Action::read_reserved_capacity, kCallers.at("owner"), Subject{kNode, all, nullptr, "org-aud"}));
  CHECK(!may(Action::read_reserved_capacity, kCallers.at("no-org"), Subject{kNode, all, nullptr, "org-aud"}));
  CHECK(!may(Action::read_reserved_capacity, kCallers.at("no-org"), Subject{kNode, all, nullptr, ""}));
}

TEST_CASE(
    "may(): an operator whose org manages a live reservation may terminate spot workloads as its manager") {
  const std::vector<Reservation> all = {rsv("rsv_live", {"org-aud"}, {"org-mgr"}, State::active)};
  const Caller operator_manager{"om", "org-mgr", {"platform-operator"}, "https"};
  const Caller operator_only{"oo", "org-other", {"platform-operator"}, "https"};
  CHECK(may(Action::terminate_spot, operator_manager, Subject{kNode, all, nullptr, ""}));
  CHECK(!may(Action::terminate_spot, operator_only, Subject{kNode, all, nullptr, ""}));
}

namespace {

// A list of shared reservations and its OrgIndex, as the service's table keeps them.
struct Indexed {
  std::vector<SharedReservation> list;
  OrgIndex orgs;
  void add(Reservation x) {
    orgs.add(x);
    list.push_back(std::make_shared<const Reservation>(std::move(x)));
  }
  ReservationsView view() const { return {std::span<const SharedReservation>(list), &orgs}; }
  ReservationsView scanned() const { return std::span<const SharedReservation>(list); }
};

}  // namespace

TEST_CASE("may(): a list's OrgIndex answers the relations through reservations as the scan does") {
  Indexed two;
  two.add(rsv("rsv_live", {"org-aud"}, {"org-mgr"}, State::active));
  two.add(rsv("rsv_old", {"org-old-aud"}, {"org-old-mgr"}, State::ended));
  const Reservation& live = *two.list[0];
  for (const auto& row : kTable) {
    for (const auto& [name, caller] : kCallers) {
      const bool expected = std::find(row.allowed.begin(), row.allowed.end(), name) != row.allowed.end();
      CHECK_MESSAGE(may(row.action, caller, Subject{kNode, two.view(), &live, "org-aud"}) == expected,
                    fmt::format("{} by {} (indexed)", to_string(row.action), name));
    }
  }

  // Random lists, changed by adds and removes: the index stays the list's, and may() agrees with a
  // scan for every action and caller.
  std::mt19937 rng(7);
  const std::vector<std::string> orgs = {"a", "b", "c", "d", "a|b", ""};
  const auto pick = [&](std::size_t n) {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back(orgs[rng() % orgs.size()]);
    return out;
  };
  for (int round = 0; round < 200; ++round) {
    Indexed t;
    for (int i = 0; i < 6; ++i) {
      t.add(rsv(fmt::format("rsv_{}", i), pick(rng() % 3), pick(rng() % 3),
                rng() % 4 == 0 ? State::ended : State::active));
    }
    for (int i = 0; i < 3; ++i) {  // a change: one replaced by another, as put() does
      const auto at = rng() % t.list.size();
      auto next = rsv(t.list[at]->id, pick(rng() % 3), pick(rng() % 3),
                      rng() % 3 == 0 ? State::ended : State::active);
      t.orgs.add(next);
      t.orgs.remove(*t.list[at]);
      t.list[at] = std::make_shared<const Reservation>(std::move(next));
    }
    OrgIndex rebuilt;
    for (const auto& x : t.list) rebuilt.add(*x);
    REQUIRE(t.orgs == rebuilt);
    for (const auto& org : orgs) {
      const Caller c{"s", org, {}, "https"};
      for (const auto& row : kTable) {
        CHECK(may(row.action, c, Subject{kNode, t.view(), nullptr, {}}) ==
              may(row.action, c, Subject{kNode, t.scanned(), nullptr, {}}));
      }
    }
  }
}

// The service asks reservation_orgs before it reads a reservation for a caller not allowed to list
// them all (routes.cpp `admits`, CONTRACT §10 "Hiding includes time"): that holds only while no
// other caller sees a reservation but through its org being among the audience or managers.
TEST_CASE("may(): a reservation is seen by a caller allowed to list them all, or by its orgs alone") {
  std::vector<Caller> callers;
  for (const auto& [name, c] : kCallers) callers.push_back(c);
  for (const std::string_view role : {"platform-operator", "platform-admin", "tenant", ""}) {
    for (const std::optional<std::string>& org :
         {std::optional<std::string>("org-owner"), std::optional<std::string>("org-aud"),
          std::optional<std::string>("org-mgr"), std::optional<std::string>(),
          std::optional<std::string>("")}) {
      callers.push_back(Caller{
          "c", org, role.empty() ? std::vector<std::string>{} : std::vector{std::string(role)}, "https"});
    }
  }
  Indexed node;
  node.add(rsv("rsv_other", {"org-aud"}, {"org-mgr"}, State::active));
  for (const auto state : {State::scheduled, State::active, State::ended}) {
    for (const auto& [audience, managers] :
         {std::pair<std::vector<std::string>, std::vector<std::string>>{{"org-aud"}, {"org-mgr"}},
          {{"org-mgr"}, {}},
          {{}, {"org-aud", "org-owner"}},
          {{}, {}}}) {
      const auto x = rsv("rsv_x", audience, managers, state);
      for (const auto& c : callers) {
        if (!may(Action::see_reservation, c, Subject{kNode, node.view(), &x, {}})) continue;
        const bool linked = c.org && (std::find(audience.begin(), audience.end(), *c.org) != audience.end() ||
                                      std::find(managers.begin(), managers.end(), *c.org) != managers.end());
        CHECK_MESSAGE(
            (may(Action::list_all_reservations, c, Subject{kNode, node.view(), nullptr, {}}) || linked),
            fmt::format("{} ({}) sees {} by neither", c.sub, c.org.value_or("no org"), x.id));
      }
    }
  }
}
