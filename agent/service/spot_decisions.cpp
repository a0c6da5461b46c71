// The spot market's routes as decisions (decision.hpp): terminate-spot and reclaim. Functions of
// the facts, the request and the caller; the committer writes the terminations ahead and runs them.
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "decision.hpp"
#include "gpunode/reservations/permissions.hpp"
#include "gpunode/reservations/rules.hpp"
#include "gpunode/service/reservation_json.hpp"

namespace gpunode::service::detail::routes {
namespace {

// terminate-spot's units: those named (each known, of the reservation when one is named, and in
// reach), or every unit in reach (of the reservation); or the refusal.
std::expected<std::set<std::string>, ApiResponse> spot_targets(
    const Facts& f, const std::optional<std::vector<std::string>>& ids, const r::Reservation* rx,
    const std::set<std::string>& reach) {
  std::set<std::string> targets;
  if (!ids) {
    for (const auto& u : reach) {
      if (!rx || rx->holds_unit(u)) targets.insert(u);
    }
    return targets;
  }
  std::vector<gpunode::json::FieldError> unknown, outside;
  for (const auto& u : *ids) {
    if (!f.inventory.known(u))
      unknown.push_back({"unitIds", fmt::format("{} is not a unit of node {}", u, f.node.node_id)});
    else if (rx && !rx->holds_unit(u))
      unknown.push_back({"unitIds", fmt::format("{} is not a unit of reservation {}", u, rx->id)});
    else if (!reach.contains(u))
      outside.push_back({"unitIds", fmt::format("{} is outside your reach", u)});
  }
  if (!unknown.empty())
    return std::unexpected(problem(422, "unknown-unit", "some units are not units of this node", unknown));
  if (!outside.empty())
    return std::unexpected(
        problem(403, "out-of-reach",
                "some units are outside your reach: a managing org reaches only the released "
                "and reclaiming units of its active reservations",
                outside));
  targets.insert(ids->begin(), ids->end());
  return targets;
}

Batch batch_of(Batch::Kind kind, const ApiRequest& q, const Caller& c, std::optional<IdempotencyDraft> idem) {
  Batch b;
  b.kind = kind;
  b.caller = c;
  b.request_id = q.request_id;
  b.idempotency = std::move(idem);
  return b;
}

}  // namespace

Decision terminate_spot(const Facts& f, const ApiRequest& q, const Caller& c) {
  if (!f.allowed(r::Action::terminate_spot, c)) {
    return forbidden("spot workloads are terminated by platform admins, the node's owner and managing orgs");
  }
  auto idem = f.ask.idempotency(q, c);
  if (!idem) return std::move(idem.error());
  auto body = parse_object(q.body, true);
  if (!body) return body.error();
  Fields fs(*body, {"unitIds", "reservationId", "gracePeriodSeconds", "reason", "dryRun"});
  const bool dry_run = fs.boolean("dryRun").value_or(false);
  auto ids = fs.strings("unitIds");
  if (fs.has("unitIds") && ids && ids->empty())
    fs.problems().push_back({"unitIds", "must name at least one unit, or be left out"});
  auto rid = fs.string("reservationId");
  auto grace_s = fs.integer("gracePeriodSeconds", 0, 300);
  auto reason = fs.string("reason");
  if (reason && r::code_points(*reason) > r::kMaxNote)
    fs.problems().push_back({"reason", "must be at most 1024 characters"});
  if (!fs.problems().empty())
    return problem(400, "invalid-request", "the body is not a valid terminate-spot request", fs.problems());
  const auto grace = grace_s ? std::chrono::seconds(*grace_s) : f.shutdown_grace;

  const auto reach = r::terminate_reach(c.who, f.node, f.reservations.all(), f.inventory.ids());
  const r::Reservation* rx = nullptr;
  std::optional<r::Reservation> kept;
  if (rid) {
    rx = f.ask.reservation(*rid, kept);
    if (rx == nullptr || !f.allowed(r::Action::see_reservation, c, rx)) {
      return problem(422, "unknown-reservation",
                     fmt::format("no reservation {} on node {} that you can see", *rid, f.node.node_id),
                     {{"reservationId", "is not a reservation of this node"}});
    }
  }
  auto targets = spot_targets(f, ids, rx, reach);
  if (!targets) return std::move(targets.error());
  auto ws = f.ask.workloads(std::chrono::milliseconds(0));
  if (!ws) return refused(std::move(ws.error()));
  const bool whole_node = (c.who.admin() || r::is_owner(c.who, f.node)) && !ids && !rx;
  return Terminate{.batch = batch_of(Batch::Kind::terminate_spot, q, c, std::move(*idem)),
                   .change = Change{.actor = c, .request_id = q.request_id, .at = f.now},
                   .plan = spot::plan(**ws, *targets, reach, whole_node),
                   .grace = grace,
                   .reason = reason,
                   .dry_run = dry_run,
                   .workloads = *ws};
}

Decision reclaim(const Facts& f, const ApiRequest& q, const Caller& c, const r::Reservation& current) {
  if (!f.allowed(r::Action::reclaim, c, &current))
    return forbidden("only a platform admin or a managing org reclaims units");
  auto idem = f.ask.idempotency(q, c);
  if (!idem) return std::move(idem.error());
  auto body = parse_object(q.body, false);
  if (!body) return body.error();
  Fields fs(*body, {"unitIds", "terminateSpot", "dryRun"});
  auto ids = fs.strings("unitIds");
  const bool terminate = fs.boolean("terminateSpot").value_or(false);
  const bool dry_run = fs.boolean("dryRun").value_or(false);
  require_unit_ids(fs.problems(), ids);
  if (!fs.problems().empty())
    return problem(400, "invalid-request", "the body is not a valid reclaim request", fs.problems());
  if (current.state != r::State::active)
    return problem(409, "reservation-not-active", "units are reclaimed only in an active reservation");
  if (auto unknown = units_not_held(current, *ids)) return *unknown;
  // Without a list of the workloads, every reclaimed unit is taken to carry spot workloads: it
  // stays reclaiming (in its managers' reach) until a later list shows it vacated. Terminating
  // needs the list: 503 and nothing changed.
  auto ws = f.ask.workloads(std::chrono::milliseconds(0));
  if (!ws && (terminate || std::holds_alternative<NeedsWorkloads>(ws.error())))
    return refused(std::move(ws.error()));
  const std::set<std::string> named(ids->begin(), ids->end());
  const auto occupied = ws ? spot::spot_occupied(**ws) : named;
  r::Reservation x = current;
  const auto move = r::reclaim_units(x, named, occupied);
  Change base{.actor = c, .request_id = q.request_id, .at = f.now};
  if (move.changed) {
    x.version += 1;
    x.updated_at = f.now;
    base.upserts.push_back(x);
    const auto& newly = move.newly_reclaimed;
    base.audits.push_back(AuditDraft{
        "units.reclaim",
        x.id,
        newly.empty() ? std::vector<std::string>(named.begin(), named.end()) : newly,
        {},
        "ok",
        move.still_occupied.empty()
            ? std::optional<std::string>()
            : fmt::format("spot workloads still run on {}", fmt::join(move.still_occupied, ", "))});
    if (!newly.empty())
      base.events.push_back(EventDraft{
          "units.reclaimed", json::object{{"reservationId", x.id}, {"unitIds", strings_json(newly)}}});
  }
  Batch b = batch_of(Batch::Kind::reclaim, q, c, std::move(*idem));
  b.reservation_id = current.id;
  spot::Plan p;
  if (terminate) {
    std::set<std::string> targets,
        reach = r::terminate_reach(c.who, f.node, f.reservations.all(), f.inventory.ids());
    for (const auto& u : x.reclaiming_unit_ids) {
      if (named.contains(u)) targets.insert(u);
    }
    reach.insert(targets.begin(), targets.end());  // the caller manages these units: they are reclaiming now
    p = spot::plan(**ws, targets, reach);
  }
  return Terminate{.batch = std::move(b),
                   .change = std::move(base),
                   .plan = std::move(p),
                   .grace = f.shutdown_grace,
                   .dry_run = dry_run,
                   .workloads = ws ? *ws : nullptr};
}

}  // namespace gpunode::service::detail::routes
