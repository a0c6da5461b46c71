// gpunode/reservations/entitlement.hpp: the entitlement table of CONTRACT §4. May a workload of
// an org, at a tier, run on a unit? One pure rule with three callers: `capacity`, `admission`
// and the libvirt hook's domain admission.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/reservations/model.hpp"

namespace gpunode::reservations {

// The tiers a workload is bought at (CONTRACT §5 metadata).
enum class Tier { spot, on_demand, reserved };
std::string_view to_string(Tier tier);                  // "spot", "on-demand", "reserved"
std::optional<Tier> parse_tier(std::string_view text);  // exact contract spelling only

// What discovery says about one unit.
struct UnitFacts {
  enum class Presence { present, absent, unknown } presence = Presence::unknown;
  bool sellable = false;
  std::vector<std::string> not_sellable_codes;  // why not, when present and not sellable
};

struct Entitlement {
  std::string code;  // empty: entitled; else the reason code (unit-reserved, not-in-audience, ...)
  std::string message;
  std::optional<std::string> reservation_id;  // reserved tier: the reservation that entitles it
  bool allowed() const { return code.empty(); }
};

// The active reservation holding `unit_id`, if any (at most one: terms do not overlap).
const Reservation* active_holder(ReservationsView reservations, std::string_view unit_id);

// The table, for `unit_id` of node `node_id`:
//   absent / unknown / not sellable units entitle nobody;
//   on-demand: only on units no active reservation holds;
//   reserved:  only the audience of the active reservation holding the unit, on units it has not
//              released to the spot market;
//   spot:      only on units released by their active reservation (any org).
Entitlement entitled(std::string_view org, Tier tier, std::string_view unit_id, const UnitFacts& unit,
                     ReservationsView reservations, std::string_view node_id);

}  // namespace gpunode::reservations
