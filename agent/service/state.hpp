// What a snapshot shows, kept in step by construction (private to gpunode_service): the
// reservations not ended (with their live index and the queue of their terms), the units, the
// workloads as last listed, the enforcement setting, and the generation that moves with them.
//
// The fields are private behind the few mutators that change them, and each mutator does every
// step itself: it commits through the store first when the change is stored (StateStore::commit
// and bump_revision are private to StateStore, NodeState their only caller), memory follows, and
// the generation moves. A caller cannot change what a snapshot shows without moving the
// generation, nor move the generation without a change: there is no other way in. leveldb's
// VersionSet::LogAndApply is the model (the only way a version changes, and it bumps the
// sequence itself). Core thread only; generation() is read by any thread.
#pragma once

#include <atomic>
#include <boost/json.hpp>
#include <chrono>
#include <cstdint>
#include <expected>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "gpunode/config/config.hpp"
#include "gpunode/reservations/live_index.hpp"
#include "gpunode/reservations/model.hpp"
#include "health_book.hpp"
#include "inventory.hpp"
#include "reservation_table.hpp"
#include "state_store.hpp"
#include "termination_ledger.hpp"

namespace gpunode::service::detail {

class NodeState {
 public:
  // The reservations not ended by the instant of their next term (scheduled: startsAt, active:
  // endsAt): what the terms look at, so their cost does not grow with the history.
  using TermQueue = std::set<std::pair<reservations::Time, std::string>>;

  // `ledger` and `health` are the commit's other followers (their rows); neither is shown by a
  // snapshot but through `inventory` (a unit's health).
  NodeState(StateStore& store, TerminationLedger& ledger, HealthBook& health, config::EnforcementMode mode)
      : store_(store), ledger_(ledger), health_(health), enforcement_(mode) {}
  NodeState(const NodeState&) = delete;
  NodeState& operator=(const NodeState&) = delete;

  // ---- reads -------------------------------------------------------------------------------------
  const ReservationTable& reservations() const { return reservations_; }
  const reservations::LiveIndex& live() const { return live_; }
  const TermQueue& term_queue() const { return term_queue_; }
  const Inventory& inventory() const { return inventory_; }
  const boost::json::array& workloads() const { return workloads_; }  // as last listed (GET state)
  // Whether the hypervisor's events say the last list still holds (GET workloads from the snapshot).
  const bool& workloads_current() const { return workloads_current_; }
  config::EnforcementMode enforcement() const { return enforcement_; }
  // Moves with everything above: any thread may read it.
  const std::atomic<std::uint64_t>& generation() const { return generation_; }

  // ---- the mutators: each commits what it must and moves the generation itself ------------------
  // What state.db held at open: the reservations not ended, the absent units' last JSON.
  void load(std::map<std::string, reservations::Reservation, std::less<>> live,
            const std::map<std::string, boost::json::object>& absent_units);
  // Stores `c` in one transaction; once stored, memory follows (the reservations, their live index
  // and terms, the termination ledger, the health book and the units' health) and the generation
  // moves when the revision did or a unit's health changed. Nothing changes when it fails.
  std::expected<Committed, store::DbError> apply(const Change& c, std::chrono::system_clock::time_point wall);
  // A scan's units: `c` stored first when there is one (the units' rows, their audit and event),
  // then `next` is the inventory. A failed commit keeps the old one.
  std::expected<void, store::DbError> replace_inventory(Inventory next, const Change* c,
                                                        std::chrono::system_clock::time_point wall);
  // A new list of the workloads (as GET state shows them) and its digest: the revision moves
  // (stored, so it never goes back), then the list. The same digest changes nothing. An error:
  // the old list stays (tried again with the next one).
  std::expected<void, store::DbError> replace_workloads(boost::json::array list, std::string digest);
  void set_workloads_current(bool current);
  void set_enforcement(config::EnforcementMode mode);

 private:
  void moved() { generation_.fetch_add(1, std::memory_order_acq_rel); }
  void follow(const reservations::Reservation& x);  // a reservation as committed
  void queue_term(const reservations::Reservation& x);

  StateStore& store_;
  TerminationLedger& ledger_;
  HealthBook& health_;

  ReservationTable reservations_;  // the ones not ended (the store counts the ended ones)
  reservations::LiveIndex live_;   // the same, by unit and start: a create's overlap check
  TermQueue term_queue_;
  std::map<std::string, reservations::Time, std::less<>> term_at_;  // each queued one's key in term_queue_
  Inventory inventory_;
  boost::json::array workloads_;
  std::string workloads_digest_;
  bool workloads_current_ = false;
  config::EnforcementMode enforcement_;
  std::atomic<std::uint64_t> generation_{1};
};

}  // namespace gpunode::service::detail
