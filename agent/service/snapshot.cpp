// NodeService::Impl's snapshot: built on the core thread when the state moved, and the reads the
// network threads answer from it (NodeService::read).
#include "gpunode/reservations/permissions.hpp"
#include "impl.hpp"

namespace gpunode::service {
using namespace detail;

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

// Answered here only when the answer is a 200 or a 304 the core thread would give now: anything
// else (a refusal, a bad request, a poll that parks, a token refused, a state the clock has moved
// past) goes to the core thread, which answers it and logs it as ever.
std::optional<ApiResponse> NodeService::Impl::read(const ApiRequest& q,
                                                   std::chrono::system_clock::time_point now) {
  if (q.method != "GET" || !q.body.empty() || !q.path.starts_with("/v1/nodes/")) return std::nullopt;
  const auto s = published();
  if (!s || s->generation != generation.load(std::memory_order_acquire)) return std::nullopt;
  if (s->next_term && now >= *s->next_term) return std::nullopt;
  if (q.target_error()) return std::nullopt;
  std::string why;
  const auto caller = authenticator.authenticate(q, now, why);
  if (!caller) return std::nullopt;
  const r::Caller& who = caller->who;
  const auto seg = q.segments();
  // Asked whatever the node id: one lookup (the table's OrgIndex), so a node id that is not this
  // node costs what this node's does to a caller that does not see it (CONTRACT §10).
  const bool sees = r::may(r::Action::see_node, who, r::Subject{s->node, s->reservations.all(), nullptr, {}});
  if (seg.size() < 4 || seg.size() > 5 || seg[2] != s->node.node_id || !sees) return std::nullopt;
  std::optional<ApiResponse> answer;
  if (seg.size() == 4 && seg[3] == "units") {
    answer = units_answer(*s, who);
  } else if (seg.size() == 4 && seg[3] == "state") {
    auto decided = state_answer(*s, q, who);
    if (auto* a = std::get_if<ApiResponse>(&decided)) answer = std::move(*a);
  } else if (seg.size() == 4 && seg[3] == "workloads") {
    if (s->workloads_current &&
        r::may(r::Action::list_workloads, who, r::Subject{s->node, s->reservations.all(), nullptr, {}}))
      answer = workloads_answer(s->node.node_id, s->workloads);
  } else if (seg.size() == 4 && seg[3] == "capacity") {
    answer = capacity_answer(*s, q, who);
  } else if (seg.size() == 4 && seg[3] == "reservations") {
    if (auto query = reservation_query(q); query && !query->lists_ended())
      answer = reservations_answer(*s, *query, who);
  } else if (seg.size() == 5 && seg[3] == "reservations") {
    const auto* x = s->reservations.find(seg[4]);
    if (x != nullptr &&
        r::may(r::Action::see_reservation, who, r::Subject{s->node, s->reservations.all(), x, {}}))
      answer = reservation_answer(*x);
  }
  if (!answer || (answer->status != 200 && answer->status != 304)) return std::nullopt;
  return conditional(q, std::move(*answer));
}

}  // namespace gpunode::service
