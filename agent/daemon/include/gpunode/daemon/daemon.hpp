// gpunode/daemon/daemon.hpp: `gpunode-agent run` as an object (CONTRACT §1, §2, §4, §7).
//
// Threads, and what each owns:
// - net (the thread that calls run()): the HTTPS listener and metrics.listen (Beast), the signals,
//   the watchdog. It never blocks: no fsync, no libvirt, no NSS, no file reads. It records each
//   answer in the HTTP metrics (metrics::HttpMetrics, its own mutex).
// - admin (one thread of its own): the admin socket, with its own io_context and connection budget
//   (CONTRACT §10: no HTTPS load delays the hook or an operator). Never blocks either; what it
//   shares with net is only what both hand to core, the HTTP metrics, the shared reads (their own
//   mutex) and the admin peers (AdminPeers, its mutex). POST /v1/admin/reload goes to slow.
// - core (one thread of its own): the NodeService (SQLite, discovery, the clock's terms), the
//   Driver (requests, parked long polls) and GET /metrics (the service's numbers, the outbox table
//   on a connection of its own). A request is parsed on net (or admin), handled on core, answered
//   back on the thread of its connection.
// - lists (one thread): Hypervisor::list(), for requests and refreshes.
// - terminations (four threads): batches of spot terminations, which wait out grace periods.
// - slow (one thread): reloads (SIGHUP's and POST /v1/admin/reload's: file reads) and the admin
//   group's NSS lookups.
// - reporter (one thread, when central.url is set): report::Reporter, with its own io_context and
//   its own SQLite connection; the core thread only publishes the revision (an atomic) and wakes
//   it (notify) after each change.
// Each thread's handlers run inside an exception boundary: a throw is logged, and for a request
// it is that request's 500, never the end of the process.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpunode/config/config.hpp"
#include "gpunode/daemon/audit_checkpoints.hpp"
#include "gpunode/daemon/driver.hpp"
#include "gpunode/error/error.hpp"
#include "gpunode/report/reporter.hpp"
#include "gpunode/service/node_service.hpp"
#include "gpunode/vmctl/vmctl.hpp"

namespace gpunode::daemon {

struct DaemonOptions {
  std::string config_file;
  std::string pci_ids_file;
  std::string version;
  // Tests: a hypervisor instead of libvirt at libvirt.uri, and a clock instead of the system's
  // (called from the core and the network threads).
  std::shared_ptr<vmctl::Hypervisor> hypervisor;
  service::Clock clock;
  // How soon after start the first record written since is signed (AuditCheckpoints; CONTRACT §12
  // "within a minute"). Tests shorten it.
  std::chrono::milliseconds first_checkpoint_within = AuditCheckpoints::kFirstWithin;
};

// What a reload did (CONTRACT §11 "Reload says whether it took": POST /v1/admin/reload, SIGHUP).
struct ReloadOutcome {
  bool reloaded = false;
  std::vector<std::string> restart_needed;  // changed keys that take effect only after a restart
  std::vector<config::Problem> errors;      // why it was refused (the config's own problems, then its files')
  explicit operator bool() const { return reloaded; }
};

class Daemon {
 public:
  // Loads and checks the config, locks the state directory, checks the host root, opens the state
  // (applying the terms that passed while the agent was down), binds the HTTPS port and the admin
  // socket and starts the core thread. An error says what and where (its detail) and what kind
  // (its code: an invalid config, the state directory busy with another agent, a file not_found,
  // ...); nothing is served then.
  static error::Result<std::unique_ptr<Daemon>> start(DaemonOptions options);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Serves on the calling thread until stop() has drained the connections; SIGTERM and SIGINT
  // call stop(), SIGHUP reload() when `signals` is set. Tells systemd READY=1, pets its watchdog
  // while both the network and the core loops turn, and says STOPPING=1. Returns the exit code.
  int run(bool signals = true);
  // Any thread. Long polls are answered (304), running terminations stop waiting (the agent
  // finishes them at its next start), connections drain for up to 10 s.
  void stop();
  // Any thread: re-reads the config on the slow thread (see reload_now).
  void reload();
  // Re-reads the config on the calling thread and applies what can change while running: TLS
  // files, token keys, log level and format, unsellable units, the admin socket's uids and group,
  // the enforcement mode, the central API's CA and client certificate (new connections use them).
  // A key that needs a restart is a warning naming it; an invalid file, or one naming a file the
  // agent cannot use (check_named_files), keeps the running config. Logged either way.
  ReloadOutcome reload_now();

  // Any thread: one request as if it came from the network (tests).
  void submit(service::ApiRequest request, Respond respond);
  [[nodiscard]] std::uint16_t tls_port() const;

  struct Parts;

 private:
  explicit Daemon(std::unique_ptr<Parts> parts);
  std::unique_ptr<Parts> p_;
};

}  // namespace gpunode::daemon
