// NodeService::Impl and the helpers its translation units share; private to gpunode_service.
//   state_store.cpp         StateStore: state.db, its migrations and the one commit
//   inventory.cpp           Inventory: present and absent units; what a scan changes
//   termination_ledger.cpp  TerminationLedger: terminations written ahead, running batches
//   authenticator.cpp       Authenticator: bearer tokens and their cache
//   node_state.cpp          loading, commit, scan, terms, request plumbing,
//                           and NodeService's public member functions
//   reservation_routes.cpp  routing, units, reservations, audit, state, reserved capacity, ETags
//   workload_routes.cpp     workloads, occupancy, entitlement (capacity, admission), release
//   spot_routes.cpp         the spot market: reclaim, terminate-spot and their termination batches
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <boost/json.hpp>
#include <map>
#include <mutex>
#include <set>
#include <string_view>

#include "admitted.hpp"
#include "authenticator.hpp"
#include "gpunode/discovery/sysfs_reader.hpp"
#include "gpunode/proof/node_key.hpp"
#include "gpunode/reservations/entitlement.hpp"
#include "gpunode/reservations/live_index.hpp"
#include "gpunode/reservations/permissions.hpp"
#include "gpunode/service/node_service.hpp"
#include "gpunode/service/reservation_json.hpp"
#include "gpunode/service/spot_plan.hpp"
#include "inventory.hpp"
#include "reservation_table.hpp"
#include "snapshot.hpp"
#include "state_store.hpp"
#include "termination_ledger.hpp"

namespace gpunode::service {
namespace r = gpunode::reservations;
namespace json = boost::json;

namespace detail {

inline r::Time to_time(std::chrono::system_clock::time_point t) {
  return std::chrono::time_point_cast<std::chrono::seconds>(t);
}

inline Caller agent_caller() {
  return Caller{r::Caller{"gpunode-agent", std::nullopt, {}, "agent"}};
}

inline ApiResponse forbidden(std::string_view detail) {
  return problem(403, "forbidden", detail);
}

// 503 storage-unavailable for a store error: `what` failed because of its kind ("disk full",
// "busy", "corrupt", ...: store::DbError::kind, which names no file or statement), then `after`.
// The log line, written where it failed, carries the whole error.
inline ApiResponse storage_problem(const store::DbError& e, std::string_view what, std::string_view after) {
  return problem(503, "storage-unavailable", fmt::format("{} ({}); {}", what, e.kind(), after));
}

// 422 unknown-unit naming each of `ids` that `current` does not hold (release, reclaim).
inline std::optional<ApiResponse> units_not_held(const reservations::Reservation& current,
                                                 const std::vector<std::string>& ids) {
  std::vector<FieldProblem> unknown;
  for (const auto& u : ids) {
    if (!current.holds_unit(u))
      unknown.push_back({"unitIds", fmt::format("{} is not a unit of reservation {}", u, current.id)});
  }
  if (unknown.empty()) return std::nullopt;
  return problem(422, "unknown-unit", "some units are not units of this reservation", unknown);
}

inline ApiResponse with_header(ApiResponse resp, std::string name, std::string value) {
  resp.headers.emplace_back(std::move(name), std::move(value));
  return resp;
}

inline std::string etag_of_version(std::int64_t version) {
  return fmt::format("\"{}\"", version);
}

}  // namespace detail

struct NodeService::Impl {
  using Caller = detail::Caller;
  using Change = detail::Change;
  using IdempotencyDraft = detail::IdempotencyDraft;
  using TerminationRow = detail::TerminationRow;

  ServiceOptions opt;
  const discovery::PciIds* names = nullptr;
  Clock clock;
  LogSink log;
  detail::StateStore store;
  std::unique_ptr<discovery::SysfsReader> reader;

  detail::ReservationTable reservations;  // the ones not ended (StateStore counts the ended ones)
  // A reservation by id: the live one, else the stored one (ended) moved into `kept`; nullptr when
  // there is none, or (logged) when the store could not be read.
  const r::Reservation* find_reservation(std::string_view id, std::optional<r::Reservation>& kept);
  // The reservations not ended, by unit and start: what a create or an amend checks for overlap,
  // so its cost follows the few terms near the candidate's, not the unit's whole calendar or the
  // history. Follows `reservations` in load() and commit().
  r::LiveIndex live;
  detail::Inventory inventory;
  bool has_hypervisor = false;
  const WorkloadListing* listing = nullptr;  // the current request's, while handle() runs
  // Terminations written ahead and not decided, and the batches running them.
  detail::TerminationLedger terminations;
  using BatchVm = detail::BatchVm;
  using Batch = detail::Batch;
  // Domains the hook's admission let through that libvirt has not listed running yet.
  detail::AdmittedDomains admitted;
  // The workloads as last listed (GET .../state shows them; a change moves the revision).
  json::array observed_workloads;
  std::string observed_digest;
  // CONTRACT §9 "What the hook cannot see": the active domains of the last listing that are on
  // units they are not entitled to, by domain uuid, each as its workload.unentitled data; and the
  // uuids whose event is stored (a domain gives one event while it stays unentitled; after a
  // restart it is reported again). Core thread only, like the rest of Impl.
  std::map<std::string, json::object> unentitled;
  std::set<std::string> unentitled_reported;
  // The last listing, judged again when a commit changes reservations (a term starts, one ends):
  // entitlement moves with them, not only with the list.
  std::vector<spot::Occupant> last_workloads;
  bool judging = false;
  Authenticator authenticator{nullptr};
  // The counters of /metrics (terminations by result, domain admissions by result) since start;
  // gauges() adds the rest. The last scan's duration (read and rules), in seconds.
  metrics::NodeGauges counted;
  double last_scan_seconds = 0;

