// gpunode-agent: the node agent's command line (CONTRACT §1). A thin main over the libraries.
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <boost/json/serialize.hpp>
#include <fmt/format.h>

#include "gpunode/config/config.hpp"
#include "gpunode/discovery/host_root.hpp"
#include "gpunode/discovery/json.hpp"
#include "gpunode/discovery/pci_ids.hpp"
#include "gpunode/discovery/rules.hpp"
#include "gpunode/discovery/sysfs_reader.hpp"
#include "daemon.hpp"
#include "discover_table.hpp"
#include "libvirt_hook.hpp"
#include "gpunode/daemon/policy.hpp"

namespace {

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
    fmt::print("{}", gpunode::agent::discover_table(node_id, host_root, snapshot, units));
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpunode-agent: the GPU node agent (discovery, reservations, spot control)", "gpunode-agent"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every command");

  std::string config_file, host_root;
  bool json = false;
  auto* discover = app.add_subcommand("discover", "Scan this host once and print its GPU units");
  discover->add_option("--config", config_file, "agent.yaml to take discovery and node settings from");
  discover->add_option("--host-root", host_root, "Read <DIR>/sys and <DIR>/proc instead of the host's");
  discover->add_flag("--json", json, "Print exactly the body of GET /v1/nodes/{nodeId}/units");

  std::string check_file;
  auto* check = app.add_subcommand("check-config", "Validate an agent.yaml for `run`; print every problem");
  check->add_option("--config", check_file, "The file to check")->required();

  std::string run_file = "/etc/gpunode/agent.yaml";
  auto* run = app.add_subcommand("run", "Run the agent daemon (HTTPS API, admin socket, discovery, terms)");
  run->add_option("--config", run_file, "agent.yaml (default /etc/gpunode/agent.yaml)");

  auto* version = app.add_subcommand("version", "Print the agent's version");

  // libvirt runs hooks as HOOK NAME OPERATION SUB-OPERATION EXTRA, the domain XML on stdin (§9).
  std::vector<std::string> hook_args;
  std::optional<std::string> hook_socket;
  std::string hook_config = "/etc/gpunode/agent.yaml";
  auto* hook = app.add_subcommand("libvirt-hook", "libvirt's qemu hook: ask the agent whether a domain may start on its GPU units");
  hook->add_option("args", hook_args, "NAME OPERATION SUB-OPERATION [EXTRA], as libvirt passes them")->expected(3, 4);
  hook->add_option("--socket", hook_socket, "The agent's admin socket (default: admin.socket of --config)");
  hook->add_option("--config", hook_config, "agent.yaml for admin.socket and enforcement.when_agent_down");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }

  try {
    if (discover->parsed()) return cmd_discover(config_file, host_root, json);
    if (check->parsed()) return cmd_check_config(check_file);
    if (run->parsed()) return gpunode::agent::run_daemon(run_file, GPUNODE_PCI_IDS, GPUNODE_VERSION);
    if (hook->parsed()) {
      std::string xml;
      char buf[65536];
      for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, stdin)) > 0;) xml.append(buf, n);
      const auto verdict = gpunode::agent::run_libvirt_hook(hook_args, hook_socket, hook_config, xml);
      for (const auto& line : verdict.stderr_lines) fmt::print(stderr, "{}\n", line);
      return verdict.exit_code;
    }
    if (version->parsed()) {
      fmt::print("gpunode-agent {}\n", GPUNODE_VERSION);
      return kExitOk;
    }
  } catch (const std::exception& e) {
    // A bug, never bad input: say so instead of dying silently.
    fmt::print(stderr, "gpunode-agent: internal error: {}\n", e.what());
    return 70;
  }
  return kExitUsage;
}
