// may(): CONTRACT §4's relation table. Each action names the relations that may do it; a relation
// through a reservation holds only while that reservation has not ended, except for reading the
// reservation itself, which its managers and audience may do for ever.
#include "gpunode/reservations/permissions.hpp"

#include <algorithm>

namespace gpunode::reservations {
namespace {

// The relations of a caller to the node (§4 Relations), as flags.
struct Relations {
  bool admin = false;
  bool operator_role = false;
  bool owner = false;
  bool manager_of_any = false;   // manager of a non-ended reservation here
  bool audience_of_any = false;  // audience of a non-ended reservation here
  bool manager = false;          // of the reservation named (ended or not)
  bool audience = false;         // of the reservation named (ended or not)
  bool the_org = false;          // the caller's org is the org named
};

Relations relations_of(const Caller& c, const Subject& s, bool through_reservations) {
  Relations r;
  r.admin = c.admin();
  r.operator_role = c.operator_role();
  r.owner = is_owner(c, s.node);
  // A relation through the node's reservations matters only to a caller without a stronger one: it
  // is not looked for for an admin and the owner, who pass every rule that looks through them (an
  // operator does not: terminate-spot asks whether it manages one). The list's OrgIndex answers
  // it when the list has one (the service's table); else a scan of the list does.
  if (through_reservations && !(r.admin || r.owner) && c.org) {
    if (const auto* index = s.reservations.orgs()) {  // one lookup, the same for every org
      const auto found = index->of(*c.org);
      r.manager_of_any = found.manager;
      r.audience_of_any = found.audience;
    } else {
      for (const auto& x : s.reservations) {
        if (x.ended()) continue;
        r.manager_of_any = r.manager_of_any || manages(c, x);
        r.audience_of_any = r.audience_of_any || in_audience(c, x);
        if (r.manager_of_any && r.audience_of_any) break;
      }
    }
  }
  if (s.reservation != nullptr) {
    r.manager = manages(c, *s.reservation);
    r.audience = in_audience(c, *s.reservation);
  }
  r.the_org = !s.org.empty() && c.org && *c.org == s.org;
  return r;
}

// Whether the action's rule looks through the node's reservations (a scan of them).
bool needs_reservations(Action a) {
  return a == Action::see_node || a == Action::list_units || a == Action::terminate_spot;
}

}  // namespace

bool may(Action action, const Caller& caller, const Subject& subject) {
  const Relations r = relations_of(caller, subject, needs_reservations(action));
  const bool staff = r.admin || r.operator_role;
  const bool named = subject.reservation != nullptr;
  switch (action) {
    case Action::see_node:
      return staff || r.owner || r.manager_of_any || r.audience_of_any;
    case Action::list_units:
      return staff || r.owner || r.manager_of_any;
    case Action::list_all_reservations:
      return staff || r.owner;
    case Action::see_reservation:
      return named && (staff || r.owner || r.manager || r.audience);
    case Action::create:
    case Action::amend:
    case Action::end:
      return r.admin;
    case Action::release:
    case Action::reclaim:
      return named && (r.admin || r.manager);
    case Action::terminate_spot:
      return r.admin || r.owner || r.manager_of_any;
    case Action::list_workloads:
    case Action::read_audit:
      return staff || r.owner;
    case Action::read_capacity:
    case Action::ask_admission:
    case Action::read_state:
      return staff;
    case Action::read_reserved_capacity:
      return staff || r.the_org;
  }
  return false;
}

std::string_view to_string(Action action) {
  switch (action) {
    case Action::see_node:
      return "see-node";
    case Action::list_units:
      return "list-units";
    case Action::list_all_reservations:
      return "list-all-reservations";
    case Action::see_reservation:
      return "see-reservation";
    case Action::create:
      return "create";
    case Action::amend:
      return "amend";
    case Action::end:
      return "end";
    case Action::release:
      return "release";
    case Action::reclaim:
      return "reclaim";
    case Action::terminate_spot:
      return "terminate-spot";
    case Action::list_workloads:
      return "list-workloads";
    case Action::read_capacity:
      return "read-capacity";
    case Action::ask_admission:
      return "ask-admission";
    case Action::read_audit:
      return "read-audit";
    case Action::read_state:
      return "read-state";
    case Action::read_reserved_capacity:
      return "read-reserved-capacity";
  }
  return "unknown";
}

}  // namespace gpunode::reservations