  Impl(ServiceOptions o, detail::StateStore s) : opt(std::move(o)), store(std::move(s)) {
    store.on_revision_moved([this] { touch(); });  // before the commit's answer goes out
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  r::NodeView node() const { return {opt.node_id, opt.owner_org}; }
  // CONTRACT §4's relation table (reservations::may) for this caller on this node, and on `x` when
  // the action is on one reservation.
  bool allowed(r::Action action, const Caller& c, const r::Reservation* x = nullptr) const {
    return r::may(action, c.who, r::Subject{node(), all_reservations(), x, {}});
  }
  r::Time now() const { return detail::to_time(clock()); }
  const std::vector<r::Reservation>& all_reservations() const { return reservations.all(); }

  // The snapshot (snapshot.hpp). `generation` moves with anything a snapshot shows (a commit, a
  // revision bump, a reload setting, a new inventory): core thread writes, any thread reads.
  // `published_` is the last one built: the core thread stores it, network threads copy it, under
  // `publish_mu` (held for a shared_ptr copy).
  std::atomic<std::uint64_t> generation{1};
  mutable std::mutex publish_mu;
  std::shared_ptr<const detail::Snapshot> published_;  // guarded by publish_mu
  std::shared_ptr<const detail::Snapshot> published() const {
    std::lock_guard lock(publish_mu);
    return published_;
  }
  void touch() { generation.fetch_add(1, std::memory_order_acq_rel); }
  // Core thread: the snapshot of the current state, built and published when the state moved.
  std::shared_ptr<const detail::Snapshot> snapshot();
  // The committer's last step: after every change (each public member of NodeService that may
  // change the state ends with it, before its answer goes out), the next snapshot is published, so
  // that the reads after a change are answered by the network threads with no hop.
  void publish() { (void)snapshot(); }
  // Any thread: the answer to a read the published snapshot can give (NodeService::read).
  std::optional<ApiResponse> read(const ApiRequest& q, std::chrono::system_clock::time_point now);

  HeldLog* held_log = nullptr;  // the current request's, while handle(request, held) runs
  void say(LogLevel level, const std::string& text) const {
    if (held_log != nullptr)
      held_log->lines.emplace_back(level, text);
    else if (log)
      log(level, text);
  }

  // ---- node_state.cpp ----------------------------------------------------------------------------
  // loading: what the store read at open
  void load();

  // the one way state changes: the store writes `c`, then memory follows
  std::expected<detail::Committed, store::DbError> commit(const Change& c);

  // units
  void scan(bool first);
  // The reader's fingerprint taken before the last full read whose answer is in `inventory`
  // (nothing after a read whose change could not be stored: the next backstop reads again).
  std::optional<std::string> scanned_fingerprint;
  void backstop_scan();
  metrics::NodeGauges gauges() const;

  // terms: the reservations not ended, by the instant of their next term (scheduled: startsAt,
  // active: endsAt), kept by commit() and load(). apply_terms() and next_term() look only here, so
  // their cost does not grow with the reservations kept in history.
  std::set<std::pair<r::Time, std::string>> term_queue;
  std::map<std::string, r::Time, std::less<>> term_at;  // each queued reservation's key in term_queue
  void queue_term(const r::Reservation& x);
  std::optional<r::Time> apply_terms();
  std::optional<r::Time> next_term() const;

  // request plumbing
  std::expected<Caller, ApiResponse> authenticate(const ApiRequest& q);
  static std::string caller_key(const Caller& c);
  std::optional<ApiResponse> idempotent_replay(const ApiRequest& q, const Caller& c,
                                               std::optional<IdempotencyDraft>& draft);
  ApiResponse commit_response(Change& c, ApiResponse resp);
  void purge_idempotency();
  r::Time last_purge{};

  // ---- reservation_routes.cpp --------------------------------------------------------------------
  Outcome route(const ApiRequest& q);
  ApiResponse method_not_allowed(std::string allow);
  Outcome node_route(const ApiRequest& q, const Caller& c, const std::vector<std::string>& seg);
  std::optional<ApiResponse> check_units(const std::vector<std::string>& ids);
  std::optional<ApiResponse> check_overlap(const r::Reservation& candidate);
  Outcome create(const ApiRequest& q, const Caller& c);
  Outcome amend(const ApiRequest& q, const Caller& c, const r::Reservation& current);
  ApiResponse end(const ApiRequest& q, const Caller& c, const r::Reservation& current);
  ApiResponse audit(const ApiRequest& q, const Caller& c);
  // GET reservations whose list holds ended ones: paged from the store (reads.cpp answers the rest).
  ApiResponse stored_reservations(const ApiRequest& q, const Caller& c);
  ApiResponse reserved_capacity(const ApiRequest& q, const Caller& c, const std::string& org);

  // ---- workload_routes.cpp: workloads (CONTRACT §5, §7 Occupancy) ------------------------------
  using Workload = spot::Occupant;  // a domain and the units its PCI hostdevs are members of

  // The domains as listed for this request; without a list, NeedsWorkloads{max_age}.
  std::expected<std::vector<Workload>, Outcome> workloads_now(std::chrono::milliseconds max_age = {});
  // How old the occupancy check's list may be when events keep it current (CONTRACT §7 Occupancy
  // is a check at the moment of the change; the hook's admission closes the start race).
  static constexpr std::chrono::milliseconds kOccupancyListAge{5000};
  std::vector<Workload> occupants(std::vector<vmctl::Domain> list) const;
  static json::value opt_str(const std::optional<std::string>& s) {
    return s ? json::value(*s) : json::value(nullptr);
  }
  static json::object workload_json(const Workload& w);
  Outcome workloads(const Caller& c);
  std::optional<Outcome> check_occupancy(const r::Reservation& x, const std::vector<std::string>& checked,
                                         r::Time t, json::array& spot);

  // entitlement (CONTRACT §4 capacity and admission): the rules' table over this node's facts
  r::Entitlement entitled(const std::string& org, vmctl::Tier tier, const std::string& unit_id) const;
  ApiResponse admission(const ApiRequest& q, const Caller& c);
  // POST /v1/admin/domain-admission (admin socket only): the libvirt hook asks (CONTRACT §9).
  ApiResponse domain_admission(const ApiRequest& q);
  std::vector<std::string> hostdev_units(const vmctl::DomainXmlFacts& facts, json::array& reasons) const;
  void report_refusal(const ApiRequest& q, const vmctl::DomainXmlFacts& facts,
                      const std::vector<std::string>& unit_ids, const json::array& reasons);

  // release (CONTRACT §4)
  ApiResponse release(const ApiRequest& q, const Caller& c, const r::Reservation& current);

  // ---- spot_routes.cpp: the spot market, reclaim and terminate-spot (CONTRACT §4, §5, §7) ------
  void note_workloads(const std::vector<Workload>& ws);
  void judge_workloads(const std::vector<Workload>& ws);
  ApiResponse unentitled_route() const;
  std::optional<std::string> holder_of(const std::vector<std::string>& unit_ids) const;
  static json::object left_json(const vmctl::Domain& d, const std::vector<std::string>& unit_ids,
                                std::string_view reason);
  void vacate(const std::vector<Workload>& ws, Change& ch);
  Outcome start_batch(Batch b, Change base, const spot::Plan& plan, std::chrono::seconds grace,
                      const std::optional<std::string>& reason);
  ApiResponse answer_batch(const Batch& b, json::array terminated, json::array left,
                           const std::vector<reservations::Reservation>& upserts);
  using TermResult = std::expected<vmctl::TerminateResult, vmctl::VmError>;
  struct BatchTally {  // what a batch's outcomes add to its answer and to gpunode_terminations_total
    json::array terminated, left;
    std::optional<std::string> unavailable;  // libvirt went away: those VMs stay pending
    std::uint64_t ok = 0, failed = 0;
  };
  void record_outcome(const BatchVm& vm, const TermResult& result, bool agent, Change& ch, BatchTally& t);
  ApiResponse finish(std::uint64_t id, std::vector<vmctl::TerminationOutcome> outcomes,
                     const std::expected<std::vector<vmctl::Domain>, vmctl::VmError>& after);
  std::optional<Work> observe(const std::vector<vmctl::Domain>& domains);
  Outcome terminate_spot(const ApiRequest& q, const Caller& c);
  Outcome reclaim(const ApiRequest& q, const Caller& c, const r::Reservation& current);

  // ---- checkpoints.cpp: signed audit checkpoints (CONTRACT §12) ---------------------------------
  std::shared_ptr<const proof::NodeKey> audit_key;  // set by the daemon at start
  ApiResponse audit_checkpoints(const ApiRequest& q, const Caller& c);
};

}  // namespace gpunode::service
