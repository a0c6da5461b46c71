// gpunode-agent-daemon.so: `run`, and `check-config --files`, which opens every file the config
// names with the loaders `run` uses (see module_abi.hpp for why the daemon is a module). The tools
// module, which parsed the command line, hands it an argv of its own making, read by position.
#include <fmt/format.h>

#include <string_view>
#include <type_traits>

#include "daemon.hpp"
#include "gpunode/config/config.hpp"
#include "gpunode/daemon/config_files.hpp"
#include "module_abi.hpp"

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

extern "C" GPUNODE_EXPORT int gpunode_agent_daemon_main(int argc, char** argv) {
  static_assert(std::is_same_v<decltype(gpunode_agent_daemon_main), gpunode_agent_main_fn>);
  return agent::report_internal_errors([&] {
    const auto arg = [&](int i) { return i < argc ? std::string_view(argv[i]) : std::string_view(); };
    // `gpunode-agent run --config FILE` or `gpunode-agent check-config --files --config FILE`.
    if (argc == 4 && arg(1) == "run" && arg(2) == "--config")
      return agent::run_daemon(argv[3], GPUNODE_PCI_IDS, GPUNODE_VERSION);
    if (argc == 5 && arg(1) == "check-config" && arg(2) == "--files" && arg(3) == "--config")
      return check_config_files(argv[4]);
    fmt::print(stderr, "gpunode-agent: {}: not a command line of gpunode-agent-tools.so's making\n",
               agent::kDaemonModule);
    return agent::kExitInternal;
  });
}
