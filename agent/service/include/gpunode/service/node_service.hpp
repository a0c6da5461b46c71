// gpunode/service/node_service.hpp: the node's state and API (CONTRACT §3, §4, §6 storage).
//
// One NodeService owns the SQLite state file and the in-memory view of units and reservations.
// It is not thread-safe: the daemon calls it from one worker thread only, never from the I/O
// threads (SQLite commits wait for fsync). Every mutation is one transaction holding the change,
// its audit record and its outbox event; memory is updated only after the commit.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpunode/auth/token_verifier.hpp"
#include "gpunode/discovery/model.hpp"
#include "gpunode/discovery/pci_ids.hpp"
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
};

// The domains as the hypervisor listed them for one request (or why it could not).
struct WorkloadListing {
  std::expected<std::vector<vmctl::Domain>, vmctl::VmError> domains;
};

// Terminations to run with the hypervisor, off the state thread (they wait for domains to stop).
struct Work {
  std::uint64_t batch = 0;
  std::vector<vmctl::TerminationJob> jobs;
};

enum class LogLevel { debug, info, warning, error };
using LogSink = std::function<void(LogLevel, const std::string&)>;
using Clock = std::function<std::chrono::system_clock::time_point()>;

class NodeService {
 public:
  // Opens (creating) <state_dir>/state.db, migrates it, loads the state, applies the terms that
  // came while the agent was down (in time order) and scans the host once. An error names the
  // file and says why.
  static std::expected<std::unique_ptr<NodeService>, std::string> open(ServiceOptions options,
                                                                       std::shared_ptr<const auth::TokenVerifier> verifier,
                                                                       const discovery::PciIds* names, Clock clock,
                                                                       LogSink log);
  ~NodeService();
  NodeService(const NodeService&) = delete;
  NodeService& operator=(const NodeService&) = delete;

  // The answer to one request. Status 0 means it is not answered yet: either a long poll to park
  // (X-Gpunode-Wait-Ms), or, with `work` set, terminations to run first: take them with work(),
  // run them (vmctl::terminate_spot_all), then finish() gives the answer.
  ApiResponse handle(const ApiRequest& request);

  // The jobs of a batch handle() or observe_workloads() started; nullopt for an unknown batch.
  std::optional<Work> work(std::uint64_t batch) const;
  // Records what happened to a batch's domains (`after`: the domains listed once they ran, used to
  // see which reclaiming units are vacated) in one transaction, and answers the request that
  // started it (for a batch of the agent's own, the answer goes nowhere). Domains whose outcome
  // is `unavailable` stay pending and are finished by a later observe_workloads().
  ApiResponse finish(std::uint64_t batch, std::vector<vmctl::TerminationOutcome> outcomes,
                     const std::expected<std::vector<vmctl::Domain>, vmctl::VmError>& after);
  // A fresh list of the domains (the daemon lists them off this thread every rescan interval):
  // reclaiming units without spot workloads leave reclaimingUnitIds, and terminations cut short
  // (by a crash, a stop, or libvirt going away) are finished: the agent's own batch to run, if any.
  std::optional<Work> observe_workloads(const std::vector<vmctl::Domain>& domains);
  // handle(), running any terminations at once on this thread with the hypervisor given to
  // set_hypervisor(). For tests and tools; the daemon does not block its state thread like this.
  ApiResponse handle_now(const ApiRequest& request, const vmctl::Sleeper& sleep);
  // observe_workloads() with a list taken now, running its batch at once. For tests and tools.
  void refresh_now(const vmctl::Sleeper& sleep);

  // Applies the term transitions that are due. Returns the next instant one is due, if any.
  std::optional<reservations::Time> tick();
  // Scans the host again; a changed answer is stored and becomes an inventory.changed event.
  void rescan();

  // Where the workloads are (libvirt in the daemon, a fake in tests). Without one, routes that
  // need workloads answer 503 hypervisor-unavailable.
  void set_hypervisor(std::shared_ptr<vmctl::Hypervisor> hypervisor);
  // With true, handle() never calls the hypervisor itself: a request that needs the workloads is
  // answered with status 0 and needs_workloads, and the caller lists them off this thread and
  // handles the request again with ApiRequest::workloads set (nothing was changed the first
  // time). The daemon does this so that its state thread never waits for libvirt.
  void set_list_off_thread(bool off);

  // SIGHUP: what can be reloaded.
  void set_verifier(std::shared_ptr<const auth::TokenVerifier> verifier);
  void set_unsellable(std::vector<std::string> unsellable);

  [[nodiscard]] std::int64_t revision() const;

  struct Impl;

 private:
  explicit NodeService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpunode::service
