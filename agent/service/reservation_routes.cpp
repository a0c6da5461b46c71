// NodeService::Impl's routes that the store answers: ended reservations, one reservation by id,
// the audit log, and reserved capacity (routes.cpp dispatches to them).
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>

#include "gpunode/config/config.hpp"
#include "gpunode/service/reservation_json.hpp"
#include "gpunode/store/audit_chain.hpp"
#include "impl.hpp"

namespace gpunode::service {
using namespace detail;

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

// Found the same way whether it is live, ended, hidden from the caller or not there at all: the
// store is asked every time (it holds every reservation), then the live copy is taken when there is
// one (CONTRACT §10 "Hiding includes time": a live one must not answer sooner than a missing id).
const r::Reservation* NodeService::Impl::find_reservation(std::string_view id,
                                                          std::optional<r::Reservation>& kept) {
  auto stored = store.reservation_row(id);
  if (!stored) {
    say(LogLevel::error, "reservation read: " + stored.error().to_string());
    return nullptr;
  }
  if (const auto* x = reservations.find(id)) return x;
  if (!*stored) return nullptr;
  auto parsed = store.parse_reservation(std::string(id), **stored);
  if (!parsed) {
    say(LogLevel::error, "reservation read: " + parsed.error().to_string());
    return nullptr;
  }
  kept = std::move(*parsed);
  return &*kept;
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
  const auto id_of = [](std::int64_t seq) { return store::format_audit_id(static_cast<std::uint64_t>(seq)); };
  auto got =
      stored_page(std::move(*rows), limit, [&](std::int64_t seq) { return "audit record " + id_of(seq); });
  if (!got) return got.error();
  return json_response(json::object{
      {"records", std::move(got->documents)},
      {"nextPageToken", got->next_after ? json::value(id_of(*got->next_after)) : json::value(nullptr)}});
}

// Scope::org: the caller may read this org's reserved capacity (NodeService::Impl::admits).
ApiResponse NodeService::Impl::reserved_capacity(const Caller& c, const std::string& org) {
  const r::Subject about_org{node(), all_reservations(), nullptr, org};
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
