// gpunode/service/node_service.hpp: the node's state and API (CONTRACT §3, §4, §6 storage).
//
// One NodeService owns the SQLite state file and the in-memory view of units and reservations.
// It is not thread-safe: the daemon calls it from one worker thread only, never from the I/O
// threads (SQLite commits wait for fsync); read() alone may be used from any thread. Every mutation
// is one transaction holding the change, its audit record and its outbox event; memory is updated only after
// the commit.
#pragma once

#include <boost/json/object.hpp>
#include <chrono>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpunode/auth/token_verifier.hpp"
#include "gpunode/config/config.hpp"
#include "gpunode/discovery/model.hpp"
#include "gpunode/discovery/pci_ids.hpp"
#include "gpunode/error/error.hpp"
#include "gpunode/health/judge.hpp"
#include "gpunode/metrics/node_metrics.hpp"
#include "gpunode/proof/node_key.hpp"
#include "gpunode/reservations/rules.hpp"
#include "gpunode/service/api.hpp"
#include "gpunode/vmctl/vmctl.hpp"

namespace gpunode::service {

struct ServiceOptions {
  std::string node_id;
  std::string owner_org;
  discovery::Policy policy;
  std::filesystem::path host_root = "/";
  std::filesystem::path state_dir;
  std::string version;
  std::chrono::seconds shutdown_grace{0};  // libvirt.shutdown_grace: terminate-spot's default grace
  config::EnforcementMode enforcement = config::EnforcementMode::enforce;  // enforcement.mode (§9)
  // health.* (CONTRACT §13). Off unless asked: the daemon sets it from agent.yaml, where it is on.
  struct Health {
    bool enabled = false;
    std::chrono::milliseconds interval{30000};  // the driver polls this often (Driver, poll_health)
    gpunode::health::Settings settings;
  } health{};
};

// The domains as the hypervisor listed them (or why it could not). `at`: when the listing began;
// `current`: the hypervisor's events are watched and none came since `at`, so the list holds until
// the next one comes (NodeService::workloads_changed).
struct WorkloadListing {
  std::expected<std::vector<vmctl::Domain>, vmctl::VmError> domains;
  std::chrono::steady_clock::time_point at{};
  bool current = false;
};

// Terminations to run with the hypervisor, off the state thread (they wait for domains to stop).
struct Work {
  std::uint64_t batch = 0;
  std::vector<vmctl::TerminationJob> jobs;
};

// What handle() decided for one request (CONTRACT §7 Deadlines: each is answered exactly once,
// within its own deadline):
// - ApiResponse: the answer.
// - NeedsWorkloads: the request needs the domains as libvirt lists them, and nothing was changed;
//   list them off the state thread and handle it again with ApiRequest::workloads set.
// - RunBatch: terminations were written ahead; run `work` off the state thread
//   (vmctl::terminate_spot_all), then finish() gives the answer.
// - Park: a long poll whose revision has not passed `after`: handle it again when the revision
//   moves, or with ApiRequest::wait_over at `deadline` (then it is a 304).
// The service keeps the last list and decides itself whether it will do (a list the hypervisor's
// events keep current serves GET workloads and, for a few seconds, a create's occupancy check; a
// termination always asks for a new one): NeedsWorkloads means "list them now".
struct NeedsWorkloads {};
struct RunBatch {
  Work work;
};
struct Park {
  std::int64_t after = 0;
  std::chrono::steady_clock::time_point deadline;
};
using Outcome = std::variant<ApiResponse, NeedsWorkloads, RunBatch, Park>;

using LogLevel = config::LogLevel;  // one log level enum for the whole agent
using LogSink = std::function<void(LogLevel, const std::string&)>;
using Clock = std::function<std::chrono::system_clock::time_point()>;

// Log lines a request wrote, held until its answer is on its way (see NodeService::handle).
struct HeldLog {
  std::vector<std::pair<LogLevel, std::string>> lines;
};

class NodeService {
 public:
  // Opens (creating) <state_dir>/state.db, migrates it, loads the state, applies the terms that
  // came while the agent was down (in time order) and scans the host once. An error is the store's:
  // its code, and a detail that names the file and says why (to_string(): the kind in front).
  static error::Result<std::unique_ptr<NodeService>> open(ServiceOptions options,
                                                          std::shared_ptr<const auth::TokenVerifier> verifier,
                                                          const discovery::PciIds* names, Clock clock,
                                                          LogSink log);
  ~NodeService();
  NodeService(const NodeService&) = delete;
  NodeService& operator=(const NodeService&) = delete;

  // What to do with one request (see Outcome). Never throws for bad input; a request it cannot
  // answer for a reason of its own (a damaged state file) is a problem response.
  Outcome handle(const ApiRequest& request);
  // The same, with what can wait until the answer is on its way held back: the request's log
  // lines (a write(2) to journald's stream blocks while journald is behind) and the snapshot's
  // publish (a copy of what the node shows). The driver answers first and calls after_answer(),
  // so neither stands between a commit and its acknowledgement. Until then a read finds the
  // published snapshot behind and goes to handle(). Lines are formatted when said, stamped when
  // written.
  Outcome handle(const ApiRequest& request, HeldLog& held);
  // Publishes the snapshot, then writes the held lines to the service's log sink, in order, and
  // empties `held`. Called once after each handle(request, held), whatever its outcome.
  void after_answer(HeldLog& held);

