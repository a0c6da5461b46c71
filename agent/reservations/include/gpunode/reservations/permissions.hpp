// gpunode/reservations/permissions.hpp: who may do what on this node (CONTRACT §4 Relations and the
// route table), as one function over plain data. The routes ask it and choose the answer a refusal
// gets (404 where the caller must not learn that the thing exists, 403 where it sees it).
#pragma once

#include <span>
#include <string_view>

#include "gpunode/reservations/model.hpp"
#include "gpunode/reservations/rules.hpp"

namespace gpunode::reservations {

enum class Action {
  see_node,               // any /v1/nodes/{nodeId}/... path
  list_units,             // GET units
  list_all_reservations,  // GET reservations: every one (else only those the caller sees)
  see_reservation,        // GET reservations/{id} (and any path below it)
  create,                 // POST reservations
  amend,                  // PATCH reservations/{id}
  end,                    // POST reservations/{id}/end
  release,                // POST reservations/{id}/release
  reclaim,                // POST reservations/{id}/reclaim
  terminate_spot,         // POST terminate-spot (the reach is terminate_reach's)
  list_workloads,         // GET workloads
  read_capacity,          // GET capacity?org=
  ask_admission,          // POST admission
  read_audit,             // GET audit
  read_state,             // GET state
  read_reserved_capacity  // GET /v1/orgs/{orgId}/reserved-capacity
};

// What an action is on: the node, its reservations (for relations through a non-ended one), the
// reservation named by the path, and the org named by the path (reserved-capacity).
struct Subject {
  const NodeView& node;
  ReservationsView reservations;
  const Reservation* reservation = nullptr;
  std::string_view org;
};

// Whether `caller` may do `action` on `subject`: the relation table of CONTRACT §4. An action on a
// reservation without one named is refused; an org no caller has is nobody's own.
[[nodiscard]] bool may(Action action, const Caller& caller, const Subject& subject);

[[nodiscard]] std::string_view to_string(Action action);

}  // namespace gpunode::reservations
