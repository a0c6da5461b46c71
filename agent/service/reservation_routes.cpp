// NodeService::Impl's routes: dispatch, units, reservations, audit, state, reserved capacity, conditional
// GETs.
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>

#include "gpunode/config/config.hpp"
#include "gpunode/service/reservation_json.hpp"
#include "gpunode/store/audit_chain.hpp"
#include "impl.hpp"

namespace gpunode::service {
using namespace detail;

namespace {

ApiResponse not_found() {
  // Holds nothing from the request: every 404 for an unseen node is byte-identical (§7).
  return problem(404, "not-found", "no such resource");
}

}  // namespace

// ---- routes ------------------------------------------------------------------------------------
Outcome NodeService::Impl::route(const ApiRequest& q) {
  if (q.path == "/healthz") {
    if (q.method != "GET") return with_header(problem(405, "method-not-allowed", "GET only"), "Allow", "GET");
    // Unauthenticated: over HTTPS it says only that the agent answers (no node id to enumerate
    // nodes by, no version to pick exploits by); the admin socket's peers are admins.
    if (!q.via_admin_socket()) return json_response(json::object{{"status", "ok"}});
    return json_response(json::object{
        {"status", "ok"}, {"nodeId", opt.node_id}, {"version", opt.version}, {"revision", store.revision()}});
  }
  if (auto bad = q.target_error()) return problem(400, "invalid-request", *bad);
  auto caller = authenticate(q);
  if (!caller) return caller.error();
  if (q.path == "/v1/admin/rescan" && q.via_admin_socket()) {
    // Operators' "scan now" (gpunodectl rescan); only on the admin socket.
    if (q.method != "POST") return method_not_allowed("POST");
    scan(false);
    return json_response(json::object{{"revision", store.revision()}});
  }
  if (q.path == "/v1/admin/unentitled" && q.via_admin_socket()) {
    if (q.method != "GET") return method_not_allowed("GET");
    return unentitled_route();
  }
  if (q.path == "/v1/admin/domain-admission" && q.via_admin_socket()) {
    if (q.method != "POST") return method_not_allowed("POST");
    return domain_admission(q);
  }
  const auto seg = q.segments();
  if (seg.size() >= 3 && seg[0] == "v1" && seg[1] == "nodes") return node_route(q, *caller, seg);
  if (seg.size() == 4 && seg[0] == "v1" && seg[1] == "orgs" && seg[3] == "reserved-capacity") {
    return reserved_capacity(q, *caller, seg[2]);
  }
  return not_found();
}

ApiResponse NodeService::Impl::method_not_allowed(std::string allow) {
  return with_header(problem(405, "method-not-allowed", fmt::format("allowed: {}", allow)), "Allow", allow);
}

Outcome NodeService::Impl::node_route(const ApiRequest& q, const Caller& c,
                                      const std::vector<std::string>& seg) {
  if (seg[2] != opt.node_id || !allowed(r::Action::see_node, c)) return not_found();
  const std::size_t n = seg.size();
  if (n == 4 && seg[3] == "units")
    return q.method == "GET" ? units_answer(*snapshot(), c.who) : method_not_allowed("GET");
  if (n == 4 && seg[3] == "audit") return q.method == "GET" ? audit(q, c) : method_not_allowed("GET");
  if (n == 5 && seg[3] == "audit" && seg[4] == "checkpoints")
    return q.method == "GET" ? audit_checkpoints(q, c) : method_not_allowed("GET");
  if (n == 4 && seg[3] == "state") {
    if (q.method != "GET") return method_not_allowed("GET");
    return std::visit([](auto&& a) -> Outcome { return std::move(a); }, state_answer(*snapshot(), q, c.who));
  }
  if (n == 4 && seg[3] == "workloads") return q.method == "GET" ? workloads(c) : method_not_allowed("GET");
  if (n == 4 && seg[3] == "capacity")
    return q.method == "GET" ? capacity_answer(*snapshot(), q, c.who) : method_not_allowed("GET");
  if (n == 4 && seg[3] == "admission")
    return q.method == "POST" ? admission(q, c) : method_not_allowed("POST");
  if (n == 4 && seg[3] == "terminate-spot")
    return q.method == "POST" ? terminate_spot(q, c) : method_not_allowed("POST");
  if (n == 4 && seg[3] == "reservations") {
    if (q.method == "GET") return stored_reservations(q, c);
    if (q.method == "POST") return create(q, c);
    return method_not_allowed("GET, POST");
  }
  if (n >= 5 && seg[3] == "reservations") {
    std::optional<r::Reservation> kept;
    const auto* x = find_reservation(seg[4], kept);
    if (x == nullptr || !allowed(r::Action::see_reservation, c, x)) return not_found();
    if (n == 5) {
      if (q.method == "GET") return reservation_answer(*x);
      if (q.method == "PATCH") return amend(q, c, *x);
      return method_not_allowed("GET, PATCH");
    }
    if (n == 6 && seg[5] == "end") return q.method == "POST" ? end(q, c, *x) : method_not_allowed("POST");
    if (n == 6 && seg[5] == "release")
      return q.method == "POST" ? release(q, c, *x) : method_not_allowed("POST");
    if (n == 6 && seg[5] == "reclaim")
      return q.method == "POST" ? reclaim(q, c, *x) : method_not_allowed("POST");
  }
  return not_found();
}

// Units named in a request: 422 unknown-unit, 409 unit-not-reservable.
std::optional<ApiResponse> NodeService::Impl::check_units(const std::vector<std::string>& ids) {
  std::vector<FieldProblem> unknown;
  json::array not_reservable;
  for (const auto& id : ids) {
    const auto* u = inventory.find(id);
    const auto* absent = inventory.absent_doc(id);
    if (u == nullptr && absent == nullptr) {
      unknown.push_back({"unitIds", fmt::format("{} is not a unit of node {}", id, opt.node_id)});
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

std::optional<ApiResponse> NodeService::Impl::check_overlap(const r::Reservation& candidate) {
  // Only the live reservations on its units whose terms come near can block it; the rule decides.
  std::vector<const r::Reservation*> near;
  for (const auto id : live.near(candidate.unit_ids, candidate.starts_at, candidate.ends_at)) {
    if (const auto* x = reservations.find(id)) near.push_back(x);
  }
  auto blockers = r::blocking_reservations(candidate, std::span<const r::Reservation* const>(near));
  if (blockers.empty()) return std::nullopt;
  json::object extra{{"blockingReservationIds", strings_json(blockers)}};
  return problem(409, "reservation-overlap",
                 fmt::format("the units are held at overlapping times by {}", fmt::join(blockers, ", ")), {},
                 &extra);
}

Outcome NodeService::Impl::create(const ApiRequest& q, const Caller& c) {
  if (!allowed(r::Action::create, c)) return forbidden("only a platform admin reserves units");
  std::optional<IdempotencyDraft> idem;
  if (auto replay = idempotent_replay(q, c, idem)) return *replay;
  auto body = parse_object(q.body, false);
  if (!body) return body.error();
  Fields f(*body, {"unitIds", "audienceOrgIds", "managingOrgIds", "startsAt", "endsAt", "note"});
  r::CreateRequest req;
  req.unit_ids = f.strings("unitIds").value_or(std::vector<std::string>{});
  req.audience_org_ids = f.strings("audienceOrgIds").value_or(std::vector<std::string>{});
  req.managing_org_ids = f.strings("managingOrgIds").value_or(std::vector<std::string>{});
  req.starts_at = f.time("startsAt");
  req.ends_at = f.time("endsAt");
  req.note = f.string("note").value_or("");
  const r::Time t = now();
  auto problems = std::move(f.problems());
  for (auto& e : r::validate_create(req, t)) {
    if (std::none_of(problems.begin(), problems.end(),
                     [&](const FieldProblem& p) { return p.field == e.field; })) {
      problems.push_back(std::move(e));
    }
  }
  if (!problems.empty())
    return problem(400, "invalid-request", "the body is not a valid reservation request", problems);
  if (auto bad = check_units(req.unit_ids)) return *bad;

  r::Reservation x;
  x.id = new_id("rsv_", clock());
  x.node_id = opt.node_id;
  x.unit_ids = req.unit_ids;
  x.audience_org_ids = req.audience_org_ids;
  x.managing_org_ids = req.managing_org_ids;
  x.starts_at = req.starts_at.value_or(t);
  x.ends_at = *req.ends_at;
  x.state = x.starts_at <= t ? r::State::active : r::State::scheduled;
  x.note = req.note;
  x.created_at = x.updated_at = t;
  x.version = 1;
  if (auto overlap = check_overlap(x)) return *overlap;
  json::array spot;
  if (auto occupied = check_occupancy(x, x.unit_ids, t, spot)) return *occupied;

  Change ch{.actor = c, .request_id = q.request_id, .at = t, .upserts = {x}, .idempotency = std::move(idem)};
  ch.audits.push_back(AuditDraft{"reservation.create", x.id, x.unit_ids, {}, "ok", std::nullopt});
  auto body_out = to_json(x);
  ch.events.push_back(EventDraft{"reservation.created", json::object{{"reservation", body_out}}});
  body_out["spotWorkloads"] = std::move(spot);
  ApiResponse resp = json_response(body_out, 201);
  resp.headers.emplace_back("Location", fmt::format("/v1/nodes/{}/reservations/{}", opt.node_id, x.id));
  resp.headers.emplace_back("ETag", etag_of_version(x.version));
  auto out = commit_response(ch, std::move(resp));
  if (out.status == 201)
    say(LogLevel::info,
        fmt::format("RESERVATION={} created by {} UNITS={}", x.id, c.who.sub, fmt::join(x.unit_ids, ",")));
  return out;
}

Outcome NodeService::Impl::amend(const ApiRequest& q, const Caller& c, const r::Reservation& current) {
  if (!allowed(r::Action::amend, c, &current)) return forbidden("only a platform admin amends reservations");
  const auto ct = q.header("content-type").value_or("");
  if (!ct.starts_with("application/merge-patch+json") && !ct.starts_with("application/json")) {
    return problem(415, "unsupported-media-type", "send application/merge-patch+json or application/json");
  }
  std::optional<IdempotencyDraft> idem;
  if (auto replay = idempotent_replay(q, c, idem)) return *replay;
  if (auto m = q.header("if-match"); m && !etag_matches(*m, etag_of_version(current.version))) {
    return problem(412, "version-mismatch", fmt::format("the reservation is at version {}", current.version));
  }
  if (current.ended()) return problem(409, "reservation-ended", "an ended reservation cannot be amended");
  auto body = parse_object(q.body, false);
  if (!body) return body.error();
  Fields f(*body, {"unitIds", "audienceOrgIds", "managingOrgIds", "startsAt", "endsAt", "note"});
  r::Reservation x = current;
  const r::Time t = now();
  if (auto v = f.strings("unitIds")) x.unit_ids = *v;
  if (auto v = f.strings("audienceOrgIds")) x.audience_org_ids = *v;
  if (auto v = f.strings("managingOrgIds")) x.managing_org_ids = *v;
  if (auto v = f.string("note")) x.note = *v;
  if (f.has("startsAt")) {
    if (auto v = f.time("startsAt")) {
      if (current.state != r::State::scheduled) {
        f.problems().push_back({"startsAt", "can change only while the reservation is scheduled"});
      } else {
        x.starts_at = *v;
      }
    }
  }
  if (auto v = f.time("endsAt")) x.ends_at = *v;
  auto problems = std::move(f.problems());
  r::CreateRequest check{x.unit_ids, x.audience_org_ids, x.managing_org_ids, x.starts_at, x.ends_at, x.note};
  for (auto& e : r::validate_create(check, t)) {
    if (e.field == "endsAt" && !body->contains("endsAt") && !body->contains("startsAt")) continue;
    if (std::none_of(problems.begin(), problems.end(),
                     [&](const FieldProblem& p) { return p.field == e.field; })) {
      problems.push_back(std::move(e));
    }
  }
  if (!problems.empty())
    return problem(400, "invalid-request", "the body is not a valid amendment", problems);
  std::vector<std::string> added;
  for (const auto& u : x.unit_ids) {
    if (!current.holds_unit(u)) added.push_back(u);
  }
  if (auto bad = check_units(added)) return *bad;
  if (auto overlap = check_overlap(x)) return *overlap;
  json::array spot;
  const bool audience_changed = x.audience_org_ids != current.audience_org_ids;
  if (auto occupied = check_occupancy(x, audience_changed ? x.unit_ids : added, t, spot)) return *occupied;
  // Released or reclaiming units that left the reservation leave the spot market with it.
  std::erase_if(x.released_unit_ids, [&](const std::string& u) { return !x.holds_unit(u); });
  std::erase_if(x.reclaiming_unit_ids, [&](const std::string& u) { return !x.holds_unit(u); });
  x.version += 1;
  x.updated_at = t;
  Change ch{.actor = c, .request_id = q.request_id, .at = t, .upserts = {x}, .idempotency = std::move(idem)};
  ch.audits.push_back(AuditDraft{"reservation.amend", x.id, x.unit_ids, {}, "ok", std::nullopt});
  ch.events.push_back(EventDraft{"reservation.amended", json::object{{"reservation", to_json(x)}}});
  auto amended = to_json(x);
  amended["spotWorkloads"] = std::move(spot);
  auto resp = with_header(json_response(amended), "ETag", etag_of_version(x.version));
  auto out = commit_response(ch, std::move(resp));
  // A new startsAt or endsAt may be due already: the term is a change of its own (its audit record,
  // its event, the next version), after the amendment. The answer stays the amendment's, as stored
  // for an Idempotency-Key: a replay answers the same bytes.
  apply_terms();
  return out;
}

ApiResponse NodeService::Impl::end(const ApiRequest& q, const Caller& c, const r::Reservation& current) {
  if (!allowed(r::Action::end, c, &current)) return forbidden("only a platform admin ends reservations");
  std::optional<IdempotencyDraft> idem;
  if (auto replay = idempotent_replay(q, c, idem)) return *replay;
  auto body = parse_object(q.body, true);
  if (!body) return body.error();
  Fields f(*body, {"reason"});
  auto reason = f.string("reason", true);
  if (reason && r::code_points(*reason) > r::kMaxNote)
    f.problems().push_back({"reason", "must be at most 1024 characters"});
  if (!f.problems().empty()) return problem(400, "invalid-request", "the body is not valid", f.problems());
  if (current.ended()) return problem(409, "reservation-ended", "the reservation has ended already");
  const r::Time t = now();
  r::Reservation x = current;
  x.state = r::State::ended;
  x.ended_at = t;
  x.end_reason = r::EndReason::ended_early;
  x.released_unit_ids.clear();
  x.reclaiming_unit_ids.clear();
  x.version += 1;
  x.updated_at = t;
  Change ch{.actor = c, .request_id = q.request_id, .at = t, .upserts = {x}, .idempotency = std::move(idem)};
  ch.audits.push_back(AuditDraft{"reservation.end", x.id, x.unit_ids, {}, "ok", reason});
  ch.events.push_back(EventDraft{"reservation.ended", json::object{{"reservation", to_json(x)}}});
  return commit_response(ch, with_header(json_response(to_json(x)), "ETag", etag_of_version(x.version)));
}

// GET reservations: a list of live states from the snapshot; one that holds ended reservations from
// the store, a page at a time (an org's through reservation_orgs), each decided by the rules.
ApiResponse NodeService::Impl::stored_reservations(const ApiRequest& q, const Caller& c) {
  auto query = reservation_query(q);
  if (!query) return query.error();
  if (!query->lists_ended()) return reservations_answer(*snapshot(), *query, c.who);
  const bool all = allowed(r::Action::list_all_reservations, c);
  ReservationPage page(query->limit);
  if (!all && !c.who.org) return page.answer();  // it sees no reservation but by its org
  StoredRows rows{.ended_only = query->state.has_value(),
                  .org = all ? std::nullopt : c.who.org,
                  .after = query->token,
                  .limit = query->limit + 1};
  while (!page.full()) {
    auto batch = store.reservations_after(rows);
    if (!batch) {
      say(LogLevel::error, "reservations read: " + batch.error().to_string());
      return storage_problem(batch.error(), "the reservations cannot be read",
                             "try again once the agent's log says they can");
    }
    for (const auto& x : *batch) {
      rows.after = x.id;
      if (all || allowed(r::Action::see_reservation, c, &x)) page.add(x);
      if (page.full()) break;
    }
    if (batch->size() < rows.limit) break;
  }
  return page.answer();
}

const r::Reservation* NodeService::Impl::find_reservation(std::string_view id,
                                                          std::optional<r::Reservation>& kept) {
  if (const auto* x = reservations.find(id)) return x;
  auto stored = store.reservation(id);
  if (!stored) {
    say(LogLevel::error, "reservation read: " + stored.error().to_string());
    return nullptr;
  }
  kept = std::move(*stored);
  return kept ? &*kept : nullptr;
}

ApiResponse NodeService::Impl::audit(const ApiRequest& q, const Caller& c) {
  if (!allowed(r::Action::read_audit, c)) return forbidden("the audit log is for operators and the owner");
  auto page = paging(q);
  if (!page) return page.error();
  const auto& [limit, token] = *page;
  std::int64_t after = 0;
  for (const auto& [name, cursor] :
       {std::pair{"after", q.query_param("after").value_or("")}, std::pair{"pageToken", token}}) {
    if (cursor.empty()) continue;
    auto seq = store::parse_audit_id(cursor);
    if (!seq)
      return problem(400, "invalid-request", fmt::format("{} must be an audit id such as aud_12", name),
                     {{name, "must be an audit id such as aud_12"}});
    after = std::max(after, static_cast<std::int64_t>(*seq));
  }
  auto rows = store.audit_after(after, limit + 1);
  if (!rows) {
    say(LogLevel::error, "audit log read: " + rows.error().to_string());
    return storage_problem(rows.error(), "the audit log cannot be read",
                           "try again once the agent's log says it can");
  }
  const bool more = rows->size() > limit;
  if (more) rows->resize(limit);
  json::array records;
  for (const auto& [seq, text] : *rows) {
    boost::system::error_code ec;
    auto v = json::parse(text, ec);
    if (ec)
      return problem(500, "internal",
                     fmt::format("audit record {} is not JSON",
                                 store::format_audit_id(static_cast<std::uint64_t>(seq))));
    records.emplace_back(std::move(v));
  }
  const std::int64_t last = rows->empty() ? 0 : rows->back().first;
  return json_response(json::object{
      {"records", std::move(records)},
      {"nextPageToken",
       more ? json::value(store::format_audit_id(static_cast<std::uint64_t>(last))) : json::value(nullptr)}});
}

ApiResponse NodeService::Impl::reserved_capacity(const ApiRequest& q, const Caller& c,
                                                 const std::string& org) {
  const r::Subject about_org{node(), all_reservations(), nullptr, org};
  if (!r::may(r::Action::read_reserved_capacity, c.who, about_org)) return not_found();
  if (q.method != "GET") return method_not_allowed("GET");
  json::array entries;
  std::int64_t total_units = 0, total_gpus = 0;
  for (const auto& x : reservations) {
    if (x.ended() ||
        std::find(x.audience_org_ids.begin(), x.audience_org_ids.end(), org) == x.audience_org_ids.end())
      continue;
    json::array units_out;
    std::int64_t gpus = 0;
    for (const auto& uid : x.unit_ids) {
      if (const auto* u = inventory.find(uid)) {
        gpus += u->gpu_count();
        units_out.emplace_back(unit_json(node(), reservations, *u, c.who));
      } else if (const auto* a = inventory.absent_doc(uid)) {
        if (const auto* g = a->if_contains("gpuCount"); g && g->is_int64()) gpus += g->get_int64();
        units_out.emplace_back(absent_unit_json(node(), reservations, uid, *a, c.who));
      }
    }
    total_units += static_cast<std::int64_t>(x.unit_ids.size());
    total_gpus += gpus;
    entries.emplace_back(json::object{{"reservationId", x.id},
                                      {"state", r::to_string(x.state)},
                                      {"startsAt", r::format_time(x.starts_at)},
                                      {"endsAt", r::format_time(x.ends_at)},
                                      {"unitIds", strings_json(x.unit_ids)},
                                      {"releasedUnitIds", strings_json(x.released_unit_ids)},
                                      {"gpuCount", gpus},
                                      {"units", std::move(units_out)}});
  }
  // CONTRACT §10: the node's id only to an org that sees the node (its owner, or a manager or the
  // audience of a non-ended reservation here), whoever asks: no org learns a node id from this route.
  r::Caller as_org;
  as_org.org = org;
  const json::value node_id =
      r::may(r::Action::see_node, as_org, about_org) ? json::value(opt.node_id) : json::value(nullptr);
  return json_response(json::object{{"orgId", org},
                                    {"nodeId", node_id},
                                    {"reservations", std::move(entries)},
                                    {"totals", json::object{{"units", total_units}, {"gpus", total_gpus}}}});
}

}  // namespace gpunode::service
