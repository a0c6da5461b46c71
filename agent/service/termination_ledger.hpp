// The termination ledger: which spot terminations are written ahead and not decided yet, which of
// them a running batch holds, and the batches themselves (CONTRACT §7 A termination written
// ahead). Private to gpunode_service; plain bookkeeping on the state thread, no I/O: the rows it
// follows are the ones the store committed.
#pragma once

#include <boost/json/array.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gpunode/service/node_service.hpp"
#include "gpunode/vmctl/vmctl.hpp"
#include "state_store.hpp"

namespace gpunode::service::detail {

// One VM of a batch: its domain, the units it occupies, the record written into the domain
// (whose audit id is the write-ahead record's), and the grace it gets.
struct BatchVm {
  std::int64_t audit_seq = 0;
  vmctl::Domain domain;
  std::vector<std::string> unit_ids;
  vmctl::TerminationRecord record;
  std::chrono::seconds grace{0};
};

// The terminations one call (terminate-spot, reclaim) or the agent runs together, and what the
// call's answer needs once they are done.
struct Batch {
  enum class Kind { terminate_spot, reclaim, agent } kind = Kind::agent;
  Caller caller;
  std::optional<std::string> request_id;
  std::optional<std::string> reservation_id;  // reclaim
  std::vector<BatchVm> vms;
  boost::json::array left_running;  // decided before the run
  boost::json::array terminating;   // domains whose termination was already underway
  std::optional<IdempotencyDraft> idempotency;
};

class TerminationLedger {
 public:
  // The rows cut short by a crash, as loaded at open.
  void load(std::map<std::int64_t, TerminationRow> pending) { pending_ = std::move(pending); }
  // A row as committed: pending rows are kept, decided ones leave.
  void follow(TerminationRow row);

  const std::map<std::int64_t, TerminationRow>& pending() const { return pending_; }
  // The stored row for `audit_seq`, or a pending one made from the batch's VM.
  TerminationRow row_of(const BatchVm& vm) const;
  // Domains with a termination written ahead and not decided: not started a second time.
  std::set<std::string> underway_domains() const;
  // Whether a running batch holds the pending row `audit_seq`.
  bool held(std::int64_t audit_seq) const { return held_.contains(audit_seq); }
  // Whether a running batch answers a call with this (caller, Idempotency-Key).
  bool running_key(const std::string& caller, const std::string& key) const;

  // Starts a batch: its VMs' rows are held until it is taken back. Returns its id.
  std::uint64_t start(Batch b);
  // The batch's jobs for the driver.
  std::optional<Work> work(std::uint64_t id) const;
  // Ends a batch: its rows are no longer held. Nothing if `id` is not running.
  std::optional<Batch> take(std::uint64_t id);

 private:
  std::map<std::int64_t, TerminationRow> pending_;  // by audit seq
  std::set<std::int64_t> held_;                     // pending rows a running batch holds
  std::map<std::uint64_t, Batch> batches_;
  std::uint64_t next_ = 1;
};

}  // namespace gpunode::service::detail
