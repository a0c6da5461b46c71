// `gpunode-agent run`: the daemon (CONTRACT §1, §2, §4).
#pragma once

#include <string>

namespace gpunode::agent {

// Runs until SIGTERM/SIGINT; returns the process exit code (0 after a clean shutdown, 1 when it
// cannot start: invalid config, unreadable key or certificate, a port or socket it cannot bind).
int run_daemon(const std::string& config_file, const std::string& pci_ids_file, const std::string& version);

}  // namespace gpunode::agent
