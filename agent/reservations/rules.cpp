// Reservation rules (CONTRACT §4, §7). Pure: no I/O, the clock is an argument.
#include "gpunode/reservations/rules.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "gpunode/reservations/permissions.hpp"

namespace gpunode::reservations {
namespace {

bool contains(const std::vector<std::string>& list, std::string_view value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

}  // namespace

bool terms_overlap(Time a_start, Time a_end, Time b_start, Time b_end) {
  return a_start < b_end && b_start < a_end;
}

std::vector<std::string> blocking_reservations(const Reservation& candidate, ReservationsView existing) {
  std::vector<const Reservation*> all;
  all.reserve(existing.size());
  for (const auto& r : existing) all.push_back(&r);
  return blocking_reservations(candidate, std::span<const Reservation* const>(all));
}

std::vector<std::string> blocking_reservations(const Reservation& candidate,
                                               std::span<const Reservation* const> existing) {
  std::vector<std::string> out;
  for (const auto* p : existing) {
    const Reservation& r = *p;
    if (r.id == candidate.id || r.ended()) continue;
    if (!terms_overlap(candidate.starts_at, candidate.ends_at, r.starts_at, r.ends_at)) continue;
    const bool shares = std::any_of(candidate.unit_ids.begin(), candidate.unit_ids.end(),
                                    [&](const std::string& u) { return r.holds_unit(u); });
    if (shares) out.push_back(r.id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<Transition> due_transitions(ReservationsView reservations, Time now) {
  std::vector<Transition> out;
  for (const auto& r : reservations) {
    if (r.state == State::scheduled && r.starts_at <= now) {
      out.push_back({Transition::Kind::activate, r.id, r.starts_at});
    }
    if (r.state != State::ended && r.ends_at <= now)
      out.push_back({Transition::Kind::expire, r.id, r.ends_at});
  }
  std::sort(out.begin(), out.end(), [](const Transition& a, const Transition& b) {
    if (a.at != b.at) return a.at < b.at;
    if (a.kind != b.kind) return a.kind == Transition::Kind::activate;
    return a.reservation_id < b.reservation_id;
  });
  return out;
}

void apply(Reservation& r, const Transition& t) {
  if (t.kind == Transition::Kind::activate) {
    if (r.state == State::scheduled) r.state = State::active;
    return;
  }
  r.state = State::ended;
  r.ended_at = r.ends_at;
  r.end_reason = EndReason::term_expired;
  r.released_unit_ids.clear();
  r.reclaiming_unit_ids.clear();
}

std::vector<gpunode::json::FieldError> validate_create(const CreateRequest& q, Time now) {
  std::vector<gpunode::json::FieldError> errors;
  if (q.unit_ids.empty()) errors.push_back({"unitIds", "must name at least one unit"});
  std::set<std::string> seen;
  for (const auto& u : q.unit_ids) {
    if (u.empty()) errors.push_back({"unitIds", "unit ids must not be empty"});
    if (!seen.insert(u).second) errors.push_back({"unitIds", fmt::format("unit {} is named twice", u)});
  }
  if (q.audience_org_ids.empty()) errors.push_back({"audienceOrgIds", "must name at least one org"});
  for (const auto* list : {&q.audience_org_ids, &q.managing_org_ids}) {
    std::set<std::string> orgs;
    const char* field = list == &q.audience_org_ids ? "audienceOrgIds" : "managingOrgIds";
    for (const auto& o : *list) {
      if (o.empty()) errors.push_back({field, "org ids must not be empty"});
      if (!orgs.insert(o).second) errors.push_back({field, fmt::format("org {} is named twice", o)});
    }
  }
  const Time starts = q.starts_at.value_or(now);
  if (!q.ends_at) {
    errors.push_back({"endsAt", "is required"});
  } else {
    // Without a startsAt the term starts now: "in the future" says all there is to say.
    if (q.starts_at && *q.ends_at <= starts) errors.push_back({"endsAt", "must be after startsAt"});
    if (*q.ends_at <= now) errors.push_back({"endsAt", "must be in the future"});
  }
  if (code_points(q.note) > kMaxNote)
    errors.push_back({"note", fmt::format("must be at most {} characters", kMaxNote)});
  return errors;
}

std::size_t code_points(std::string_view utf8) {
  return static_cast<std::size_t>(std::count_if(
      utf8.begin(), utf8.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

bool is_owner(const Caller& caller, const NodeView& node) {
  return caller.org && *caller.org == node.owner_org;
}

bool manages(const Caller& caller, const Reservation& r) {
  return caller.org && contains(r.managing_org_ids, *caller.org);
}

bool in_audience(const Caller& caller, const Reservation& r) {
  return caller.org && contains(r.audience_org_ids, *caller.org);
}

std::vector<std::string> visible_reservation_ids(const Caller& caller, const NodeView& node,
                                                 ReservationsView reservations, const std::string& unit_id) {
  std::vector<std::string> out;
  for (const auto& r : reservations) {
    if (!r.ended() && r.holds_unit(unit_id) &&
        may(Action::see_reservation, caller, Subject{node, {}, &r, {}}))
      out.push_back(r.id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::set<std::string> terminate_reach(const Caller& caller, const NodeView& node,
                                      ReservationsView reservations,
                                      const std::vector<std::string>& node_units) {
  if (caller.admin() || is_owner(caller, node)) return {node_units.begin(), node_units.end()};
  std::set<std::string> out;
  for (const auto& r : reservations) {
    if (r.state != State::active || !manages(caller, r)) continue;
    out.insert(r.released_unit_ids.begin(), r.released_unit_ids.end());
    out.insert(r.reclaiming_unit_ids.begin(), r.reclaiming_unit_ids.end());
  }
  return out;
}

// ---- the spot market -----------------------------------------------------------------------
ReclaimMove reclaim_units(Reservation& r, const std::set<std::string>& named,
                          const std::set<std::string>& occupied) {
  auto has = [](const std::vector<std::string>& v, const std::string& u) {
    return std::find(v.begin(), v.end(), u) != v.end();
  };
  ReclaimMove move;
  const auto released_before = r.released_unit_ids, reclaiming_before = r.reclaiming_unit_ids;
  for (const auto& u : named) {
    const bool released = has(r.released_unit_ids, u), reclaiming = has(r.reclaiming_unit_ids, u);
    if (!released && !reclaiming) continue;  // not on the spot market: nothing to do
    if (released) move.newly_reclaimed.push_back(u);
    std::erase(r.released_unit_ids, u);
    std::erase(r.reclaiming_unit_ids, u);
    if (occupied.contains(u)) r.reclaiming_unit_ids.push_back(u);
  }
  std::sort(r.reclaiming_unit_ids.begin(), r.reclaiming_unit_ids.end());
  for (const auto& u : move.newly_reclaimed) {
    if (has(r.reclaiming_unit_ids, u)) move.still_occupied.push_back(u);
  }
  move.changed = r.released_unit_ids != released_before || r.reclaiming_unit_ids != reclaiming_before;
  return move;
}

std::vector<std::string> vacate(Reservation& r, const std::set<std::string>& occupied) {
  std::vector<std::string> vacated;
  std::erase_if(r.reclaiming_unit_ids, [&](const std::string& u) {
    if (occupied.contains(u)) return false;
    vacated.push_back(u);
    return true;
  });
  return vacated;
}

}  // namespace gpunode::reservations
