// The read routes over a snapshot (GET units, state, reservations and one reservation), the same on
// the core thread and the network threads; conditional GETs.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <tuple>

#include "gpunode/config/config.hpp"
#include "gpunode/discovery/json.hpp"
#include "gpunode/reservations/entitlement.hpp"
#include "gpunode/reservations/permissions.hpp"
#include "gpunode/service/reservation_json.hpp"
#include "gpunode/store/audit_chain.hpp"
#include "snapshot.hpp"
#include "state_store.hpp"

namespace gpunode::service::detail {
namespace r = gpunode::reservations;
namespace json = boost::json;

namespace {

constexpr std::size_t kDefaultLimit = 100;
constexpr std::size_t kMaxLimit = 500;

ApiResponse with_etag(ApiResponse resp) {
  if (resp.status == 200 && !resp.header("ETag")) resp.headers.emplace_back("ETag", strong_etag(resp.body));
  return resp;
}

r::Subject on_node(const Snapshot& s, const r::Reservation* x = nullptr) {
  return r::Subject{s.node, s.reservations.all(), x, {}};
}

struct StatePoll {
  std::optional<std::int64_t> after;
  std::chrono::milliseconds wait = std::chrono::seconds(30);
};

std::expected<StatePoll, ApiResponse> state_poll(const ApiRequest& q) {
  StatePoll poll;
  if (auto a = q.query_param("after")) {
    std::int64_t v = 0;
    auto [p, ec] = std::from_chars(a->data(), a->data() + a->size(), v);
    if (ec != std::errc{} || p != a->data() + a->size() || v < 0) {
      return std::unexpected(problem(400, "invalid-request",
                                     "after must be a revision (a non-negative integer)",
                                     {{"after", "must be a non-negative integer"}}));
    }
    poll.after = v;
  }
  if (auto w = q.query_param("wait")) {
    auto d = config::parse_duration(*w);
    if (!d || *d > std::chrono::seconds(120)) {
      return std::unexpected(problem(400, "invalid-request",
                                     "wait must be a duration of at most 120s, e.g. 30s",
                                     {{"wait", d ? "must be at most 120s" : d.error().detail}}));
    }
    poll.wait = *d;
  }
  return poll;
}

}  // namespace

// The rules look at the caller's org, roles and transport: callers alike there get the same
// answer, so one rendering serves them all. Asked on every read the snapshot answers: it copies
// nothing, and sorts the roles only when there are several out of order.
AnswerClass AnswerClass::of(std::string_view route, const r::Caller& who, std::vector<std::string>& sorted) {
  std::span<const std::string> roles = who.roles;
  if (!std::is_sorted(roles.begin(), roles.end())) {
    sorted = who.roles;
    std::sort(sorted.begin(), sorted.end());
    roles = sorted;
  }
  return {route, who.via, who.org ? std::optional<std::string_view>(*who.org) : std::nullopt, roles};
}

std::strong_ordering compare(const AnswerClass& a, const AnswerClass& b) {
  if (auto c = a.route <=> b.route; c != 0) return c;
  if (auto c = a.via <=> b.via; c != 0) return c;
  if (auto c = a.org <=> b.org; c != 0) return c;
  return std::lexicographical_compare_three_way(a.roles.begin(), a.roles.end(), b.roles.begin(),
                                                b.roles.end());
}

json::object unit_json(const r::NodeView& node, const ReservationTable& reservations,
                       const discovery::Unit& u, const r::Caller& who) {
  return discovery::unit_to_json(u, r::visible_reservation_ids(who, node, reservations.all(), u.id));
}

json::object absent_unit_json(const r::NodeView& node, const ReservationTable& reservations,
                              const std::string& id, json::object doc, const r::Caller& who) {
  if (!doc.contains("health")) doc["health"] = discovery::health_to_json({});  // stored before §13
  doc["reservationIds"] = strings_json(r::visible_reservation_ids(who, node, reservations.all(), id));
  return doc;
}

json::array units_json(const r::NodeView& node, const ReservationTable& reservations,
                       const Inventory& inventory, const r::Caller& who) {
  std::map<std::string, json::object> all;
  for (const auto& u : inventory.present()) all.emplace(u.id, unit_json(node, reservations, u, who));
  for (const auto& [id, doc] : inventory.absent()) {
    if (!all.contains(id)) all.emplace(id, absent_unit_json(node, reservations, id, doc, who));
  }
  json::array out;
  for (auto& [id, o] : all) out.emplace_back(std::move(o));
  return out;
}

// Anyone but an admin, an operator, the owner and managing orgs gets 404, as for a node it does not
// see (CONTRACT §7 Who reads units): an audience org learns nothing from a 403 here.
ApiResponse units_answer(const Snapshot& s, const r::Caller& who) {
  if (!r::may(r::Action::list_units, who, on_node(s))) return not_found();
  std::vector<std::string> sorted;
  return *s.answer(AnswerClass::of("units", who, sorted), [&] {
    return with_etag(json_response(json::object{
        {"nodeId", s.node.node_id}, {"units", units_json(s.node, s.reservations, s.inventory, who)}}));
  });
}

// GET .../state[?after=REV&wait=30s]: units, reservations, workloads and the revision. A long poll
// whose revision has not passed REV yet parks until its deadline (counted from when it arrived);
// the driver handles it again when the revision moves, or at the deadline with wait_over, which
// makes it a 304.
std::variant<ApiResponse, Park> state_answer(const Snapshot& s, const ApiRequest& q, const r::Caller& who) {
  if (!r::may(r::Action::read_state, who, on_node(s)))
    return problem(403, "forbidden", "the node's state is for platform admins and operators");
  auto poll = state_poll(q);
  if (!poll) return poll.error();
  const std::string etag = entity_tag(s.revision);
  if (poll->after && s.revision <= *poll->after) {
    if (!q.wait_over && poll->wait.count() != 0) return Park{*poll->after, q.received + poll->wait};
    ApiResponse not_modified;
    not_modified.status = 304;
    not_modified.headers.emplace_back("ETag", etag);
    return not_modified;
  }
  std::vector<std::string> sorted;
  return *s.answer(AnswerClass::of("state", who, sorted), [&] {
    json::array rs;
    for (const auto& x : s.reservations) rs.emplace_back(to_json(x));
    auto resp = json_response(json::object{{"nodeId", s.node.node_id},
                                           {"revision", s.revision},
                                           {"units", units_json(s.node, s.reservations, s.inventory, who)},
                                           {"reservations", std::move(rs)},
                                           {"workloads", s.workloads}});
    resp.headers.emplace_back("ETag", etag);
    return resp;
  });
}

std::expected<ReservationQuery, ApiResponse> reservation_query(const ApiRequest& q) {
  ReservationQuery out;
  if (auto v = q.query_param("state"); v && !v->empty()) {
    out.state = r::parse_state(*v);
    if (!out.state)
      return std::unexpected(problem(400, "invalid-request", "state must be scheduled, active or ended",
                                     {{"state", "must be scheduled, active or ended"}}));
  }
  auto page = paging(q);
  if (!page) return std::unexpected(page.error());
  std::tie(out.limit, out.token) = std::move(*page);
  if (!out.token.empty() && !is_new_id("rsv_", out.token)) {
    return std::unexpected(
        problem(400, "invalid-request",
                "pageToken is not one this node gave: pass the nextPageToken of the previous page",
                {{"pageToken", "must be a nextPageToken from this list"}}));
  }
  return out;
}

ApiResponse reservations_answer(const Snapshot& s, const ReservationQuery& query, const r::Caller& who) {
  const bool all = r::may(r::Action::list_all_reservations, who, on_node(s));
  ReservationPage page(query.limit);
  for (const auto& x : query.token.empty() ? s.reservations.all() : s.reservations.after(query.token)) {
    if (page.full()) break;
    if ((all || r::may(r::Action::see_reservation, who, on_node(s, &x))) &&
        (!query.state || x.state == *query.state))
      page.add(x);
  }
  return page.answer();
}

void ReservationPage::add(const r::Reservation& x) {
  if (list_.size() == limit_) {
    more_ = true;
    return;
  }
  list_.emplace_back(to_json(x));
  last_ = x.id;
}

ApiResponse ReservationPage::answer() {
  return with_etag(json_response(
      json::object{{"reservations", std::move(list_)},
                   {"nextPageToken", more_ ? json::value(std::move(last_)) : json::value(nullptr)}}));
}

ApiResponse reservation_answer(const r::Reservation& x) {
  auto resp = json_response(to_json(x));
  resp.headers.emplace_back("ETag", entity_tag(x.version));
  return resp;
}

ApiResponse workloads_answer(const std::string& node_id, json::array workloads) {
  return json_response(json::object{{"nodeId", node_id}, {"workloads", std::move(workloads)}});
}

ApiResponse capacity_answer(const Snapshot& s, const ApiRequest& q, const r::Caller& who) {
  if (!r::may(r::Action::read_capacity, who, on_node(s)))
    return problem(403, "forbidden", "capacity is answered for platform admins and operators");
  auto org = q.query_param("org");
  if (!org || org->empty())
    return problem(400, "invalid-request", "org is required", {{"org", "is required"}});
  json::array entries;
  for (const auto& u : s.inventory.present()) {
    for (auto tier : {r::Tier::reserved, r::Tier::spot, r::Tier::on_demand}) {
      auto e = r::entitled(*org, tier, u.id, s.inventory.facts(u.id), s.reservations.all(), s.node.node_id);
      if (!e.allowed()) continue;
      entries.emplace_back(json::object{
          {"unitId", u.id},
          {"class", discovery::to_string(u.cls)},
          {"gpuCount", u.gpu_count()},
          {"tier", r::to_string(tier)},
          {"reservationId", e.reservation_id ? json::value(*e.reservation_id) : json::value(nullptr)}});
      break;  // one entry per unit
    }
  }
  return json_response(
      json::object{{"nodeId", s.node.node_id}, {"orgId", *org}, {"units", std::move(entries)}});
}

std::expected<StoredPage, ApiResponse> stored_page(std::vector<std::pair<std::int64_t, std::string>> rows,
                                                   std::size_t limit,
                                                   const std::function<std::string(std::int64_t)>& name_of) {
  StoredPage page;
  if (rows.size() > limit) {
    rows.resize(limit);
    page.next_after = rows.empty() ? 0 : rows.back().first;
  }
  for (const auto& [seq, text] : rows) {
    boost::system::error_code ec;
    auto v = json::parse(text, ec);
    if (ec) return std::unexpected(internal_error(fmt::format("{} is not JSON", name_of(seq))));
    page.documents.emplace_back(std::move(v));
  }
  return page;
}

std::expected<std::pair<std::size_t, std::string>, ApiResponse> paging(const ApiRequest& q) {
  std::size_t limit = kDefaultLimit;
  if (auto l = q.query_param("limit")) {
    std::size_t v = 0;
    auto [p, ec] = std::from_chars(l->data(), l->data() + l->size(), v);
    if (ec != std::errc{} || p != l->data() + l->size() || v < 1 || v > kMaxLimit) {
      return std::unexpected(problem(400, "invalid-request", "limit must be an integer from 1 to 500",
                                     {{"limit", "must be an integer from 1 to 500"}}));
    }
    limit = v;
  }
  return std::pair{limit, q.query_param("pageToken").value_or("")};
}

std::string strong_etag(std::string_view body) {
  return entity_tag(store::sha256_hex(body).value_or("0").substr(0, 20));
}

// GETs carry an ETag and answer If-None-Match with 304.
ApiResponse conditional(const ApiRequest& q, ApiResponse resp) {
  if (q.method != "GET" || resp.status != 200) return resp;
  std::string etag;
  if (auto e = resp.header("ETag")) {
    etag = std::string(*e);
  } else {
    etag = strong_etag(resp.body);
    resp.headers.emplace_back("ETag", etag);
  }
  if (auto inm = q.header("if-none-match"); inm && etag_matches(*inm, etag)) {
    ApiResponse not_modified;
    not_modified.status = 304;
    not_modified.headers.emplace_back("ETag", etag);
    return not_modified;
  }
  return resp;
}

}  // namespace gpunode::service::detail
