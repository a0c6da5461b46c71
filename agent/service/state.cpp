// NodeState: what a snapshot shows, behind the mutators that commit it and move its generation.
#include "state.hpp"

#include <algorithm>
#include <memory>

namespace gpunode::service::detail {
namespace r = gpunode::reservations;

void NodeState::load(std::map<std::string, r::Reservation, std::less<>> live,
                     const std::map<std::string, boost::json::object>& absent_units) {
  ReservationTable::List sorted;
  sorted.reserve(live.size());
  for (auto& [id, x] : live) sorted.push_back(std::make_shared<const r::Reservation>(std::move(x)));
  reservations_.assign(std::move(sorted));
  inventory_.set_absent(absent_units);
  live_.clear();
  term_queue_.clear();
  term_at_.clear();
  for (const auto& x : reservations_) {
    live_.follow(nullptr, &x);
    queue_term(x);
  }
  moved();
}

std::expected<Committed, store::DbError> NodeState::apply(const Change& c,
                                                          std::chrono::system_clock::time_point wall) {
  const auto revision = store_.revision();
  auto done = store_.commit(c, wall);
  if (!done) return done;
  // Committed: now memory follows.
  for (const auto& x : c.upserts) follow(x);
  for (const auto& row : c.terminations) {
    TerminationRow stored = row;
    if (row.audit_index) stored.audit_seq = done->audit_seqs[*row.audit_index];
    ledger_.follow(std::move(stored));
  }
  bool health_moved = false;
  if (!c.health.empty()) {
    health_.follow(c.health);
    if (!c.health.units.empty()) {
      inventory_ = inventory_.with_health([this](std::string_view id) { return health_.unit_health(id); });
      health_moved = true;
    }
  }
  if (store_.revision() != revision || health_moved) moved();
  return done;
}

void NodeState::follow(const r::Reservation& x) {
  live_.follow(reservations_.find(x.id), &x);
  queue_term(x);
  if (!x.ended())
    reservations_.put(x);
  else
    reservations_.erase(x.id);  // it ended: from here on it is read from disk
}

void NodeState::queue_term(const r::Reservation& x) {
  if (auto was = term_at_.find(x.id); was != term_at_.end()) {
    term_queue_.erase({was->second, x.id});
    term_at_.erase(was);
  }
  if (x.state == r::State::ended) return;
  const r::Time at = x.state == r::State::scheduled ? std::min(x.starts_at, x.ends_at) : x.ends_at;
  term_queue_.emplace(at, x.id);
  term_at_.emplace(x.id, at);
}

std::expected<void, store::DbError> NodeState::replace_inventory(Inventory next, const Change* c,
                                                                 std::chrono::system_clock::time_point wall) {
  if (c != nullptr) {
    if (auto done = apply(*c, wall); !done) return std::unexpected(std::move(done.error()));
  }
  inventory_ = std::move(next);
  moved();
  return {};
}

std::expected<void, store::DbError> NodeState::replace_workloads(boost::json::array list,
                                                                 std::string digest) {
  if (digest == workloads_digest_) return {};
  if (auto bumped = store_.bump_revision(); !bumped) return std::unexpected(std::move(bumped.error()));
  workloads_ = std::move(list);
  workloads_digest_ = std::move(digest);
  moved();
  return {};
}

void NodeState::set_workloads_current(bool current) {
  if (current == workloads_current_) return;
  workloads_current_ = current;
  moved();
}

void NodeState::set_enforcement(config::EnforcementMode mode) {
  enforcement_ = mode;
  moved();
}

}  // namespace gpunode::service::detail
