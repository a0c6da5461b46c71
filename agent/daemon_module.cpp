// gpunode-agent-daemon.so: `run` (see command_line.hpp for why the daemon is a module).
#include <type_traits>

#include "command_line.hpp"
#include "daemon.hpp"

extern "C" GPUNODE_EXPORT int gpunode_agent_command(const gpunode::agent::CommandLine& line) {
  static_assert(std::is_same_v<decltype(gpunode_agent_command), gpunode::agent::CommandEntry>);
  if (line.command != gpunode::agent::CommandLine::Command::run) return 2;  // gpunode-agent-tools.so's
  return gpunode::agent::report_internal_errors(
      [&] { return gpunode::agent::run_daemon(line.config_file, GPUNODE_PCI_IDS, GPUNODE_VERSION); });
}
