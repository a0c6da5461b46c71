// What crosses between gpunode-agent, gpunodectl and the modules they load: C functions over an
// argv, as a program's main() takes one, and byte buffers; never a C++ type. So an executable and
// a module agree on nothing but C (they may even carry two C++ runtimes: gpunode-agent links its
// own statically, the modules the system's), and no structure's layout needs a version.
//
// Why modules: a process maps every library its executable needs before main() runs, and with
// BIND_NOW (the agent's and Debian's libraries') resolves all their symbols too. OpenSSL, SQLite
// and libxml2 alone cost several milliseconds a start, which `version`, `discover`, `check-config`
// and `libvirt-hook` (run by libvirtd on every domain start) never use. So each command runs in
// the one module whose libraries it needs (loaded by full path, modules.hpp):
//   gpunode-agent            libvirt-hook, whole (CONTRACT §9 "Speed"), and a bare `version`: it
//                            links the C++ runtime and fmt into itself and maps libc alone, as
//                            /bin/true does (agent/CMakeLists.txt)
//   gpunode-agent-tools.so   the command line (CLI11), version, discover, check-config, reload
//                            (libpci, yaml-cpp, Boost.JSON); and the config reader the hook loads
//                            on a miss of its settings' cache (hook_settings.hpp)
//   gpunode-agent-daemon.so  run, check-config --files (everything: OpenSSL, SQLite, libxml2,
//                            Boost.Beast, ...: the files are checked by the agent's own loaders)
//   gpunode-agent-proof.so   gpunodectl's `audit verify` (OpenSSL)
// Each module exports its entries alone (modules.map). An entry never throws; it returns an exit
// code and what it allocates for its caller is malloc'ed (free(3) releases it: one C library in
// the process). A signature that changes takes a new name.
#pragma once

#include <cstddef>
#include <cstdio>
#include <exception>

extern "C" {

// gpunode-agent-daemon.so's "gpunode_agent_daemon_main": the argv the tools module writes for it,
// read by position: `gpunode-agent run --config FILE` or
// `gpunode-agent check-config --files --config FILE`; returns the exit code.
using gpunode_agent_main_fn = int(int argc, char** argv);

// gpunode-agent-tools.so's "gpunode_agent_tools_main": gpunode-agent's whole argv (all commands but
// `libvirt-hook` and a bare `version`), parsed and run as main() would; returns the exit code. The
// daemon module's commands it does not run: it returns 0 with `*daemon_argv` set to the argv it
// writes for gpunode_agent_daemon_main, null-terminated, in one malloc'ed block (the pointers, then
// the strings they point to: free(3) of the block releases it); else `*daemon_argv` is null. The
// executable then loads the daemon module and unloads this one, whose parser a daemon running for
// months has no use for.
using gpunode_agent_tools_main_fn = int(int argc, char** argv, char*** daemon_argv);

// gpunode-agent-tools.so's "gpunode_agent_hook_settings": the hook's settings from agent.yaml's
// `size` bytes at `bytes` (read by the hook from `config_file`, a C string naming it in messages),
// by the agent's own config reader. Returns 0 with `*socket` (admin.socket) and `*allow` (1 when
// enforcement.when_agent_down is allow, else 0); else 1 with `*message`, one line saying why.
using gpunode_agent_hook_settings_fn = int(const char* config_file, const char* bytes, std::size_t size,
                                           char** socket, int* allow, char** message);

// gpunode-agent-proof.so's "gpunode_agent_audit_verify", loaded by gpunodectl for `audit verify`
// (CONTRACT §12): an export's JSON lines and a PEM public key's text, `key_label` (a C string)
// naming the key in messages. Returns 0 when the chain and its checkpoints are whole, else 1; with
// `*message` the summary or the first break (or why the key cannot be used).
using gpunode_agent_verify_fn = int(const char* lines, std::size_t lines_size, const char* key_pem,
                                    std::size_t key_pem_size, const char* key_label, char** message);
}

namespace gpunode::agent {

inline constexpr const char* kToolsModule = "gpunode-agent-tools.so";
inline constexpr const char* kDaemonModule = "gpunode-agent-daemon.so";
inline constexpr const char* kProofModule = "gpunode-agent-proof.so";
inline constexpr const char* kToolsEntry = "gpunode_agent_tools_main";
inline constexpr const char* kDaemonEntry = "gpunode_agent_daemon_main";
inline constexpr const char* kHookSettingsEntry = "gpunode_agent_hook_settings";
inline constexpr const char* kVerifyEntry = "gpunode_agent_audit_verify";

// A module's entry is its one exported symbol (the project builds with hidden visibility).
#define GPUNODE_EXPORT __attribute__((visibility("default")))

// Exit 70 (EX_SOFTWARE): the agent's own fault, an internal error or an installation without
// its modules; never the caller's.
inline constexpr int kExitInternal = 70;

// What a module's entry runs its command through: an exception is a bug, never bad input, so it
// is reported as one (exit `failure`: 70, or 1 where any error refuses) instead of escaping into
// the caller, which C cannot catch.
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
