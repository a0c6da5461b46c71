// NodeService::Impl and the helpers its translation units share; private to gpunode_service.
//   state_store.cpp         StateStore: state.db, its migrations and the one commit
//   inventory.cpp           Inventory: present and absent units; what a scan changes
//   termination_ledger.cpp  TerminationLedger: terminations written ahead, running batches
//   authenticator.cpp       Authenticator: bearer tokens and their cache
//   node_state.cpp          loading, commit, scan, terms, request plumbing, what a route may ask
//                           (Asks), the committer (carry_out), the domains as listed, and
//                           NodeService's public member functions
//   routes.cpp              the route table's rows and handlers, the core thread's dispatch
//   reservation_routes.cpp  the reads the store answers (audit, ended reservations), reserved
//                           capacity
//   reservation_decisions.cpp, spot_decisions.cpp: the mutating routes as decisions (decision.hpp)
//   workload_routes.cpp     GET workloads, unentitled domains, the hook's domain admission
//   spot_routes.cpp         termination batches: started, dry runs, finished, observed
//   checkpoints.cpp         signed audit checkpoints (CONTRACT §12)
//   health_book.cpp, health_routes.cpp, health_store.cpp: unit health (CONTRACT §13): what is
//                           kept, the poll, the admin socket's routes, the rows in state.db
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
#include "decision.hpp"
#include "gpunode/discovery/sysfs_reader.hpp"
#include "gpunode/proof/node_key.hpp"
#include "gpunode/reservations/entitlement.hpp"
#include "gpunode/reservations/live_index.hpp"
#include "gpunode/reservations/permissions.hpp"
#include "gpunode/service/node_service.hpp"
#include "gpunode/service/reservation_json.hpp"
#include "gpunode/service/routes.hpp"
#include "gpunode/service/spot_plan.hpp"
#include "health_book.hpp"
#include "inventory.hpp"
#include "reservation_table.hpp"
#include "snapshot.hpp"
#include "state_store.hpp"
#include "termination_ledger.hpp"

namespace gpunode::service {
namespace r = gpunode::reservations;
namespace json = boost::json;

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
  // The domains as last listed (for a request, or by the driver's refresh) and the units each
  // occupies; `listed_current` while the hypervisor's events say the list still holds (an event,
  // a failed list or a batch of terminations ends it). A route asks for them through Asks.
  std::shared_ptr<const WorkloadListing> listed;
  std::vector<detail::Workload> listed_workloads;
  bool listed_current = false;
  // Takes a new list: what it shows is noted (the revision, unentitled domains, admitted ones
  // that now run) and kept.
  void take_listing(std::shared_ptr<const WorkloadListing> listing);
  void listing_stale();
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
  r::ReservationsView all_reservations() const { return reservations.all(); }

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
  ApiResponse commit_response(Change& c, ApiResponse resp);
  void purge_idempotency();
  r::Time last_purge{};

  // ---- routes.cpp: the core's dispatch over the route table (gpunode/service/routes.hpp) ---------
  Outcome route(const ApiRequest& q);
  // Whether the path's scope holds for this caller (else the 404): the node is this one and seen,
  // the reservation found (into `x`, the stored one kept in `kept`) and seen, the org's capacity
  // readable.
  bool admits(const RouteMatch& m, const Caller& c, std::optional<r::Reservation>& kept,
              const r::Reservation*& x);

  // ---- reservation_routes.cpp --------------------------------------------------------------------
  // The committer: carries out what a route decided (decision.hpp), the one place a request's
  // change is committed. The facts the routes decide on, with `asks` for the reads beyond them.
  class Asks;
  detail::Facts facts(const Asks& asks) const;
  Outcome carry_out(detail::Decision d);
  ApiResponse audit(const ApiRequest& q, const Caller& c);
  // GET reservations whose list holds ended ones: paged from the store (reads.cpp answers the rest).
  ApiResponse stored_reservations(const ApiRequest& q, const Caller& c);
  ApiResponse reserved_capacity(const Caller& c, const std::string& org);

  // ---- workload_routes.cpp: workloads (CONTRACT §5, §7 Occupancy) ------------------------------
  using Workload = detail::Workload;
  std::vector<Workload> occupants(std::vector<vmctl::Domain> list) const;
  static json::object workload_json(const Workload& w);
  Outcome workloads(const Asks& asks, const Caller& c);

