// gpunode-agent: the node agent's command line (CONTRACT §1). A thin main that links nothing but
// the C++ runtime: it answers `libvirt-hook` itself, by position (hook_args.hpp), and a bare
// `version`, and hands every other command line to gpunode-agent-tools.so, which parses it (CLI11) and runs
// it or loads the daemon's module (command_line.hpp says why and which). libvirtd runs the hook on every
// event of every domain, so its path maps only what it uses (CONTRACT §9 "Speed"): nothing at all for the
// calls that never ask, and gpunode-agent-hook.so for those that do. Not even CLI11, whose
// validators and iostreams are constructed at start-up in every program that includes it.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
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
constexpr int kRefuse = 1;  // the hook's answer to any error of its own before an answer (CONTRACT §9)
constexpr int kStdinWaitMs = 5000;  // a non-blocking stdin that stays empty this long: refused

// The entry `entry` of `module`, beside the executable; nullptr (said on stderr) when missing.
void* entry_of(const char* module, const char* entry) {
  auto found = agent::load_entry(agent::module_beside_executable(module), entry);
  if (!found) {
    std::fprintf(stderr, "gpunode-agent: %s\n", found.error().detail.c_str());
    return nullptr;
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

// `libvirt-hook`: its arguments by position, never through an option parser (hook_args.hpp). An
// argument list it cannot read refuses (exit 1), as every failure of the hook before an answer does.
// A call that never asks (every operation but a start, migration or restore, and a domain without
// a PCI hostdev) is answered here, without loading the hook's module.
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
  // Cut short with a hostdev anywhere: too large to ask about, refused by the module (never judged
  // on a part). Without one, at any size, it does not ask.
  if (!in.hostdev_after && !agent::may_have_pci_hostdev(in.text)) return kExitOk;
  agent::CommandLine line;
  line.command = agent::CommandLine::Command::libvirt_hook;
  line.config_file = std::move(parsed->config_file);
  line.hook_args = std::move(parsed->args);
  line.hook_socket = std::move(parsed->socket);
  line.hook_domain_xml = std::move(in.text);
  line.hook_domain_xml_cut_short = in.cut_short;
  auto* entry =
      reinterpret_cast<agent::CommandEntry*>(entry_of("gpunode-agent-hook.so", agent::kCommandEntry));
  if (entry == nullptr) {
    std::fprintf(stderr, "gpunode: libvirt-hook refuses: the hook's module cannot be loaded\n");
    return kRefuse;  // fails closed, as every failure before an answer
  }
  return entry(line);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string_view(argv[1]) == "libvirt-hook") {
    try {
      return libvirt_hook(argc, argv);
    } catch (const std::exception& e) {  // out of memory, say: an error of the hook's own refuses (§9)
      std::fprintf(stderr, "gpunode: libvirt-hook refuses: internal error: %s\n", e.what());
      return kRefuse;
    }
  }
  if (argc == 2 && std::string_view(argv[1]) ==
                       "version") {  // without a module: what fleets poll (`version --help` is CLI11's)
    std::printf("gpunode-agent %s\n", GPUNODE_VERSION);
    return kExitOk;
  }
  auto* entry = reinterpret_cast<agent::MainEntry*>(entry_of("gpunode-agent-tools.so", agent::kMainEntry));
  return entry != nullptr ? entry(argc, argv) : agent::kExitInternal;
}
