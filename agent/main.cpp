// gpunode-agent: the node agent's command line (CONTRACT §1). A thin main that maps libc alone: it
// answers `libvirt-hook` itself, whole (hook_args.hpp, libvirt_hook.hpp), and a bare `version`,
// and hands every other command line, as its argv, to gpunode-agent-tools.so, which parses it
// (CLI11) and runs it, or hands back the argv of a command the daemon's module runs: this main then
// loads that module and unloads the tools module (module_abi.hpp says why and which). libvirtd
// runs the hook on every event of every domain, so its path maps only what it uses (CONTRACT §9
// "Speed"): the C++ runtime and fmt are linked into this executable (agent/CMakeLists.txt), so a
// call costs about what /bin/true does, plus asking the agent for the calls that ask. Not even
// CLI11, whose validators and iostreams are constructed at start-up in every program that
// includes it.
#include <dlfcn.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "hook_args.hpp"
#include "hook_settings.hpp"
#include "libvirt_hook.hpp"
#include "module_abi.hpp"
#include "modules.hpp"

namespace {

namespace agent = gpunode::agent;

constexpr int kExitOk = 0;
constexpr int kRefuse = 1;  // the hook's answer to any error of its own before an answer (CONTRACT §9)
constexpr int kStdinWaitMs = 5000;  // a non-blocking stdin that stays empty this long: refused

// The entry `entry` of `module`, beside the executable, with the module's handle; both null (said
// on stderr) when either is missing.
agent::LoadedEntry entry_of(const char* module, const char* entry) {
  auto found = agent::open_entry(agent::module_beside_executable(module), entry);
  if (!found) {
    std::fprintf(stderr, "gpunode-agent: %s\n", found.error().detail.c_str());
    return {};
  }
  return *found;
}

// The domain XML libvirt writes to every hook's stdin: its first `keep` bytes, the rest drained.
struct Stdin {
  std::string text;            // at most `keep` bytes
  bool cut_short = false;      // there was more than `keep`
  bool hostdev_after = false;  // "<hostdev" occurs in what was drained past `keep`
  int error = 0;               // errno of a read that failed (0: read to the end)
};

Stdin read_stdin(std::size_t keep) {
  static constexpr std::string_view kTag = "<hostdev";
  Stdin in;
  std::string carry;            // the drained text's last bytes, so that a tag split across reads is seen
  std::array<char, 65536> buf;  // not zeroed: read() fills what is used (zeroing it costs 16 page faults)
  for (;;) {
    const ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {  // a non-blocking pipe: wait for it
      pollfd p{STDIN_FILENO, POLLIN, 0};
      const int ready = ::poll(&p, 1, kStdinWaitMs);
      if (ready > 0 || (ready < 0 && errno == EINTR)) continue;
      in.error = ready == 0 ? ETIMEDOUT : errno;
      return in;
    }
    if (n < 0) {
      in.error = errno;
      return in;
    }
    if (n == 0) return in;
    const std::string_view got(buf.data(), static_cast<std::size_t>(n));
    const std::size_t room = keep - in.text.size();
    in.text.append(got.substr(0, room));
    if (got.size() <= room || keep == 0) continue;
    // Past what is kept: drained, but looked at for a hostdev (a domain without one exits 0 at any
    // size; one with one is refused as too large to ask about, never judged on a part).
    if (!in.cut_short)
      carry.assign(
          std::string_view(in.text).substr(in.text.size() - std::min(in.text.size(), kTag.size() - 1)));
    in.cut_short = true;
    carry.append(got.substr(room));
    if (carry.find(kTag) != std::string::npos) in.hostdev_after = true;
    carry.erase(0, carry.size() - std::min(carry.size(), kTag.size() - 1));
  }
}

// agent.yaml read by the agent's own reader, in gpunode-agent-tools.so, on a miss of the hook's
// settings cache: the bytes read, handed over as a buffer (module_abi.hpp).
gpunode::error::Result<agent::HookSettings> read_with_agents_reader(const std::string& config_file,
                                                                    std::string_view bytes) {
  namespace error = gpunode::error;
  auto entry =
      agent::load_entry(agent::module_beside_executable(agent::kToolsModule), agent::kHookSettingsEntry);
  if (!entry)
    return error::fail(error::Errc::unavailable, "cannot read " + config_file + ": " + entry.error().detail);
  char* socket = nullptr;
  char* message = nullptr;
  int allow = 0;
  const int verdict = reinterpret_cast<gpunode_agent_hook_settings_fn*>(*entry)(
      config_file.c_str(), bytes.data(), bytes.size(), &socket, &allow, &message);
  std::string said =
      message != nullptr ? message : "cannot read " + config_file + ": its reader said nothing";
  const bool read = verdict == 0 && socket != nullptr;
  agent::HookSettings settings;
  if (read) settings.socket = socket;
  settings.when_agent_down =
      allow != 0 ? gpunode::config::WhenAgentDown::allow : gpunode::config::WhenAgentDown::deny;
  std::free(socket);
  std::free(message);
  if (!read) return error::fail(error::Errc::invalid, std::move(said));
  return settings;
}

// `libvirt-hook`: its arguments by position, never through an option parser (hook_args.hpp). An
// argument list it cannot read refuses (exit 1), as every failure of the hook before an answer does.
// A call that never asks (every operation but a start, migration or restore, and a domain without
// a PCI hostdev) exits 0 once stdin is drained; one that asks, asks (libvirt_hook.hpp).
int libvirt_hook(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 2, argv + argc);
  auto parsed = agent::parse_hook_command(args);
  if (!parsed) {
    std::fprintf(stderr, "gpunode: libvirt-hook refuses: %s\n", parsed.error().detail.c_str());
    return kRefuse;
  }
  const bool asks = agent::hook_asks(parsed->args[1], parsed->args[2]);
  // Read even when it does not ask (libvirt writes it to every hook), but kept only when it asks:
  // up to one byte past what the agent takes, the rest drained.
  Stdin in = read_stdin(asks ? agent::kAdmissionBodyLimit + 1 : 0);
  if (!asks) return kExitOk;
  if (in.error != 0) {
    std::fprintf(stderr, "gpunode: libvirt-hook refuses: cannot read the domain XML on stdin: %s\n",
                 std::strerror(in.error));
    return kRefuse;
  }
  // Cut short with a hostdev anywhere: too large to ask about, refused by run_libvirt_hook (never
  // judged on a part). Without one, at any size, it does not ask.
  if (!in.hostdev_after && !agent::may_have_pci_hostdev(in.text)) return kExitOk;
  const agent::HookSettingsCache cache;
  const auto settings = [&] {
    return agent::hook_settings(parsed->config_file, cache, read_with_agents_reader);
  };
  const auto verdict = agent::run_libvirt_hook(parsed->args, parsed->socket, settings, in.text, in.cut_short);
  for (const auto& text : verdict.stderr_lines) std::fprintf(stderr, "%s\n", text.c_str());
  return verdict.exit_code;
}

