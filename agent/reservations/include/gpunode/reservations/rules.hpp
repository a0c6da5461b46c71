// gpunode/reservations/rules.hpp: what a reservation may become, and who may see and do what
// (CONTRACT §4). Pure functions over plain data; the clock is an argument.
#pragma once

#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/json/field_error.hpp"
#include "gpunode/reservations/model.hpp"

namespace gpunode::reservations {

// ---- terms ---------------------------------------------------------------------------------
// Half-open intervals: [a, b) and [b, c) do not overlap.
bool terms_overlap(Time a_start, Time a_end, Time b_start, Time b_end);

// Ids of the non-ended reservations (other than `candidate.id`) that hold one of the candidate's
// units at an overlapping time, sorted.
std::vector<std::string> blocking_reservations(const Reservation& candidate, ReservationsView existing);
// The same over reservations held elsewhere (the service's per-unit index), without copying them.
std::vector<std::string> blocking_reservations(const Reservation& candidate,
                                               std::span<const Reservation* const> existing);

// What the clock alone does to reservations: activations and expiries that are due at `now`,
// in time order (an activation before an expiry at the same instant; ties by id).
struct Transition {
  enum class Kind { activate, expire } kind;
  std::string reservation_id;
  Time at;  // when it happened by the terms: starts_at or ends_at, never `now`
};
std::vector<Transition> due_transitions(ReservationsView reservations, Time now);

// Applies one transition: state, ended_at = ends_at and end_reason term-expired on expiry;
// released and reclaiming units leave the spot market when the term ends.
void apply(Reservation& r, const Transition& t);

// ---- requests --------------------------------------------------------------------------------
// A field of the request and what is wrong with it is gpunode::json::FieldError: the same type
// problem() writes into an answer (header-only, dependency-free: gpunode/json/field_error.hpp), so
// nothing converts between them.

struct CreateRequest {
  std::vector<std::string> unit_ids;
  std::vector<std::string> audience_org_ids;
  std::vector<std::string> managing_org_ids;
  std::optional<Time> starts_at;  // default: now
  std::optional<Time> ends_at;    // required
  std::string note;
};

constexpr std::size_t kMaxNote = 1024;  // note and reason, in characters (CONTRACT §7 Lengths)

// Characters (Unicode code points) of valid UTF-8 text: what the contract's lengths count.
std::size_t code_points(std::string_view utf8);

// 400 invalid-request checks of a create body (shape and values only: unit existence, overlap
// and occupancy are checked against the node's state elsewhere).
std::vector<gpunode::json::FieldError> validate_create(const CreateRequest& request, Time now);

// ---- relations -------------------------------------------------------------------------------
struct NodeView {
  std::string node_id;
  std::string owner_org;
};

bool is_owner(const Caller& caller, const NodeView& node);
bool manages(const Caller& caller, const Reservation& r);
bool in_audience(const Caller& caller, const Reservation& r);

// Who may do what (sees the node, lists units, sees a reservation, ...): permissions.hpp's may().

// The non-ended reservations holding `unit_id` that the caller sees, sorted by id.
std::vector<std::string> visible_reservation_ids(const Caller& caller, const NodeView& node,
                                                 ReservationsView reservations, const std::string& unit_id);

// terminate-spot's reach: the units on which the caller may terminate spot workloads. Admin and
// owner reach every unit of the node (`node_units`); a manager reaches the released and reclaiming
// units of the active reservations it manages; nobody else reaches any.
std::set<std::string> terminate_reach(const Caller& caller, const NodeView& node,
                                      ReservationsView reservations,
                                      const std::vector<std::string>& node_units);

// ---- the spot market (CONTRACT §4 release and reclaim) ------------------------------------
// Reclaims the `named` units of `r`: each released or reclaiming one leaves the spot market, and
// stays reclaiming while a spot workload still occupies it (`occupied`). Units not on the market
// are left alone. The lists stay sorted.
struct ReclaimMove {
  std::vector<std::string> newly_reclaimed;  // of `named`, those that were released (in id order)
  std::vector<std::string> still_occupied;   // of newly_reclaimed, those now reclaiming
  bool changed = false;                      // released or reclaiming lists differ from before
};
ReclaimMove reclaim_units(Reservation& r, const std::set<std::string>& named,
                          const std::set<std::string>& occupied);

// Removes from `r`'s reclaiming units those no spot workload occupies any more, and returns
// them (the reclaim is complete for them).
std::vector<std::string> vacate(Reservation& r, const std::set<std::string>& occupied);

}  // namespace gpunode::reservations
