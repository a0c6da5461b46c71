// NodeService::Impl and the helpers its translation units share; private to gpunode_service.
//   state_store.cpp         StateStore: state.db, its migrations and the one commit
//   state.cpp               NodeState: what a snapshot shows, behind the mutators that commit it
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
#include "state.hpp"
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
  detail::StateStore store;  // its reads; only `state` writes a change
  std::unique_ptr<discovery::SysfsReader> reader;
  // Terminations written ahead and not decided, and the batches running them.
  detail::TerminationLedger terminations;
  detail::HealthBook health;  // unit health (health_routes.cpp)

  // What a snapshot shows, private behind the mutators that commit it and move its generation
  // (state.hpp). What follows are read-only views of it, under the names the code reads them by:
  // Impl cannot change them but through `state`, which moves the generation itself.
  detail::NodeState state{store, terminations, health, opt.enforcement};
  const detail::ReservationTable& reservations = state.reservations();  // the ones not ended
  // The reservations not ended, by unit and start: what a create or an amend checks for overlap,
  // so its cost follows the few terms near the candidate's, not the unit's whole calendar or the
  // history.
  const r::LiveIndex& live = state.live();
  const detail::Inventory& inventory = state.inventory();
  // The workloads as last listed (GET .../state shows them; a change moves the revision), and
  // whether the hypervisor's events say the list still holds.
  const json::array& observed_workloads = state.workloads();
  const bool& listed_current = state.workloads_current();
  // The reservations not ended, by the instant of their next term: apply_terms() and next_term()
  // look only here, so their cost does not grow with the reservations kept in history.
  const detail::NodeState::TermQueue& term_queue = state.term_queue();
  // Moves with anything a snapshot shows: core thread writes (through `state`), any thread reads.
  const std::atomic<std::uint64_t>& generation = state.generation();

  // A reservation by id: the live one, else the stored one (ended) moved into `kept`; nullptr when
  // there is none, or (logged) when the store could not be read.
  const r::Reservation* find_reservation(std::string_view id, std::optional<r::Reservation>& kept);
  bool has_hypervisor = false;
  // The domains as last listed (for a request, or by the driver's refresh) and the units each
  // occupies; `listed_current` while the hypervisor's events say the list still holds (an event,
  // a failed list or a batch of terminations ends it). A route asks for them through Asks.
  std::shared_ptr<const WorkloadListing> listed;
  std::vector<detail::Workload> listed_workloads;
  // Takes a new list: what it shows is noted (the revision, unentitled domains, admitted ones
  // that now run) and kept.
  void take_listing(std::shared_ptr<const WorkloadListing> listing);
  void listing_stale();
  using BatchVm = detail::BatchVm;
  using Batch = detail::Batch;
  // Domains the hook's admission let through that libvirt has not listed running yet.
  detail::AdmittedDomains admitted;
  // CONTRACT §9 "What the hook cannot see": the active domains of the last listing that are on
  // units they are not entitled to, by domain uuid, each as its workload.unentitled data; and the
  // uuids whose event is stored (a domain gives one event while it stays unentitled; after a
  // restart it is reported again). Core thread only, like the rest of Impl.
  std::map<std::string, json::object> unentitled;
  std::set<std::string> unentitled_reported;
  // The last listing, judged again when a commit changes reservations (a term starts, one ends):
  // entitlement moves with them, not only with the list.
  std::vector<spot::Occupant> last_workloads;
  Authenticator authenticator{nullptr};
  // The counters of /metrics (terminations by result, domain admissions by result) since start;
  // gauges() adds the rest. The last scan's duration (read and rules), in seconds.
  metrics::NodeGauges counted;
  double last_scan_seconds = 0;

  Impl(ServiceOptions o, detail::StateStore s) : opt(std::move(o)), store(std::move(s)) {}
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

  // The snapshot (snapshot.hpp), built from `state` at its generation. `published_` is the last one
  // built: the core thread stores it, network threads copy it, under `publish_mu` (held for a
  // shared_ptr copy).
  mutable std::mutex publish_mu;
  std::shared_ptr<const detail::Snapshot> published_;  // guarded by publish_mu
  std::shared_ptr<const detail::Snapshot> published() const {
    std::lock_guard lock(publish_mu);
    return published_;
  }
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

  // units
  void scan(bool first);
  // The reader's fingerprint taken before the last full read whose answer is in `inventory`
  // (nothing after a read whose change could not be stored: the next backstop reads again).
  std::optional<std::string> scanned_fingerprint;
  void backstop_scan();
  metrics::NodeGauges gauges() const;

  // terms: due ones applied (each a change carried out), and the next one's instant
  std::optional<r::Time> apply_terms();
  std::optional<r::Time> next_term() const;

  // request plumbing
  // A request's outcome (route()), terms applied first and the answer made conditional; the
  // caller publishes.
  Outcome respond(const ApiRequest& q);
  std::expected<Caller, ApiResponse> authenticate(const ApiRequest& q);
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
  // change is committed; the agent's own changes (terms, health polls, a reclaim vacated) go
  // through carry_out(Change), which a request's commit goes through too. A scan's units are stored
  // by NodeState::replace_inventory with the inventory they make, in one step. After a change that
  // moved reservations, the last listing is judged again (rejudge), and its events stored at once
  // through `state`, never through carry_out: nothing re-enters the committer. The facts the
  // routes decide on, with `asks` for the reads beyond them.
  class Asks;
  detail::Facts facts(const Asks& asks) const;
  Outcome carry_out(detail::Decision d);
  std::expected<detail::Committed, store::DbError> carry_out(const Change& c);
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
  // POST /v1/admin/domain-admission (admin socket only): the libvirt hook asks (CONTRACT §9); the
  // answer, carried out from admission_decision (a refusal's event is stored with it).
  ApiResponse domain_admission(const ApiRequest& q);
  detail::Decision admission_decision(const ApiRequest& q);
  std::vector<std::string> hostdev_units(const vmctl::DomainXmlFacts& facts, json::array& reasons) const;
  Change refusal(const ApiRequest& q, const vmctl::DomainXmlFacts& facts,
                 const std::vector<std::string>& unit_ids, const json::array& reasons) const;

  // ---- spot_routes.cpp: the spot market, reclaim and terminate-spot (CONTRACT §4, §5, §7) ------
  bool note_workloads(const std::vector<Workload>& ws);
  // The entitlement of what runs: judged() is the judgement of a list (changes nothing); rejudge()
  // takes it for the last listing and stores its events.
  struct Judged {
    std::map<std::string, json::object> unentitled;
    Change events;
    std::vector<std::string> fresh;  // reported by `events`
  };
  Judged judged(const std::vector<Workload>& ws) const;
  void rejudge();
  ApiResponse unentitled_route() const;
  std::optional<std::string> holder_of(const std::vector<std::string>& unit_ids) const;
  static json::object left_json(const vmctl::Domain& d, const std::vector<std::string>& unit_ids,
                                std::string_view reason);
  void vacate(const std::vector<Workload>& ws, Change& ch);
  // A Terminate carried out: what to do instead when no VM is to be stopped (a dry run's answer, a
  // no-op, a change to commit); else the write-ahead records go into its change (their indexes in
  // its audits returned), and once committed the batch runs.
  std::optional<detail::Decision> without_batch(detail::Terminate& t);
  std::vector<std::size_t> write_ahead(detail::Terminate& t);
  Outcome run_batch(detail::Terminate t, const std::vector<std::size_t>& audit_of,
                    const detail::Committed& done);
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
  detail::Decision finished(Batch b, std::vector<vmctl::TerminationOutcome> outcomes,
                            const std::expected<std::vector<vmctl::Domain>, vmctl::VmError>& after);
  std::optional<Work> observe(const std::vector<vmctl::Domain>& domains);

  // ---- health_routes.cpp: unit health (CONTRACT §13) -----------------------------------------------
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
