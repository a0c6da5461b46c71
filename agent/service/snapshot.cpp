// NodeService::Impl's snapshot: built on the core thread when the state moved, and the reads the
// network threads answer from it (NodeService::read).
#include "gpunode/reservations/permissions.hpp"
#include "impl.hpp"

namespace gpunode::service {
using namespace detail;

namespace {

// The path's scope over the snapshot (routes.hpp): whether it holds, and the reservation the path
// names (nullptr where it names none). Nothing: the core answers (a 404, or a reservation the
// snapshot does not hold). Only node and reservation scopes are answered from a snapshot.
std::optional<const r::Reservation*> snapshot_admits(const Snapshot& s, const RouteMatch& m,
                                                     const r::Caller& who) {
  if (m.route->scope != Scope::node && m.route->scope != Scope::reservation) return std::nullopt;
  // Asked whatever the node id: one lookup (the table's OrgIndex), so a node id that is not this
  // node costs what this node's does to a caller that does not see it (CONTRACT §10).
  const bool sees = r::may(r::Action::see_node, who, r::Subject{s.node, s.reservations.all(), nullptr, {}});
  if (m.param("nodeId") != s.node.node_id || !sees) return std::nullopt;
  if (m.route->scope == Scope::node) return static_cast<const r::Reservation*>(nullptr);
  const auto* x = s.reservations.find(m.param("reservationId"));
  if (x == nullptr ||
      !r::may(r::Action::see_reservation, who, r::Subject{s.node, s.reservations.all(), x, {}}))
    return std::nullopt;
  return x;
}

}  // namespace

std::shared_ptr<const Snapshot> NodeService::Impl::snapshot() {
  const auto now_at = generation.load(std::memory_order_acquire);
  if (auto current = published(); current && current->generation == now_at) return current;
  auto s = std::make_shared<Snapshot>();
  s->generation = now_at;
  s->revision = store.revision();
  s->node = node();
  s->reservations = reservations;
  s->inventory = inventory;
  s->workloads = observed_workloads;
  s->workloads_current = listed_current;
  if (!term_queue.empty()) s->next_term = std::chrono::system_clock::time_point(term_queue.begin()->first);
  std::shared_ptr<const Snapshot> done = std::move(s);
  std::lock_guard lock(publish_mu);
  published_ = done;
  return done;
}

// Answered here only for a route the table marks as answerable from the snapshot, and only when the
// answer is a 200 or a 304 the core thread would give now: anything else (a refusal, a bad request,
// a poll that parks, a token refused, a state the clock has moved past) goes to the core thread,
// which answers it and logs it as ever.
std::optional<ApiResponse> NodeService::Impl::read(const ApiRequest& q,
                                                   std::chrono::system_clock::time_point now) {
  if (!q.body.empty()) return std::nullopt;
  const auto m = match_route(q);
  if (m.route == nullptr || !m.route->from_snapshot()) return std::nullopt;
  const auto s = published();
  if (!s || s->generation != generation.load(std::memory_order_acquire)) return std::nullopt;
  if (s->next_term && now >= *s->next_term) return std::nullopt;
  if (q.target_error()) return std::nullopt;
  const auto caller = authenticator.authenticate(q, now);
  if (!caller) return std::nullopt;
  const r::Caller& who = caller->who;
  const auto x = snapshot_admits(*s, m, who);
  if (!x) return std::nullopt;
  auto answer = m.route->read(ReadCall{*s, q, who, *x});
  if (!answer || (answer->status != 200 && answer->status != 304)) return std::nullopt;
  return conditional(q, std::move(*answer));
}

}  // namespace gpunode::service
