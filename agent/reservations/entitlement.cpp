// The entitlement table of CONTRACT §4 (see entitlement.hpp).
#include "gpunode/reservations/entitlement.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace gpunode::reservations {

std::string_view to_string(Tier tier) {
  switch (tier) {
    case Tier::spot:
      return "spot";
    case Tier::on_demand:
      return "on-demand";
    case Tier::reserved:
      return "reserved";
  }
  return "spot";
}

std::optional<Tier> parse_tier(std::string_view text) {
  if (text == "spot") return Tier::spot;
  if (text == "on-demand") return Tier::on_demand;
  if (text == "reserved") return Tier::reserved;
  return std::nullopt;
}

const Reservation* active_holder(ReservationsView reservations, std::string_view unit_id) {
  for (const auto& x : reservations) {
    if (x.state == State::active && x.holds_unit(unit_id)) return &x;
  }
  return nullptr;
}

Entitlement entitled(std::string_view org, Tier tier, std::string_view unit_id, const UnitFacts& unit,
                     ReservationsView reservations, std::string_view node_id) {
  switch (unit.presence) {
    case UnitFacts::Presence::absent:
      return {"absent", fmt::format("{} is no longer on the host", unit_id), {}};
    case UnitFacts::Presence::unknown:
      return {"unknown-unit", fmt::format("{} is not a unit of node {}", unit_id, node_id), {}};
    case UnitFacts::Presence::present:
      break;
  }
  if (!unit.sellable)
    return {"not-sellable",
            fmt::format("{} is not sellable: {}", unit_id, fmt::join(unit.not_sellable_codes, ", ")),
            {}};
  const auto* holder = active_holder(reservations, unit_id);
  const auto listed = [](const std::vector<std::string>& ids, std::string_view x) {
    return std::find(ids.begin(), ids.end(), x) != ids.end();
  };
  const bool released = holder && listed(holder->released_unit_ids, unit_id);
  switch (tier) {
    case Tier::on_demand:
      if (holder) return {"unit-reserved", fmt::format("{} is held by an active reservation", unit_id), {}};
      return {};
    case Tier::reserved:
      if (!holder) return {"not-reserved", fmt::format("no active reservation holds {}", unit_id), {}};
      if (!listed(holder->audience_org_ids, org))
        return {"not-in-audience", fmt::format("{} is reserved for other orgs", unit_id), {}};
      if (released) return {"unit-released", fmt::format("{} is released to the spot market", unit_id), {}};
      return {"", "", holder->id};
    case Tier::spot:
      if (!released)
        return {"not-released", fmt::format("{} is not released to the spot market", unit_id), {}};
      return {};
  }
  return {"invalid-tier", "unknown tier", {}};
}

}  // namespace gpunode::reservations
