// gpunode-agent-tools.so: `discover`, `check-config` and `reload` (see
// command_line.hpp for why they live in a module of their own: none of them maps OpenSSL, SQLite or
// libxml2). `check-config --files` is the daemon module's: it opens the files with the agent's loaders.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include <boost/json/serialize.hpp>
#include <fmt/format.h>

#include "command_line.hpp"
#include "discover_table.hpp"
#include "gpunode/config/config.hpp"
#include "gpunode/daemon/policy.hpp"
#include "gpunode/discovery/host_root.hpp"
#include "gpunode/discovery/json.hpp"
#include "gpunode/discovery/pci_ids.hpp"
#include "gpunode/discovery/rules.hpp"
#include "gpunode/discovery/sysfs_reader.hpp"
#include "reload_client.hpp"

namespace {

namespace agent = gpunode::agent;
namespace cfg = gpunode::config;
namespace disc = gpunode::discovery;

constexpr int kExitOk = 0;
constexpr int kExitInvalid = 1;  // invalid config or input
constexpr int kExitUsage = 2;

void print_problems(const std::vector<cfg::Problem>& problems) {
  for (const auto& p : problems) fmt::print(stderr, "{}\n", p.to_string());
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

int cmd_discover(const std::string& config_file, const std::string& host_root_flag, bool json) {
  cfg::Config config;
  if (!config_file.empty()) {
    auto loaded = cfg::load_file(config_file, cfg::Purpose::discover);
    if (!loaded.ok()) {
      print_problems(loaded.problems);
      return kExitInvalid;
    }
    config = std::move(loaded.config);
  }
  const std::string host_root = host_root_flag.empty() ? config.discovery.host_root : host_root_flag;
  // A mistyped root must never read as a host whose GPUs all went away (CONTRACT §7).
  if (auto root_ok = disc::check_host_root(host_root); !root_ok) {
    fmt::print(stderr, "error: {}\n", root_ok.error());
    return kExitInvalid;
  }
  const disc::Policy policy = gpunode::daemon::policy_from(config);

  auto names = disc::PciIds::load(GPUNODE_PCI_IDS, policy.gpu_vendors);
  if (!names) fmt::print(stderr, "warning: no GPU names: {}\n", names.error());
  disc::SysfsReader reader(host_root, policy, names ? &*names : nullptr);
  disc::HostSnapshot snapshot = reader.read();
  for (const auto& w : snapshot.warnings) fmt::print(stderr, "warning: {}\n", w);
  std::vector<disc::Unit> units = disc::build_units(snapshot, policy);

  const std::string node_id = config.node.id.empty() ? host_name() : config.node.id;
  if (json) {
    fmt::print("{}\n", boost::json::serialize(disc::units_body(node_id, units)));
  } else {
    fmt::print("{}", agent::discover_table(node_id, host_root, snapshot, units));
  }
  return kExitOk;
}

int cmd_check_config(const std::string& config_file) {
  auto loaded = cfg::load_file(config_file, cfg::Purpose::run);
  if (!loaded.ok()) {
    print_problems(loaded.problems);
    return kExitInvalid;
  }
  fmt::print("{}: ok\n", config_file);
  return kExitOk;
}

int cmd_reload(const std::string& config_file) {
  const auto verdict = agent::run_reload(config_file);
  for (const auto& text : verdict.out) fmt::print("{}\n", text);
  for (const auto& text : verdict.err) fmt::print(stderr, "{}\n", text);
  return verdict.exit_code;
}

}  // namespace

extern "C" GPUNODE_EXPORT int gpunode_agent_command(const agent::CommandLine& line) {
  static_assert(std::is_same_v<decltype(gpunode_agent_command), agent::CommandEntry>);
  return agent::report_internal_errors([&] {
    switch (line.command) {
      case agent::CommandLine::Command::discover: return cmd_discover(line.config_file, line.host_root, line.json);
      case agent::CommandLine::Command::check_config: return cmd_check_config(line.config_file);
      case agent::CommandLine::Command::libvirt_hook: break;  // gpunode-agent-hook.so's
      case agent::CommandLine::Command::reload: return cmd_reload(line.config_file);
      case agent::CommandLine::Command::run: break;  // gpunode-agent-daemon.so's (and check-config --files)
    }
    return kExitUsage;
  });
}