  // Records what happened to a batch's domains (`after`: the domains listed once they ran, used to
  // see which reclaiming units are vacated) in one transaction, and answers the request that
  // started it (for a batch of the agent's own, the answer goes nowhere). Domains whose outcome
  // is `unavailable` stay pending and are finished by a later observe_workloads().
  ApiResponse finish(std::uint64_t batch, std::vector<vmctl::TerminationOutcome> outcomes,
                     const std::expected<std::vector<vmctl::Domain>, vmctl::VmError>& after);
  // A fresh list of the domains (the daemon lists them off this thread every rescan interval):
  // reclaiming units without spot workloads leave reclaimingUnitIds, and terminations cut short
  // (by a crash, a stop, or libvirt going away) are finished: the agent's own batch to run, if any.
  // The list is kept (GET workloads and a create's occupancy check use it while it is current);
  // a failed one is kept as failed, and nothing else is done.
  std::optional<Work> observe_workloads(std::shared_ptr<const WorkloadListing> listing);
  // The hypervisor's event (or a batch of terminations): the kept list no longer holds.
  void workloads_changed();
  // Applies the term transitions that are due (and purges expired idempotency keys). Returns the
  // next instant one is due, if any.
  std::optional<reservations::Time> tick();
  // The next instant a term is due (a second from now when one is due but could not be stored).
  // O(1): the daemon re-arms its timer with it after every change.
  [[nodiscard]] std::optional<reservations::Time> next_term() const;
  // Scans the host again; a changed answer is stored and becomes an inventory.changed event.
  void rescan();
  // Unit health (CONTRACT §13), every health.interval: reads what the kernel shows of each unit's
  // functions, judges it, and stores what changed with its unit.health events in one transaction.
  // A poll that finds nothing new commits nothing (no revision, no event). Nothing when health is off.
  void poll_health();
  // How often to call poll_health(): health.interval, or nothing when health is off.
  [[nodiscard]] std::optional<std::chrono::milliseconds> health_interval() const;

  // The periodic backstop to the kernel's uevents: scans again only when a PCI function came,
  // went, changed driver or IOMMU group since the last scan (SysfsReader::fingerprint), or when the
  // last scan's change could not be stored. An idle host costs two readlink calls a function.
  void rescan_if_changed();

  // Whether there is a hypervisor at all (libvirt in the daemon, a fake in tests). Without one,
  // routes that need workloads answer 503 hypervisor-unavailable. The service never calls it:
  // it asks for lists with NeedsWorkloads, and the driver runs terminations.
  void set_has_hypervisor(bool has);

  // SIGHUP: what can be reloaded.
  void set_verifier(std::shared_ptr<const auth::TokenVerifier> verifier);
  void set_unsellable(std::vector<std::string> unsellable);
  void set_enforcement(config::EnforcementMode mode);

  // Signed audit checkpoints (CONTRACT §12, checkpoints.cpp). The node key they are signed with
  // (GET .../audit/checkpoints shows its public half); without one, no checkpoint is made.
  void set_audit_key(std::shared_ptr<const proof::NodeKey> key);
  // When the audit chain has grown since the last checkpoint: signs its head and stores the
  // checkpoint with its audit.checkpoint event in one transaction, and returns it (the revision
  // does not move: the daemon wakes the reporter). Nothing when it has not grown; else the store's
  // error (its detail to_string(): the kind in front) or the signing's.
  error::Result<std::optional<boost::json::object>> checkpoint_audit();
  // The seq of the last event stored in the outbox: it moves with every stored event, a
  // checkpoint's too (which does not move the revision); the daemon wakes the reporter when it does.
  [[nodiscard]] std::int64_t event_seq() const;

  [[nodiscard]] std::int64_t revision() const;
  // Any thread (the only member another thread may use): the answer to a GET of units, state,
  // reservations, one reservation or capacity, from the last published snapshot, when it is current (no
  // commit, revision bump or reload setting since, no term due by `now`) and the answer is a 200 or
  // a 304; otherwise nothing, and the request goes to handle() on the state thread.
  [[nodiscard]] std::optional<ApiResponse> read(const ApiRequest& request,
                                                std::chrono::system_clock::time_point now) const;

  // The node's numbers for /metrics (CONTRACT §6), as of the last change or tick: units by class
  // and reservable as GET units lists them (absent ones included), reservations by state, the
  // revision, the last scan's duration, and the counters since start. O(units + reservations).
  [[nodiscard]] metrics::NodeGauges gauges() const;

  struct Impl;

 private:
  explicit NodeService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpunode::service
