// `gpunode-agent run`: the Daemon (agent/daemon) with the process's signals.
#include "daemon.hpp"

#include <fmt/format.h>

#include "gpunode/daemon/daemon.hpp"

namespace gpunode::agent {

int run_daemon(const std::string& config_file, const std::string& pci_ids_file, const std::string& version) {
  auto daemon = daemon::Daemon::start({config_file, pci_ids_file, version, nullptr, nullptr});
  if (!daemon) {
    fmt::print(stderr, "gpunode-agent: refusing to start: {}\n", daemon.error().detail);
    return 1;
  }
  return (*daemon)->run(true);
}

}  // namespace gpunode::agent
