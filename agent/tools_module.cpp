// gpunode-agent-tools.so: gpunode-agent's command line (all of it but `libvirt-hook`, which
// main.cpp reads by position) and the commands that map neither OpenSSL, SQLite nor libxml2:
// `version`, `discover`, `check-config` and `reload` (module_abi.hpp says why commands live in
// modules). `run` and `check-config --files` are the daemon module's: their argv goes back to the
// executable, which loads that module and unloads this one (the files are opened with the agent's
// own loaders).
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <boost/json/serialize.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

#include "discover_table.hpp"
#include "gpunode/config/config.hpp"
#include "gpunode/daemon/policy.hpp"
#include "gpunode/discovery/health.hpp"
#include "gpunode/discovery/host_root.hpp"
#include "gpunode/discovery/json.hpp"
#include "gpunode/discovery/pci_ids.hpp"
#include "gpunode/discovery/rules.hpp"
#include "gpunode/discovery/sysfs_reader.hpp"
#include "hook_settings.hpp"
#include "module_abi.hpp"
#include "reload_client.hpp"

namespace {

namespace agent = gpunode::agent;
namespace cfg = gpunode::config;
namespace error = gpunode::error;
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
    fmt::print(stderr, "error: {}\n", root_ok.error().detail);
    return kExitInvalid;
  }
  const disc::Policy policy = gpunode::daemon::policy_from(config);

  auto names = disc::PciIds::load(GPUNODE_PCI_IDS, policy.gpu_vendors);
  if (!names) fmt::print(stderr, "warning: no GPU names: {}\n", names.error().detail);
  disc::SysfsReader reader(host_root, policy, names ? &*names : nullptr);
  disc::HostSnapshot snapshot = reader.read();
  for (const auto& w : snapshot.warnings) fmt::print(stderr, "warning: {}\n", w);
  std::vector<disc::Unit> units = disc::build_units(snapshot, policy);
  if (config.health.enabled) {  // CONTRACT §13: what a first look says (the AER files only: nothing kept)
    disc::health::Reader health(host_root);
    const auto now = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
    for (auto& u : units) {
      health.watch(
          disc::health::targets_of(u, [&](const disc::PciAddress& a) { return health.parent_of(a); }));
      disc::apply_health(u, gpunode::health::at_first_sight(health.targets(), health.read_counts(), now,
                                                            gpunode::daemon::health_settings_from(config)));
    }
  }

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

// The daemon module's command, handed back to the executable (module_abi.hpp) as the argv it reads
// by position: `run --config FILE`, or `check-config --files --config FILE` (`files`).
int hand_to_daemon(const std::string& config_file, bool files, char*** daemon_argv) {
  std::vector<std::string> args = {"gpunode-agent", files ? "check-config" : "run"};
  if (files) args.emplace_back("--files");
  args.emplace_back("--config");
  args.push_back(config_file);
  const std::size_t pointers = (args.size() + 1) * sizeof(char*);
  std::size_t size = pointers;
  for (const auto& a : args) size += a.size() + 1;
  auto* block = static_cast<char*>(std::malloc(size));
  if (block == nullptr) {
    fmt::print(stderr, "gpunode-agent: out of memory\n");
    return agent::kExitInternal;
  }
  auto** argv = reinterpret_cast<char**>(block);
  char* text = block + pointers;
  for (std::size_t i = 0; i < args.size(); ++i) {
    argv[i] = text;
    std::memcpy(text, args[i].c_str(), args[i].size() + 1);
    text += args[i].size() + 1;
  }
  argv[args.size()] = nullptr;
  *daemon_argv = argv;
  return kExitOk;
}

