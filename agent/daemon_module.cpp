// gpunode-agent-daemon.so: `run`, and `check-config --files`, which opens every file the config
// names with the loaders `run` uses (see command_line.hpp for why the daemon is a module).
#include <fmt/format.h>

#include <type_traits>

#include "command_line.hpp"
#include "daemon.hpp"
#include "gpunode/config/config.hpp"
#include "gpunode/daemon/config_files.hpp"

namespace {

namespace agent = gpunode::agent;
namespace cfg = gpunode::config;

// check-config --files (CONTRACT §1, §11): the config's problems, then each file it names that this
// process cannot use, every one as FILE:LINE:COLUMN: ... on stderr; exit 0 and "FILE: ok" when none.
int check_config_files(const std::string& config_file) {
  const auto loaded = cfg::load_file(config_file, cfg::Purpose::run);
  auto problems = loaded.problems;
  for (auto& p : gpunode::daemon::check_named_files(loaded, config_file)) problems.push_back(std::move(p));
  for (const auto& p : problems) fmt::print(stderr, "{}\n", p.to_string());
  if (!problems.empty()) return 1;
  fmt::print("{}: ok (and every file it names)\n", config_file);
  return 0;
}

}  // namespace

extern "C" GPUNODE_EXPORT int gpunode_agent_command_v2(const agent::CommandLine& line) {
  static_assert(std::is_same_v<decltype(gpunode_agent_command_v2), agent::CommandEntry>);
  return agent::report_internal_errors([&] {
    if (line.command == agent::CommandLine::Command::check_config && line.files)
      return check_config_files(line.config_file);
    if (line.command != agent::CommandLine::Command::run) return 2;  // gpunode-agent-tools.so's
    return agent::run_daemon(line.config_file, GPUNODE_PCI_IDS, GPUNODE_VERSION);
  });
}
