// gpunode-agent: the node agent's command line (CONTRACT §1). A thin main: it parses the command
// line, answers `version`, and runs every other command in the module that holds it, so that each
// command maps only the libraries it uses (command_line.hpp says why and which).
#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "command_line.hpp"
#include "hook_args.hpp"

namespace {

namespace agent = gpunode::agent;

constexpr int kExitOk = 0;
constexpr int kExitUsage = 2;
constexpr int kExitBroken = 70;  // an installation without its modules: not the caller's fault

agent::CommandLine line_of(agent::CommandLine::Command command, std::string config_file = {}) {
  agent::CommandLine line;
  line.command = command;
  line.config_file = std::move(config_file);
  return line;
}

// Where `module` is: beside the executable (the build tree), else in the package's private
// directory beside the executable's lib (/usr/bin/../lib/gpunode-agent). Always a full path, never
// a bare name left to dlopen's search: that search reads the RUNPATH of dlopen's caller, which
// under the sanitizers is their interceptor, not this executable.
std::string module_path(const char* module) {
  std::array<char, 4096> buf{};
  const auto n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  std::string dir = n > 0 ? std::string(buf.data(), static_cast<std::size_t>(n)) : std::string("/usr/bin/gpunode-agent");
  dir.erase(dir.rfind('/') + 1);  // keeps the slash
  std::string beside = dir + module;
  if (::access(beside.c_str(), R_OK) == 0) return beside;
  return dir + "../lib/gpunode-agent/" + module;
}

// Loads `module` (module_path) and runs the command in it.
int run_in(const char* module, const agent::CommandLine& line) {
  const std::string path = module_path(module);
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed: the process ends with the command
  if (handle == nullptr) {
    std::fprintf(stderr, "gpunode-agent: cannot load %s: %s\n", path.c_str(), ::dlerror());
    return kExitBroken;
  }
  auto* entry = reinterpret_cast<agent::CommandEntry*>(::dlsym(handle, agent::kCommandEntry));
  if (entry == nullptr) {
    std::fprintf(stderr, "gpunode-agent: %s has no %s: %s\n", path.c_str(), agent::kCommandEntry, ::dlerror());
    return kExitBroken;
  }
  return entry(line);
}

// `libvirt-hook`: its arguments by position, never through the option parser (hook_args.hpp). An
// argument list it cannot read refuses (exit 1), as every failure of the hook before an answer does.
int libvirt_hook(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 2, argv + argc);
  auto parsed = agent::parse_hook_command(args);
  if (!parsed) {
    std::fprintf(stderr, "gpunode: libvirt-hook refuses: %s\n", parsed.error().c_str());
    return 1;
  }
  agent::CommandLine line = line_of(agent::CommandLine::Command::libvirt_hook, parsed->config_file);
  line.hook_args = std::move(parsed->args);
  line.hook_socket = std::move(parsed->socket);
  return run_in("gpunode-agent-hook.so", line);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string_view(argv[1]) == "libvirt-hook") return libvirt_hook(argc, argv);
  using Command = agent::CommandLine::Command;
  CLI::App app{"gpunode-agent: the GPU node agent (discovery, reservations, spot control)", "gpunode-agent"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every command");

  agent::CommandLine discover_line = line_of(Command::discover);
  auto* discover = app.add_subcommand("discover", "Scan this host once and print its GPU units");
  discover->add_option("--config", discover_line.config_file, "agent.yaml to take discovery and node settings from");
  discover->add_option("--host-root", discover_line.host_root, "Read <DIR>/sys and <DIR>/proc instead of the host's");
  discover->add_flag("--json", discover_line.json, "Print exactly the body of GET /v1/nodes/{nodeId}/units");

  agent::CommandLine check_line = line_of(Command::check_config);
  auto* check = app.add_subcommand("check-config", "Validate an agent.yaml for `run`; print every problem");
  check->add_option("--config", check_line.config_file, "The file to check")->required();
  check->add_flag("--files", check_line.files, "Also open every file it names as this user would (run it as the service's user)");

  agent::CommandLine reload_line = line_of(Command::reload, "/etc/gpunode/agent.yaml");
  auto* reload = app.add_subcommand("reload", "Ask the running agent to reload its configuration; exit 1 if it refused, 3 if unreachable");
  reload->add_option("--config", reload_line.config_file, "agent.yaml whose admin.socket the agent listens on (default /etc/gpunode/agent.yaml)");

  agent::CommandLine run_line = line_of(Command::run, "/etc/gpunode/agent.yaml");
  auto* run = app.add_subcommand("run", "Run the agent daemon (HTTPS API, admin socket, discovery, terms)");
  run->add_option("--config", run_line.config_file, "agent.yaml (default /etc/gpunode/agent.yaml)");

  auto* version = app.add_subcommand("version", "Print the agent's version");

  // Listed for --help only: main() reads `libvirt-hook` by position before this parser runs.
  app.add_subcommand("libvirt-hook", "libvirt's qemu hook: [--socket S] [--config F] -- NAME OPERATION SUB-OPERATION [EXTRA]");

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

  if (discover->parsed()) return run_in("gpunode-agent-tools.so", discover_line);
  if (check->parsed()) return run_in(check_line.files ? "gpunode-agent-daemon.so" : "gpunode-agent-tools.so", check_line);
  if (reload->parsed()) return run_in("gpunode-agent-tools.so", reload_line);
  if (run->parsed()) return run_in("gpunode-agent-daemon.so", run_line);
  if (version->parsed()) {
    std::printf("gpunode-agent %s\n", GPUNODE_VERSION);
    return kExitOk;
  }
  return kExitUsage;
}
