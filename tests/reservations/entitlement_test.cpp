// The entitlement table (CONTRACT §4) and the spot market's unit moves, row by row.
#include "gpunode/reservations/entitlement.hpp"

#include <doctest/doctest.h>

#include "gpunode/reservations/rules.hpp"

using namespace gpunode::reservations;

namespace {

Reservation held(std::vector<std::string> units, std::vector<std::string> released = {},
                 State state = State::active) {
  Reservation r;
  r.id = "rsv_1";
  r.node_id = "node-1";
  r.unit_ids = std::move(units);
  r.audience_org_ids = {"org-aud"};
  r.managing_org_ids = {"org-mgr"};
  r.released_unit_ids = std::move(released);
  r.state = state;
  return r;
}

const UnitFacts kSellable{UnitFacts::Presence::present, true, {}};

std::string code(std::string_view org, Tier tier, const UnitFacts& unit, const std::vector<Reservation>& rs) {
  return entitled(org, tier, "u-a", unit, rs, "node-1").code;
}

}  // namespace

TEST_CASE("tiers are spelled as the contract spells them, and only so") {
  for (auto t : {Tier::spot, Tier::on_demand, Tier::reserved}) CHECK(parse_tier(to_string(t)) == t);
  CHECK(to_string(Tier::on_demand) == "on-demand");
  CHECK_FALSE(parse_tier("on_demand").has_value());
  CHECK_FALSE(parse_tier("Spot").has_value());
  CHECK_FALSE(parse_tier("").has_value());
}

TEST_CASE("a unit that is absent, unknown or not sellable entitles nobody, at any tier") {
  const UnitFacts absent{UnitFacts::Presence::absent, false, {}};
  const UnitFacts unknown{};
  const UnitFacts unsellable{UnitFacts::Presence::present, false, {"shared-group", "unsellable"}};
  for (auto t : {Tier::spot, Tier::on_demand, Tier::reserved}) {
    CHECK(code("org-aud", t, absent, {}) == "absent");
    CHECK(code("org-aud", t, unknown, {}) == "unknown-unit");
    CHECK(code("org-aud", t, unsellable, {}) == "not-sellable");
  }
  const auto e = entitled("org-aud", Tier::on_demand, "u-a", unsellable, {}, "node-1");
  CHECK(e.message == "u-a is not sellable: shared-group, unsellable");
  CHECK(entitled("o", Tier::spot, "u-x", unknown, {}, "node-9").message ==
        "u-x is not a unit of node node-9");
}

TEST_CASE("the table: on-demand, reserved and spot on a free, a held and a released unit") {
  const std::vector<Reservation> none;
  const std::vector<Reservation> holds{held({"u-a", "u-b"})};
  const std::vector<Reservation> releases{held({"u-a", "u-b"}, {"u-a"})};
  const std::vector<Reservation> ended{held({"u-a"}, {}, State::ended)};
  const std::vector<Reservation> future{held({"u-a"}, {}, State::scheduled)};

  // a free unit
  CHECK(code("org-x", Tier::on_demand, kSellable, none) == "");
  CHECK(code("org-aud", Tier::reserved, kSellable, none) == "not-reserved");
  CHECK(code("org-x", Tier::spot, kSellable, none) == "not-released");
  // only active reservations hold a unit
  CHECK(code("org-x", Tier::on_demand, kSellable, ended) == "");
  CHECK(code("org-x", Tier::on_demand, kSellable, future) == "");
  CHECK(code("org-aud", Tier::reserved, kSellable, future) == "not-reserved");
  // a held unit
  CHECK(code("org-x", Tier::on_demand, kSellable, holds) == "unit-reserved");
  CHECK(code("org-aud", Tier::on_demand, kSellable, holds) == "unit-reserved");
  CHECK(code("org-x", Tier::reserved, kSellable, holds) == "not-in-audience");
  CHECK(code("org-mgr", Tier::reserved, kSellable, holds) == "not-in-audience");  // managing is not audience
  CHECK(code("org-aud", Tier::reserved, kSellable, holds) == "");
  CHECK(entitled("org-aud", Tier::reserved, "u-a", kSellable, holds, "node-1").reservation_id == "rsv_1");
  CHECK(code("org-aud", Tier::spot, kSellable, holds) == "not-released");
  // a released unit
  CHECK(code("org-x", Tier::spot, kSellable, releases) == "");
  CHECK(code("org-aud", Tier::spot, kSellable, releases) == "");
  CHECK(code("org-aud", Tier::reserved, kSellable, releases) == "unit-released");
  CHECK(code("org-x", Tier::on_demand, kSellable, releases) == "unit-reserved");
  CHECK(entitled("org-x", Tier::spot, "u-a", kSellable, releases, "node-1").allowed());
}

TEST_CASE("reclaim: released units leave the market; occupied ones stay reclaiming until vacated") {
  auto r = held({"u-a", "u-b", "u-c", "u-d"}, {"u-a", "u-b", "u-c"});
  r.reclaiming_unit_ids = {"u-d"};
  const auto move = reclaim_units(r, {"u-a", "u-b", "u-d"}, {"u-b", "u-d"});
  CHECK(move.changed);
  CHECK(move.newly_reclaimed == std::vector<std::string>{"u-a", "u-b"});
  CHECK(move.still_occupied == std::vector<std::string>{"u-b"});
  CHECK(r.released_unit_ids == std::vector<std::string>{"u-c"});
  CHECK(r.reclaiming_unit_ids == std::vector<std::string>{"u-b", "u-d"});

  SUBCASE("a unit not on the market is left alone") {
    auto again = reclaim_units(r, {"u-a"}, {});
    CHECK_FALSE(again.changed);
    CHECK(again.newly_reclaimed.empty());
  }
  SUBCASE("a reclaiming unit named again and vacated leaves the market") {
    auto again = reclaim_units(r, {"u-d"}, {});
    CHECK(again.changed);
    CHECK(again.newly_reclaimed.empty());
    CHECK(r.reclaiming_unit_ids == std::vector<std::string>{"u-b"});
  }
  SUBCASE("vacate removes what no spot workload occupies any more") {
    CHECK(vacate(r, {"u-d"}) == std::vector<std::string>{"u-b"});
    CHECK(r.reclaiming_unit_ids == std::vector<std::string>{"u-d"});
    CHECK(vacate(r, {"u-d"}).empty());
    CHECK(vacate(r, {}) == std::vector<std::string>{"u-d"});
    CHECK(r.reclaiming_unit_ids.empty());
  }
}