  // entitlement (CONTRACT §4 capacity and admission): the rules' table over this node's facts;
  // `count_health` false for a VM already running (a failing unit refuses new starts only, §13)
  r::Entitlement entitled(const std::string& org, vmctl::Tier tier, const std::string& unit_id,
                          bool count_health = true) const;
  // POST /v1/admin/domain-admission (admin socket only): the libvirt hook asks (CONTRACT §9).
  ApiResponse domain_admission(const ApiRequest& q);
  std::vector<std::string> hostdev_units(const vmctl::DomainXmlFacts& facts, json::array& reasons) const;
  void report_refusal(const ApiRequest& q, const vmctl::DomainXmlFacts& facts,
                      const std::vector<std::string>& unit_ids, const json::array& reasons);

  // ---- spot_routes.cpp: the spot market, reclaim and terminate-spot (CONTRACT §4, §5, §7) ------
  bool note_workloads(const std::vector<Workload>& ws);
  void judge_workloads(const std::vector<Workload>& ws);
  ApiResponse unentitled_route() const;
  std::optional<std::string> holder_of(const std::vector<std::string>& unit_ids) const;
  static json::object left_json(const vmctl::Domain& d, const std::vector<std::string>& unit_ids,
                                std::string_view reason);
  void vacate(const std::vector<Workload>& ws, Change& ch);
  Outcome start_batch(detail::Terminate t);
  ApiResponse answer_batch(const Batch& b, json::array terminated, json::array left,
                           const std::vector<reservations::Reservation>& upserts, bool dry_run = false);
  ApiResponse dry_run_answer(const detail::Terminate& t);
  static json::object terminated_json(const vmctl::Domain& d, const std::vector<std::string>& unit_ids);
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

  // ---- health_routes.cpp: unit health (CONTRACT §13) -----------------------------------------------
  detail::HealthBook health;
  // The functions each present unit is judged on, rebuilt when the inventory's membership changed.
  void refresh_health_targets();
  // One poll: read, judge, and commit what changed (nothing when nothing did).
  void poll_health();
  void count_rises(const std::vector<health::Rises>& rises, bool stored);
  void health_gauges(metrics::NodeGauges& g) const;
  json::object unit_health_json(const discovery::Unit& u) const;
  // GET /v1/admin/health and GET /v1/admin/units/{unitId}/health (admin socket only); the clear is
  // a decision (routes::health_clear).
  ApiResponse health_answer() const;
  ApiResponse unit_health_answer(std::string_view unit_id) const;

  // ---- checkpoints.cpp: signed audit checkpoints (CONTRACT §12) ---------------------------------
  std::shared_ptr<const proof::NodeKey> audit_key;  // set by the daemon at start
  ApiResponse audit_checkpoints(const ApiRequest& q, const Caller& c);
  ApiResponse checkpoint_route();  // POST /v1/admin/audit/checkpoint
  error::Result<std::pair<json::object, bool>> checkpoint_head();
};

// The reads a route may make beyond its facts (decision.hpp), for one request.
class NodeService::Impl::Asks final : public detail::Lookups {
 public:
  Asks(Impl& impl, const ApiRequest& q) : impl_(impl), q_(q) {}
  std::expected<std::optional<IdempotencyDraft>, ApiResponse> idempotency(const ApiRequest& q,
                                                                          const Caller& c) const override;
  detail::WorkloadsOrNot workloads(std::chrono::milliseconds max_age) const override;
  std::vector<detail::Workload> starting() const override;
  const r::Reservation* reservation(std::string_view id, std::optional<r::Reservation>& kept) const override;
  std::string new_id(std::string_view prefix) const override;

 private:
  Impl& impl_;  // read only, but for the store's cached statements and the admitted domains' expiry
  const ApiRequest& q_;
};

namespace detail {
// What a route's handler is given on the core thread (the route table's `handle`).
struct RouteCall {
  NodeService::Impl& impl;
  const ApiRequest& q;
  const Caller* caller;  // nullptr on a route answered before authentication (/healthz)
  const RouteMatch& m;
  const reservations::Reservation* reservation;  // Scope::reservation: the one the path names
};
}  // namespace detail

}  // namespace gpunode::service
