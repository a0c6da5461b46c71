// gpunode-agent's parsed command line, as the module that parses it hands it to the module that
// runs the command.
//
// Why modules: a process maps every library its executable needs before main() runs, and with
// BIND_NOW (the agent's and Debian's libraries') resolves all their symbols too. OpenSSL, SQLite
// and libxml2 alone cost several milliseconds a start, which `version`, `discover`,
// `check-config` and `libvirt-hook` (run by libvirtd on every domain start) never use. So the
// executable itself links no library beyond the C++ runtime: it answers `libvirt-hook` by position
// and hands every other command line to the tools module; each command runs in the one module
// whose libraries it needs (loaded by full path, modules.hpp):
//   gpunode-agent-tools.so   the command line (CLI11), version, discover, check-config, reload
//                            (libpci, yaml-cpp, Boost.JSON); and the config reader the hook's
//                            module loads on a cache miss (hook_settings.hpp)
//   gpunode-agent-hook.so    libvirt-hook, for the calls that ask (fmt, Boost.JSON: no YAML)
//   gpunode-agent-daemon.so  run, check-config --files (everything: OpenSSL, SQLite, libxml2,
//                            Boost.Beast, ...: the files are checked by the agent's own loaders)
// The modules export their entries alone (modules.map): kMainEntry and kHookSettingsEntry (tools),
// kCommandEntry (hook, daemon).
#pragma once

#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpunode::agent {

struct CommandLine {
  enum class Command { discover, check_config, run, libvirt_hook, reload };
  Command command = Command::discover;
  std::string config_file;  // --config of the command (run, libvirt-hook and reload have defaults)
  // check-config --files: also open every file the config names, as the calling user
  bool files = false;
  // discover
  std::string host_root;
  bool json = false;
  // libvirt-hook: NAME OPERATION SUB-OPERATION [EXTRA], as libvirt passes them
  std::vector<std::string> hook_args;
  std::optional<std::string> hook_socket;
  std::string hook_domain_xml;             // stdin, read by main.cpp (which answers the calls that never ask)
  bool hook_domain_xml_cut_short = false;  // stdin held more than kAdmissionBodyLimit: refused
};

// Runs the command; returns the process's exit code. Never throws.
using CommandEntry = int(const CommandLine&);
// Parses argv (all but `libvirt-hook`) and runs the command; returns the exit code. Never throws.
using MainEntry = int(int argc, char** argv);
// A module's entry is its one exported symbol (the project builds with hidden visibility).
#define GPUNODE_EXPORT __attribute__((visibility("default")))
//
// The entries' names carry the modules' ABI (`_v2`): bump it in every entry name whenever
// CommandLine or an entry's signature changes. An executable and a module from two builds (a
// package half unpacked, a partial install) then find no entry and stop (the hook refusing the
// start) instead of reading each other's structures wrongly.
// Exit 70 (EX_SOFTWARE): the agent's own fault, an internal error or an installation without
// its modules; never the caller's.
inline constexpr int kExitInternal = 70;

inline constexpr const char* kCommandEntry = "gpunode_agent_command_v2";
inline constexpr const char* kMainEntry = "gpunode_agent_main_v2";

// gpunode-agent-proof.so, loaded by gpunodectl for `audit verify` (CONTRACT §12): checks an
// export's JSON lines against a PEM public key's text (gpunode/proof/checkpoint.hpp). Returns 0 and
// a summary in `message` when the chain and its checkpoints are whole, else 1 and the first break
// (or why the key cannot be used). Never throws. gpunodectl itself maps no OpenSSL.
using VerifyEntry = int(std::string_view lines, std::string_view key_pem, const std::string& key_label,
                        std::string& message);
inline constexpr const char* kVerifyEntry = "gpunode_agent_audit_verify_v1";
inline constexpr const char* kProofModule = "gpunode-agent-proof.so";

// What a module's entry runs its command through: an exception is a bug, never bad input, so it
// is reported as one (exit `failure`: 70, or 1 for the hook, which refuses the start on any error
// of its own) instead of escaping into main() or dying silently.
template <class Run>
int report_internal_errors(Run&& run, int failure = kExitInternal) noexcept {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpunode-agent: internal error: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "gpunode-agent: internal error: an exception of unknown type\n");
  }
  return failure;
}

}  // namespace gpunode::agent
