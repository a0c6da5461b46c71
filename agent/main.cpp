// gpunode-agent: the node agent's command line (CONTRACT §1). A thin main that links nothing but
// the C++ runtime: it answers `libvirt-hook` itself, by position (hook_args.hpp), and a bare
// `version`, and hands every other command line to gpunode-agent-tools.so, which parses it (CLI11) and runs
// it or loads the daemon's module (command_line.hpp says why and which). libvirtd runs the hook on every
// event of every domain, so its path maps only what it uses (CONTRACT §9 "Speed"): nothing at all for the
// calls that never ask, and gpunode-agent-hook.so for those that do. Not even CLI11, whose
// validators and iostreams are constructed at start-up in every program that includes it.
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "command_line.hpp"
#include "hook_args.hpp"
#include "modules.hpp"

namespace {

namespace agent = gpunode::agent;

constexpr int kExitOk = 0;
constexpr int kExitBroken = 70;  // an installation without its modules: not the caller's fault

// The entry `entry` of `module`, beside the executable; nullptr (said on stderr) when missing.
void* entry_of(const char* module, const char* entry) {
  auto found = agent::load_entry(agent::module_beside_executable(module), entry);
  if (!found) {
    std::fprintf(stderr, "gpunode-agent: %s\n", found.error().c_str());
    return nullptr;
  }
  return *found;
}

// stdin, whole: the domain XML libvirt writes to every hook.
std::string read_stdin() {
  std::string text;
  std::array<char, 65536> buf;  // not zeroed: read() fills what is used (zeroing it costs 16 page faults)
  for (;;) {
    const ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return text;  // end, or an error: what was read is what the hook judges
    text.append(buf.data(), static_cast<std::size_t>(n));
  }
}

// `libvirt-hook`: its arguments by position, never through an option parser (hook_args.hpp). An
// argument list it cannot read refuses (exit 1), as every failure of the hook before an answer does.
// A call that never asks (every operation but a start, migration or restore, and a domain without
// a PCI hostdev) is answered here, without loading the hook's module.
int libvirt_hook(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 2, argv + argc);
  auto parsed = agent::parse_hook_command(args);
  if (!parsed) {
    std::fprintf(stderr, "gpunode: libvirt-hook refuses: %s\n", parsed.error().c_str());
    return 1;
  }
  std::string xml = read_stdin();  // read even when it does not ask: libvirt writes it to every hook
  if (!agent::hook_asks(parsed->args[1], parsed->args[2]) || !agent::may_have_pci_hostdev(xml))
    return kExitOk;
  agent::CommandLine line;
  line.command = agent::CommandLine::Command::libvirt_hook;
  line.config_file = std::move(parsed->config_file);
  line.hook_args = std::move(parsed->args);
  line.hook_socket = std::move(parsed->socket);
  line.hook_domain_xml = std::move(xml);
  auto* entry =
      reinterpret_cast<agent::CommandEntry*>(entry_of("gpunode-agent-hook.so", agent::kCommandEntry));
  if (entry == nullptr) {
    std::fprintf(stderr, "gpunode: libvirt-hook refuses: the hook's module cannot be loaded\n");
    return 1;  // fails closed, as every failure before an answer
  }
  return entry(line);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string_view(argv[1]) == "libvirt-hook") return libvirt_hook(argc, argv);
  if (argc == 2 && std::string_view(argv[1]) ==
                       "version") {  // without a module: what fleets poll (`version --help` is CLI11's)
    std::printf("gpunode-agent %s\n", GPUNODE_VERSION);
    return kExitOk;
  }
  auto* entry = reinterpret_cast<agent::MainEntry*>(entry_of("gpunode-agent-tools.so", agent::kMainEntry));
  return entry != nullptr ? entry(argc, argv) : kExitBroken;
}
