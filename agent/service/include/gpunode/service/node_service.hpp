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

  ApiResponse handle(const ApiRequest& request);

  // Applies the term transitions that are due. Returns the next instant one is due, if any.
  std::optional<reservations::Time> tick();
  // Scans the host again; a changed answer is stored and becomes an inventory.changed event.
  void rescan();

  // Where the workloads are (libvirt in the daemon, a fake in tests). Without one, routes that
  // need workloads answer 503 hypervisor-unavailable.
  void set_hypervisor(std::shared_ptr<vmctl::Hypervisor> hypervisor);

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
