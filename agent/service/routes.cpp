// The one route table (gpunode/service/routes.hpp): its rows, the handlers they name, the matcher,
// and the core thread's dispatch over it (NodeService::Impl::route). The network threads' fast path
// reads the same rows (snapshot.cpp), and so does the daemon for its own routes.
#include "gpunode/service/routes.hpp"

#include <fmt/format.h>

#include <array>

#include "impl.hpp"

namespace gpunode::service {
using namespace detail;

namespace {

// ---- matching ----------------------------------------------------------------------------------

// Whether `path` is `pattern`'s, and its parameters, compared segment by segment once
// percent-decoded, route names as parameters (`/v1/nodes/N/unit%73` is units). `seg` is the path's
// decoded segments, read once and only when a plain comparison cannot decide.
bool matches(std::string_view pattern, const gpunode::json::Request& q,
             std::optional<std::vector<std::string>>& seg,
             std::vector<std::pair<std::string_view, std::string>>& params) {
  params.clear();
  if (pattern.find('{') == std::string_view::npos) {
    if (q.path == pattern) return true;
    if (q.path.find('%') == std::string::npos) return false;  // nothing to decode: not this one
  }
  if (!seg) seg = q.segments();
  std::size_t i = 0;
  for (std::string_view rest = pattern.substr(1);; ++i) {
    const auto slash = rest.find('/');
    const auto part = rest.substr(0, slash);
    if (i >= seg->size()) return false;
    if (part.starts_with('{')) {
      params.emplace_back(part.substr(1, part.size() - 2), (*seg)[i]);
    } else if (part != (*seg)[i]) {
      return false;
    }
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
  return i + 1 == seg->size();
}

// ---- the handlers ------------------------------------------------------------------------------
// Each is its route's whole answer, given the request, the caller and what the route's scope found.

Outcome healthz(RouteCall& k) {
  // Unauthenticated: over HTTPS it says only that the agent answers (no node id to enumerate nodes
  // by, no version to pick exploits by); the admin socket's peers are admins.
  if (!k.q.via_admin_socket()) return json_response(json::object{{"status", "ok"}});
  return json_response(json::object{{"status", "ok"},
                                    {"nodeId", k.impl.opt.node_id},
                                    {"version", k.impl.opt.version},
                                    {"revision", k.impl.store.revision()}});
}

Outcome rescan(RouteCall& k) {  // operators' "scan now" (gpunodectl rescan)
  k.impl.scan(false);
  return json_response(json::object{{"revision", k.impl.store.revision()}});
}

Outcome unentitled(RouteCall& k) {
  return k.impl.unentitled_route();
}
Outcome sign_checkpoint(RouteCall& k) {
  return k.impl.checkpoint_route();
}
Outcome domain_admission(RouteCall& k) {
  return k.impl.domain_admission(k.q);
}
Outcome admin_health(RouteCall& k) {
  return k.impl.health_answer();
}  // unit health (CONTRACT §13)
Outcome unit_health(RouteCall& k) {
  return k.impl.unit_health_answer(k.m.param("unitId"));
}

// A mutating route: its decision (decision.hpp) over the facts, carried out by the committer.
template <class Decide, class... Args>
Outcome decide(RouteCall& k, Decide&& route, const Args&... args) {
  const NodeService::Impl::Asks asks(k.impl, k.q);
  return k.impl.carry_out(route(k.impl.facts(asks), k.q, *k.caller, args...));
}

Outcome clear_health(RouteCall& k) {
  const NodeService::Impl::Asks asks(k.impl, k.q);
  auto f = k.impl.facts(asks);
  f.health = &k.impl.health;
  return k.impl.carry_out(routes::health_clear(f, k.q, *k.caller, std::string(k.m.param("unitId"))));
}

Outcome get_units(RouteCall& k) {
  return units_answer(*k.impl.snapshot(), k.caller->who);
}
Outcome audit(RouteCall& k) {
  return k.impl.audit(k.q, *k.caller);
}
Outcome audit_checkpoints(RouteCall& k) {
  return k.impl.audit_checkpoints(k.q, *k.caller);
}
Outcome get_state(RouteCall& k) {
  return std::visit([](auto&& a) -> Outcome { return std::move(a); },
                    state_answer(*k.impl.snapshot(), k.q, k.caller->who));
}
Outcome workloads(RouteCall& k) {
  const NodeService::Impl::Asks asks(k.impl, k.q);
  return k.impl.workloads(asks, *k.caller);
}
Outcome capacity(RouteCall& k) {
  return capacity_answer(*k.impl.snapshot(), k.q, k.caller->who);
}
Outcome admission(RouteCall& k) {
  return decide(k, routes::admission);
}
Outcome terminate_spot(RouteCall& k) {
  return decide(k, routes::terminate_spot);
}
Outcome list_reservations(RouteCall& k) {
  return k.impl.stored_reservations(k.q, *k.caller);
}
Outcome create_reservation(RouteCall& k) {
  return decide(k, routes::create);
}
Outcome get_reservation(RouteCall& k) {
  return reservation_answer(*k.reservation);
}
Outcome amend_reservation(RouteCall& k) {
  return decide(k, routes::amend, *k.reservation);
}
Outcome end_reservation(RouteCall& k) {
  return decide(k, routes::end, *k.reservation);
}
Outcome release_units(RouteCall& k) {
  return decide(k, routes::release, *k.reservation);
}
Outcome reclaim_units(RouteCall& k) {
  return decide(k, routes::reclaim, *k.reservation);
}
Outcome reserved_capacity(RouteCall& k) {
  return k.impl.reserved_capacity(*k.caller, std::string(k.m.param("orgId")));
}

// ---- the reads the published snapshot answers on a network thread -----------------------------

std::optional<ApiResponse> read_units(const ReadCall& k) {
  return units_answer(k.s, k.who);
}
std::optional<ApiResponse> read_state(const ReadCall& k) {
  auto decided = state_answer(k.s, k.q, k.who);
  if (auto* a = std::get_if<ApiResponse>(&decided)) return std::move(*a);
  return std::nullopt;  // a poll that parks: the core's
}
std::optional<ApiResponse> read_workloads(const ReadCall& k) {
  // While libvirt's events say the last list holds; else the core lists them.
  if (!k.s.workloads_current ||
      !r::may(r::Action::list_workloads, k.who, r::Subject{k.s.node, k.s.reservations.all(), nullptr, {}}))
    return std::nullopt;
  return workloads_answer(k.s.node.node_id, k.s.workloads);
}
std::optional<ApiResponse> read_capacity(const ReadCall& k) {
  return capacity_answer(k.s, k.q, k.who);
}
std::optional<ApiResponse> read_reservations(const ReadCall& k) {
  auto query = reservation_query(k.q);  // a list that holds ended ones is paged from the store
  if (!query || query->lists_ended()) return std::nullopt;
  return reservations_answer(k.s, *query, k.who);
}
std::optional<ApiResponse> read_reservation(const ReadCall& k) {
  return reservation_answer(*k.reservation);
}

// ---- the table ---------------------------------------------------------------------------------

constexpr Doors kApi = kHttps | kAdminSocket;
constexpr Doors kAll = kHttps | kAdminSocket | kMetricsListener;
constexpr Doors kAdminMetrics = kAdminSocket | kMetricsListener;

constexpr Scope kNone = Scope::none, kNode = Scope::node, kOne = Scope::reservation, kOrg = Scope::org;

// clang-format off
// method, pattern, handler, read from the snapshot, doors, scope[, authenticated, daemon route]
constexpr std::array kRoutes{
  Route{"GET",   "/healthz",                                                healthz,            nullptr,           kAll,          kNone, false},
  Route{"GET",   "/metrics",                                                nullptr,            nullptr,           kAdminMetrics, kNone, true,  DaemonRoute::metrics},
  Route{"POST",  "/v1/admin/reload",                                        nullptr,            nullptr,           kAdminSocket,  kNone, true,  DaemonRoute::reload},
  Route{"POST",  "/v1/admin/rescan",                                        rescan,             nullptr,           kAdminSocket,  kNone},
  Route{"POST",  "/v1/admin/audit/checkpoint",                              sign_checkpoint,    nullptr,           kAdminSocket,  kNone},
  Route{"GET",   "/v1/admin/unentitled",                                    unentitled,         nullptr,           kAdminSocket,  kNone},
  Route{"POST",  "/v1/admin/domain-admission",                              domain_admission,   nullptr,           kAdminSocket,  kNone},
  Route{"GET",   "/v1/admin/health",                                        admin_health,       nullptr,           kAdminSocket,  kNone},
  Route{"GET",   "/v1/admin/units/{unitId}/health",                         unit_health,        nullptr,           kAdminSocket,  kNone},
  Route{"POST",  "/v1/admin/units/{unitId}/health/clear",                   clear_health,       nullptr,           kAdminSocket,  kNone},
  Route{"GET",   "/v1/nodes/{nodeId}/units",                                get_units,          read_units,        kApi,          kNode},
  Route{"GET",   "/v1/nodes/{nodeId}/reservations",                         list_reservations,  read_reservations, kApi,          kNode},
  Route{"POST",  "/v1/nodes/{nodeId}/reservations",                         create_reservation, nullptr,           kApi,          kNode},
  Route{"GET",   "/v1/nodes/{nodeId}/reservations/{reservationId}",         get_reservation,    read_reservation,  kApi,          kOne},
  Route{"PATCH", "/v1/nodes/{nodeId}/reservations/{reservationId}",         amend_reservation,  nullptr,           kApi,          kOne},
  Route{"POST",  "/v1/nodes/{nodeId}/reservations/{reservationId}/end",     end_reservation,    nullptr,           kApi,          kOne},
  Route{"POST",  "/v1/nodes/{nodeId}/reservations/{reservationId}/release", release_units,      nullptr,           kApi,          kOne},
  Route{"POST",  "/v1/nodes/{nodeId}/reservations/{reservationId}/reclaim", reclaim_units,      nullptr,           kApi,          kOne},
  Route{"POST",  "/v1/nodes/{nodeId}/terminate-spot",                       terminate_spot,     nullptr,           kApi,          kNode},
  Route{"GET",   "/v1/nodes/{nodeId}/workloads",                            workloads,          read_workloads,    kApi,          kNode},
  Route{"GET",   "/v1/nodes/{nodeId}/capacity",                             capacity,           read_capacity,     kApi,          kNode},
  Route{"POST",  "/v1/nodes/{nodeId}/admission",                            admission,          nullptr,           kApi,          kNode},
  Route{"GET",   "/v1/nodes/{nodeId}/audit",                                audit,              nullptr,           kApi,          kNode},
  Route{"GET",   "/v1/nodes/{nodeId}/audit/checkpoints",                    audit_checkpoints,  nullptr,           kApi,          kNode},
  Route{"GET",   "/v1/nodes/{nodeId}/state",                                get_state,          read_state,        kApi,          kNode},
  Route{"GET",   "/v1/orgs/{orgId}/reserved-capacity",                      reserved_capacity,  nullptr,           kApi,          kOrg},
};
// clang-format on

}  // namespace

Doors door_of(const gpunode::json::Peer& peer) {
  switch (peer.kind) {
    case gpunode::json::Peer::Kind::unix_socket:
      return kAdminSocket;
    case gpunode::json::Peer::Kind::plain_tcp:
      return kMetricsListener;
    case gpunode::json::Peer::Kind::tcp:
      break;
  }
  return kHttps;
}

std::span<const Route> route_table() {
  return kRoutes;
}

std::string_view RouteMatch::param(std::string_view name) const {
  for (const auto& [n, v] : params) {
    if (n == name) return v;
  }
  return {};
}

std::string RouteMatch::allow(Doors door) const {
  std::string out;
  for (const auto& r : kRoutes) {
    if (path == nullptr || r.pattern != path->pattern || (r.doors & door) == 0) continue;
    if (!out.empty()) out += ", ";
    out += r.method;
  }
  return out;
}

RouteMatch match_route(const gpunode::json::Request& q) {
  const Doors door = door_of(q.peer);
  RouteMatch m;
  std::optional<std::vector<std::string>> seg;
  for (const auto& r : kRoutes) {
    if ((r.doors & door) == 0) continue;
    if (m.path != nullptr) {
      if (r.pattern != m.path->pattern) continue;  // the path is found: only its other methods
    } else if (matches(r.pattern, q, seg, m.params)) {
      m.path = &r;
    } else {
      continue;
    }
    if (r.method == q.method) {
      m.route = &r;
      break;
    }
  }
  if (m.path == nullptr) m.params.clear();
  return m;
}

// ---- the core thread's dispatch ----------------------------------------------------------------

Outcome NodeService::Impl::route(const ApiRequest& q) {
  const auto m = match_route(q);
  if (m.path != nullptr && !m.path->authenticated) {  // /healthz: before the target and the token
    if (m.route == nullptr) return method_not_allowed(m.allow(door_of(q.peer)));
    RouteCall k{*this, q, nullptr, m, nullptr};
    return m.route->handle(k);
  }
  if (auto bad = q.target_error()) return problem(400, "invalid-request", *bad);
  auto caller = authenticate(q);
  if (!caller) return caller.error();
  // No row, or one of the daemon's own (answered by the daemon before the service sees it).
  if (m.path == nullptr || m.path->handle == nullptr) return not_found();
  std::optional<r::Reservation> kept;
  const r::Reservation* x = nullptr;
  if (!admits(m, *caller, kept, x)) return not_found();
  if (m.route == nullptr) return method_not_allowed(m.allow(door_of(q.peer)));
  RouteCall k{*this, q, &*caller, m, x};
  return m.route->handle(k);
}

// The path's scope, whatever the method.
bool NodeService::Impl::admits(const RouteMatch& m, const Caller& c, std::optional<r::Reservation>& kept,
                               const r::Reservation*& x) {
  switch (m.path->scope) {
    case Scope::none:
      return true;
    case Scope::org:
      return r::may(r::Action::read_reserved_capacity, c.who,
                    r::Subject{node(), all_reservations(), nullptr, std::string(m.param("orgId"))});
    case Scope::node:
    case Scope::reservation:
      break;
  }
  // Asked whatever the node id (one lookup): a node id that is not this node costs what this node's
  // does to a caller that does not see it (CONTRACT §10 "Hiding includes time").
  const bool sees = allowed(r::Action::see_node, c);
  if (m.param("nodeId") != opt.node_id || !sees) return false;
  if (m.path->scope == Scope::node) return true;
  const auto id = m.param("reservationId");
  // A caller who sees every reservation (allowed to list them all) is not hidden from; any other
  // sees one only as its audience or manager (may()), so the index of orgs answers first: one
  // lookup, the same for a missing id and a hidden reservation, live or ended (CONTRACT §10
  // "Hiding includes time"). Only a reservation linked to the caller's org is read and decided.
  if (!allowed(r::Action::list_all_reservations, c)) {
    if (!c.who.org) return false;
    auto linked = store.org_linked(*c.who.org, id);
    if (!linked) say(LogLevel::error, "reservation read: " + linked.error().to_string());
    if (!linked || !*linked) return false;
  }
  x = find_reservation(id, kept);
  return x != nullptr && allowed(r::Action::see_reservation, c, x);
}

}  // namespace gpunode::service
