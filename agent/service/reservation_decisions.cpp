// The reservation routes as decisions (decision.hpp): create, amend, end, release, admission, and
// the checks they share. Functions of the facts, the request and the caller; they change nothing.
#include <fmt/ranges.h>

#include <algorithm>
#include <span>

#include "decision.hpp"
#include "gpunode/reservations/permissions.hpp"
#include "gpunode/reservations/rules.hpp"
#include "gpunode/service/reservation_json.hpp"

namespace gpunode::service::detail {

bool Facts::allowed(r::Action action, const Caller& c, const r::Reservation* x) const {
  return r::may(action, c.who, r::Subject{node, reservations.all(), x, {}});
}

std::expected<std::optional<std::string>, ApiResponse> reason_of(const std::string& body, bool required) {
  auto o = parse_object(body, !required);
  if (!o) return std::unexpected(o.error());
  Fields fs(*o, {"reason"});
  auto reason = fs.string("reason", !required);
  if (required && fs.problems().empty() && (!reason || reason->empty()))
    fs.problems().push_back({"reason", "must say why"});
  if (reason && r::code_points(*reason) > r::kMaxNote)
    fs.problems().push_back({"reason", "must be at most 1024 characters"});
  if (!fs.problems().empty())
    return std::unexpected(problem(400, "invalid-request", "the body is not valid", fs.problems()));
  return reason;
}

std::optional<ApiResponse> check_units(const Facts& f, const std::vector<std::string>& ids) {
  std::vector<gpunode::json::FieldError> unknown;
  json::array not_reservable;
  for (const auto& id : ids) {
    const auto* u = f.inventory.find(id);
    const auto* absent = f.inventory.absent_doc(id);
    if (u == nullptr && absent == nullptr) {
      unknown.push_back({"unitIds", fmt::format("{} is not a unit of node {}", id, f.node.node_id)});
      continue;
    }
    json::array reasons;
    if (u != nullptr) {
      for (const auto& rs : u->reasons)
        reasons.emplace_back(json::object{{"code", rs.code}, {"message", rs.message}});
    } else {
      // Stored JSON: read without throwing or inserting; an absent unit is never reservable.
      if (const auto* rs = absent->if_contains("notReservableReasons"); rs != nullptr && rs->is_array())
        reasons = rs->get_array();
      if (reasons.empty())
        reasons.emplace_back(
            json::object{{"code", "absent"}, {"message", "the unit was seen before and is gone now"}});
    }
    if (!reasons.empty())
      not_reservable.emplace_back(json::object{{"unitId", id}, {"reasons", std::move(reasons)}});
  }
  if (!unknown.empty()) return problem(422, "unknown-unit", "some units are not units of this node", unknown);
  if (!not_reservable.empty()) {
    json::object extra{{"units", not_reservable}};
    return problem(409, "unit-not-reservable", "some units cannot be reserved", {}, &extra);
  }
  return std::nullopt;
}

std::optional<ApiResponse> check_overlap(const Facts& f, const r::Reservation& candidate) {
  // Only the live reservations on its units whose terms come near can block it; the rule decides.
  std::vector<const r::Reservation*> near;
  for (const auto id : f.live.near(candidate.unit_ids, candidate.starts_at, candidate.ends_at)) {
    if (const auto* x = f.reservations.find(id)) near.push_back(x);
  }
  auto blockers = r::blocking_reservations(candidate, std::span<const r::Reservation* const>(near));
  if (blockers.empty()) return std::nullopt;
  json::object extra{{"blockingReservationIds", strings_json(blockers)}};
  return problem(409, "reservation-overlap",
                 fmt::format("the units are held at overlapping times by {}", fmt::join(blockers, ", ")), {},
                 &extra);
}

namespace {

bool on_any(const Workload& w, const std::vector<std::string>& units) {
  return std::any_of(w.unit_ids.begin(), w.unit_ids.end(), [&](const std::string& u) {
    return std::find(units.begin(), units.end(), u) != units.end();
  });
}

json::object spot_json(const Workload& w) {
  return vm_json({w.domain.label, w.domain.uuid, w.domain.name, w.unit_ids},
                 {VmKey::vm_id, VmKey::domain_uuid, VmKey::name, VmKey::org, VmKey::unit_ids});
}

// The body's problems, then the rules' for the fields the body did not already fault.
std::vector<gpunode::json::FieldError> with_rule_problems(std::vector<gpunode::json::FieldError> problems,
                                                          std::vector<gpunode::json::FieldError> rules) {
  for (auto& e : rules) {
    if (std::none_of(problems.begin(), problems.end(),
                     [&](const gpunode::json::FieldError& p) { return p.field == e.field; }))
      problems.push_back(std::move(e));
  }
  return problems;
}

}  // namespace

// Occupancy of `checked` units once the term has started: a workload that is not spot, of an
// org outside the audience (or unlabelled), blocks (409 unit-occupied); spot workloads are
// allowed and listed.
std::optional<Decision> check_occupancy(const Facts& f, const r::Reservation& x,
                                        const std::vector<std::string>& checked, json::array& spot) {
  if (x.starts_at > f.now || checked.empty()) return std::nullopt;
  auto ws = f.ask.workloads(kOccupancyListAge);
  if (!ws) return refused(std::move(ws.error()));
  // Active domains hold their units; so do those the hook let through that are still starting
  // (the start race, CONTRACT §9): libvirt lists them only once they run.
  const std::vector<Workload> starting = f.ask.starting();
  std::vector<const Workload*> holding;
  for (const auto& w : **ws) {
    if (w.domain.active()) holding.push_back(&w);
  }
  for (const auto& w : starting) holding.push_back(&w);
  json::array blockers;
  for (const auto* held : holding) {
    const auto& w = *held;
    if (!on_any(w, checked)) continue;
    const auto& label = w.domain.label;
    if (label && label->tier == vmctl::Tier::spot) {
      spot.emplace_back(spot_json(w));
      continue;
    }
    if (label && std::find(x.audience_org_ids.begin(), x.audience_org_ids.end(), label->org) !=
                     x.audience_org_ids.end())
      continue;
    blockers.emplace_back(vm_json({label, w.domain.uuid, w.domain.name, w.unit_ids},
                                  {VmKey::vm_id, VmKey::domain_uuid, VmKey::name}));
  }
  if (blockers.empty()) return std::nullopt;
  json::object extra{{"workloads", blockers}};
  return problem(409, "unit-occupied", "workloads of orgs outside the audience are running on the units", {},
                 &extra);
}

namespace routes {

Decision create(const Facts& f, const ApiRequest& q, const Caller& c) {
  if (!f.allowed(r::Action::create, c)) return forbidden("only a platform admin reserves units");
  auto idem = f.ask.idempotency(q, c);
  if (!idem) return std::move(idem.error());
  auto body = parse_object(q.body, false);
  if (!body) return body.error();
  Fields fs(*body, {"unitIds", "audienceOrgIds", "managingOrgIds", "startsAt", "endsAt", "note"});
  r::CreateRequest req;
  req.unit_ids = fs.strings("unitIds").value_or(std::vector<std::string>{});
  req.audience_org_ids = fs.strings("audienceOrgIds").value_or(std::vector<std::string>{});
  req.managing_org_ids = fs.strings("managingOrgIds").value_or(std::vector<std::string>{});
  req.starts_at = fs.time("startsAt");
  req.ends_at = fs.time("endsAt");
  req.note = fs.string("note").value_or("");
  const r::Time t = f.now;
  auto problems = with_rule_problems(std::move(fs.problems()), r::validate_create(req, t));
  if (!problems.empty())
    return problem(400, "invalid-request", "the body is not a valid reservation request", problems);
  if (auto bad = check_units(f, req.unit_ids)) return *bad;

  r::Reservation x;
  x.id = f.ask.new_id("rsv_");
  x.node_id = f.node.node_id;
  x.unit_ids = req.unit_ids;
  x.audience_org_ids = req.audience_org_ids;
  x.managing_org_ids = req.managing_org_ids;
  x.starts_at = req.starts_at.value_or(t);
  x.ends_at = *req.ends_at;
  x.state = x.starts_at <= t ? r::State::active : r::State::scheduled;
  x.note = req.note;
  x.created_at = x.updated_at = t;
  x.version = 1;
  if (auto overlap = check_overlap(f, x)) return *overlap;
  json::array spot;
  if (auto occupied = check_occupancy(f, x, x.unit_ids, spot)) return std::move(*occupied);

  Change ch{.actor = c, .request_id = q.request_id, .at = t, .upserts = {x}, .idempotency = std::move(*idem)};
  ch.audits.push_back(AuditDraft{"reservation.create", x.id, x.unit_ids, {}, "ok", std::nullopt});
  auto body_out = to_json(x);
  ch.events.push_back(EventDraft{"reservation.created", json::object{{"reservation", body_out}}});
  body_out["spotWorkloads"] = std::move(spot);
  ApiResponse resp = json_response(body_out, 201);
  resp.headers.emplace_back("Location", fmt::format("/v1/nodes/{}/reservations/{}", f.node.node_id, x.id));
  resp.headers.emplace_back("ETag", entity_tag(x.version));
  return CommitThen{.change = std::move(ch),
                    .answer = std::move(resp),
                    .log = fmt::format("RESERVATION={} created by {} UNITS={}", x.id, c.who.sub,
                                       fmt::join(x.unit_ids, ","))};
}

namespace {

// The amendment's body applied to `current`, or the 400.
std::expected<r::Reservation, ApiResponse> amended(const Facts& f, const json::object& body,
                                                   const r::Reservation& current) {
  Fields fs(body, {"unitIds", "audienceOrgIds", "managingOrgIds", "startsAt", "endsAt", "note"});
  r::Reservation x = current;
  if (auto v = fs.strings("unitIds")) x.unit_ids = *v;
  if (auto v = fs.strings("audienceOrgIds")) x.audience_org_ids = *v;
  if (auto v = fs.strings("managingOrgIds")) x.managing_org_ids = *v;
  if (auto v = fs.string("note")) x.note = *v;
  if (fs.has("startsAt")) {
    if (auto v = fs.time("startsAt")) {
      if (current.state != r::State::scheduled) {
        fs.problems().push_back({"startsAt", "can change only while the reservation is scheduled"});
      } else {
        x.starts_at = *v;
      }
    }
  }
  if (auto v = fs.time("endsAt")) x.ends_at = *v;
  r::CreateRequest check{x.unit_ids, x.audience_org_ids, x.managing_org_ids, x.starts_at, x.ends_at, x.note};
  auto rules = r::validate_create(check, f.now);
  std::erase_if(rules, [&](const gpunode::json::FieldError& e) {
    return e.field == "endsAt" && !body.contains("endsAt") && !body.contains("startsAt");
  });
  auto problems = with_rule_problems(std::move(fs.problems()), std::move(rules));
  if (!problems.empty())
    return std::unexpected(problem(400, "invalid-request", "the body is not a valid amendment", problems));
  return x;
}

}  // namespace

Decision amend(const Facts& f, const ApiRequest& q, const Caller& c, const r::Reservation& current) {
  if (!f.allowed(r::Action::amend, c, &current))
    return forbidden("only a platform admin amends reservations");
  const auto ct = q.header("content-type").value_or("");
  if (!ct.starts_with("application/merge-patch+json") && !ct.starts_with("application/json")) {
    return problem(415, "unsupported-media-type", "send application/merge-patch+json or application/json");
  }
  auto idem = f.ask.idempotency(q, c);
  if (!idem) return std::move(idem.error());
  if (auto m = q.header("if-match"); m && !etag_matches(*m, entity_tag(current.version))) {
    return problem(412, "version-mismatch", fmt::format("the reservation is at version {}", current.version));
  }
  if (current.ended()) return problem(409, "reservation-ended", "an ended reservation cannot be amended");
  auto body = parse_object(q.body, false);
  if (!body) return body.error();
  auto next = amended(f, *body, current);
  if (!next) return std::move(next.error());
  r::Reservation& x = *next;
  std::vector<std::string> added;
  for (const auto& u : x.unit_ids) {
    if (!current.holds_unit(u)) added.push_back(u);
  }
  if (auto bad = check_units(f, added)) return *bad;
  if (auto overlap = check_overlap(f, x)) return *overlap;
  json::array spot;
  const bool audience_changed = x.audience_org_ids != current.audience_org_ids;
  if (auto occupied = check_occupancy(f, x, audience_changed ? x.unit_ids : added, spot))
    return std::move(*occupied);
  // Released or reclaiming units that left the reservation leave the spot market with it.
  std::erase_if(x.released_unit_ids, [&](const std::string& u) { return !x.holds_unit(u); });
  std::erase_if(x.reclaiming_unit_ids, [&](const std::string& u) { return !x.holds_unit(u); });
  x.version += 1;
  x.updated_at = f.now;
  Change ch{
      .actor = c, .request_id = q.request_id, .at = f.now, .upserts = {x}, .idempotency = std::move(*idem)};
  ch.audits.push_back(AuditDraft{"reservation.amend", x.id, x.unit_ids, {}, "ok", std::nullopt});
  ch.events.push_back(EventDraft{"reservation.amended", json::object{{"reservation", to_json(x)}}});
  auto out = to_json(x);
  out["spotWorkloads"] = std::move(spot);
  // A new startsAt or endsAt may be due already: the term is a change of its own (its audit record,
  // its event, the next version), after the amendment. The answer stays the amendment's, as stored
  // for an Idempotency-Key: a replay answers the same bytes.
  return CommitThen{.change = std::move(ch),
                    .answer = with_header(json_response(out), "ETag", entity_tag(x.version)),
                    .apply_terms = true};
}

Decision end(const Facts& f, const ApiRequest& q, const Caller& c, const r::Reservation& current) {
  if (!f.allowed(r::Action::end, c, &current)) return forbidden("only a platform admin ends reservations");
  auto idem = f.ask.idempotency(q, c);
  if (!idem) return std::move(idem.error());
  auto reason = reason_of(q.body, false);
  if (!reason) return reason.error();
  if (current.ended()) return problem(409, "reservation-ended", "the reservation has ended already");
  r::Reservation x = current;
  x.state = r::State::ended;
  x.ended_at = f.now;
  x.end_reason = r::EndReason::ended_early;
  x.released_unit_ids.clear();
  x.reclaiming_unit_ids.clear();
  x.version += 1;
  x.updated_at = f.now;
  Change ch{
      .actor = c, .request_id = q.request_id, .at = f.now, .upserts = {x}, .idempotency = std::move(*idem)};
  ch.audits.push_back(AuditDraft{"reservation.end", x.id, x.unit_ids, {}, "ok", *reason});
  ch.events.push_back(EventDraft{"reservation.ended", json::object{{"reservation", to_json(x)}}});
  return CommitThen{.change = std::move(ch),
                    .answer = with_header(json_response(to_json(x)), "ETag", entity_tag(x.version))};
}

Decision release(const Facts& f, const ApiRequest& q, const Caller& c, const r::Reservation& current) {
  if (!f.allowed(r::Action::release, c, &current))
    return forbidden("only a platform admin or a managing org releases units");
  auto idem = f.ask.idempotency(q, c);
  if (!idem) return std::move(idem.error());
  auto body = parse_object(q.body, false);
  if (!body) return body.error();
  Fields fs(*body, {"unitIds"});
  auto ids = fs.strings("unitIds");
  if (!ids || ids->empty()) {
    if (fs.problems().empty()) fs.problems().push_back({"unitIds", "must name at least one unit"});
  }
  if (!fs.problems().empty())
    return problem(400, "invalid-request", "the body is not a valid release request", fs.problems());
  if (current.state != r::State::active)
    return problem(409, "reservation-not-active", "units are released only from an active reservation");
  if (auto unknown = units_not_held(current, *ids)) return *unknown;
  r::Reservation x = current;
  std::vector<std::string> newly;
  for (const auto& u : *ids) {
    if (std::find(x.released_unit_ids.begin(), x.released_unit_ids.end(), u) != x.released_unit_ids.end())
      continue;
    if (std::find(newly.begin(), newly.end(), u) != newly.end()) continue;
    newly.push_back(u);
    x.released_unit_ids.push_back(u);
    std::erase(x.reclaiming_unit_ids, u);
  }
  Change ch{.actor = c, .request_id = q.request_id, .at = f.now, .idempotency = std::move(*idem)};
  if (newly.empty()) {  // already released: a no-op, answered like a change (with its ETag)
    auto answer = with_header(json_response(json::object{{"reservation", to_json(current)}}), "ETag",
                              entity_tag(current.version));
    if (!ch.idempotency) return answer;
    // Its Idempotency-Key keeps this answer too: a retry (after a lost answer or a crash) must
    // replay it, not release again once the units were reclaimed meanwhile. The answer alone is
    // stored; no revision moves.
    return CommitThen{.change = std::move(ch), .answer = std::move(answer)};
  }
  std::sort(x.released_unit_ids.begin(), x.released_unit_ids.end());
  x.version += 1;
  x.updated_at = f.now;
  ch.upserts.push_back(x);
  ch.audits.push_back(AuditDraft{"units.release", x.id, newly, {}, "ok", std::nullopt});
  ch.events.push_back(
      EventDraft{"units.released", json::object{{"reservationId", x.id}, {"unitIds", strings_json(newly)}}});
  return CommitThen{.change = std::move(ch),
                    .answer = with_header(json_response(json::object{{"reservation", to_json(x)}}), "ETag",
                                          entity_tag(x.version))};
}

Decision admission(const Facts& f, const ApiRequest& q, const Caller& c) {
  if (!f.allowed(r::Action::ask_admission, c))
    return forbidden("admission is answered for platform admins and operators");
  // A POST: an Idempotency-Key replays the first answer (CONTRACT §4 Conventions), even though
  // the question changes nothing.
  auto idem = f.ask.idempotency(q, c);
  if (!idem) return std::move(idem.error());
  auto body = parse_object(q.body, false);
  if (!body) return body.error();
  Fields fs(*body, {"orgId", "tier", "unitIds"});
  auto org = fs.string("orgId");
  auto tier = fs.string("tier");
  auto ids = fs.strings("unitIds");
  if (!body->contains("orgId")) fs.problems().push_back({"orgId", "is required"});
  if (!body->contains("tier")) fs.problems().push_back({"tier", "is required"});
  require_unit_ids(fs.problems(), ids);
  if (!fs.problems().empty())
    return problem(400, "invalid-request", "the body is not a valid admission request", fs.problems());
  json::array reasons;
  auto parsed = vmctl::parse_tier(*tier);
  if (!parsed) {
    reasons.emplace_back(
        json::object{{"code", "invalid-tier"},
                     {"message", fmt::format("tier must be spot, on-demand or reserved, not \"{}\"", *tier)},
                     {"unitId", nullptr}});
  } else {
    for (const auto& id : *ids) {
      auto e = r::entitled(*org, *parsed, id, f.inventory.facts(id), f.reservations.all(), f.node.node_id);
      if (!e.allowed())
        reasons.emplace_back(json::object{{"code", e.code}, {"message", e.message}, {"unitId", id}});
    }
  }
  auto answer = json_response(json::object{{"allowed", reasons.empty()}, {"reasons", std::move(reasons)}});
  if (!*idem) return answer;
  // The answer alone is kept for its key: no revision moves.
  return CommitThen{
      .change = Change{.actor = c, .request_id = q.request_id, .at = f.now, .idempotency = std::move(*idem)},
      .answer = std::move(answer)};
}

}  // namespace routes
}  // namespace gpunode::service::detail