// The command line, by the tools module. A command it hands back (`run`, `check-config --files`)
// runs in the daemon module, with the tools module unloaded first: its parser and commands would
// stay mapped for the daemon's life (module_abi.hpp).
int run_tools(int argc, char** argv) {
  const auto tools = entry_of(agent::kToolsModule, agent::kToolsEntry);
  if (tools.entry == nullptr) return agent::kExitInternal;
  char** handed = nullptr;
  const int code = reinterpret_cast<gpunode_agent_tools_main_fn*>(tools.entry)(argc, argv, &handed);
  if (handed == nullptr) return code;
  int argc_daemon = 0;
  while (handed[argc_daemon] != nullptr) ++argc_daemon;
  // Loaded before the tools module goes, so that the libraries both use stay mapped.
  auto* daemon =
      reinterpret_cast<gpunode_agent_main_fn*>(entry_of(agent::kDaemonModule, agent::kDaemonEntry).entry);
  ::dlclose(tools.module);
  const int exit_code = daemon != nullptr ? daemon(argc_daemon, handed) : agent::kExitInternal;
  std::free(handed);
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string_view(argv[1]) == "libvirt-hook") {
    try {
      return libvirt_hook(argc, argv);
    } catch (const std::exception& e) {  // out of memory, say: an error of the hook's own refuses (§9)
      std::fprintf(stderr, "gpunode: libvirt-hook refuses: internal error: %s\n", e.what());
      return kRefuse;
    } catch (...) {
      std::fprintf(stderr, "gpunode: libvirt-hook refuses: internal error\n");
      return kRefuse;
    }
  }
  if (argc == 2 && std::string_view(argv[1]) ==
                       "version") {  // without a module: what fleets poll (`version --help` is CLI11's)
    std::printf("gpunode-agent %s\n", GPUNODE_VERSION);
    return kExitOk;
  }
  try {
    return run_tools(argc, argv);
  } catch (...) {  // out of memory: the modules' own errors never leave them (module_abi.hpp)
    std::fprintf(stderr, "gpunode-agent: internal error\n");
    return agent::kExitInternal;
  }
}