int run_command_line(int argc, char** argv, char*** daemon_argv) {
  CLI::App app{"gpunode-agent: the GPU node agent (discovery, reservations, spot control)", "gpunode-agent"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every command");

  std::string discover_config, host_root;
  bool json = false;
  auto* discover = app.add_subcommand("discover", "Scan this host once and print its GPU units");
  discover->add_option("--config", discover_config, "agent.yaml to take discovery and node settings from");
  discover->add_option("--host-root", host_root, "Read <DIR>/sys and <DIR>/proc instead of the host's");
  discover->add_flag("--json", json, "Print exactly the body of GET /v1/nodes/{nodeId}/units");

  std::string check_config;
  bool files = false;
  auto* check = app.add_subcommand("check-config", "Validate an agent.yaml for `run`; print every problem");
  check->add_option("--config", check_config, "The file to check")->required();
  check->add_flag("--files", files,
                  "Also open every file it names as this user would (run it as the service's user)");

  std::string reload_config = "/etc/gpunode/agent.yaml";
  auto* reload = app.add_subcommand(
      "reload", "Ask the running agent to reload its configuration; exit 1 if it refused, 3 if unreachable");
  reload->add_option("--config", reload_config,
                     "agent.yaml whose admin.socket the agent listens on (default /etc/gpunode/agent.yaml)");

  std::string run_config = "/etc/gpunode/agent.yaml";
  auto* run = app.add_subcommand("run", "Run the agent daemon (HTTPS API, admin socket, discovery, terms)");
  run->add_option("--config", run_config, "agent.yaml (default /etc/gpunode/agent.yaml)");

  auto* version = app.add_subcommand("version", "Print the agent's version");

  // Listed for --help only: main.cpp reads `libvirt-hook` by position before this parser runs.
  app.add_subcommand(
      "libvirt-hook",
      "libvirt's qemu hook: [--socket S] [--config F] -- NAME OPERATION SUB-OPERATION [EXTRA]");

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

  if (discover->parsed()) return cmd_discover(discover_config, host_root, json);
  if (check->parsed())
    return files ? hand_to_daemon(check_config, true, daemon_argv) : cmd_check_config(check_config);
  if (reload->parsed()) return cmd_reload(reload_config);
  if (run->parsed()) return hand_to_daemon(run_config, false, daemon_argv);
  if (version->parsed()) {
    fmt::print("gpunode-agent {}\n", GPUNODE_VERSION);
    return kExitOk;
  }
  return kExitUsage;
}

}  // namespace

// The hook's settings read by the agent's reader, for the hook's cache misses (hook_settings.hpp,
// module_abi.hpp). Read as `discover` reads: the file's syntax and values, not its files.
extern "C" GPUNODE_EXPORT int gpunode_agent_hook_settings(const char* config_file, const char* bytes,
                                                          std::size_t size, char** socket, int* allow,
                                                          char** message) {
  static_assert(std::is_same_v<decltype(gpunode_agent_hook_settings), gpunode_agent_hook_settings_fn>);
  *socket = nullptr;
  *message = nullptr;
  *allow = 0;
  std::string why = "cannot read " + std::string(config_file) + ": an internal error";
  const int verdict = agent::report_internal_errors(
      [&] {
        auto loaded = cfg::load_string(std::string_view(bytes, size), config_file, cfg::Purpose::discover);
        if (!loaded.ok()) {
          why = fmt::format("{} is invalid: {}", config_file, loaded.problems.front().to_string());
          return 1;
        }
        const auto settings = agent::hook_settings_of(loaded.config);
        *socket = ::strdup(settings.socket.c_str());
        *allow = settings.when_agent_down == cfg::WhenAgentDown::allow ? 1 : 0;
        why = "no memory for the settings";
        return *socket != nullptr ? 0 : 1;
      },
      1);
  if (verdict != 0) *message = ::strdup(why.c_str());
  return verdict;
}

extern "C" GPUNODE_EXPORT int gpunode_agent_tools_main(int argc, char** argv, char*** daemon_argv) {
  static_assert(std::is_same_v<decltype(gpunode_agent_tools_main), gpunode_agent_tools_main_fn>);
  *daemon_argv = nullptr;
  return agent::report_internal_errors([&] { return run_command_line(argc, argv, daemon_argv); });
}
