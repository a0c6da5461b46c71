// What the libvirt hook decides before it loads anything (CONTRACT §9): its command line,
// `gpunode-agent libvirt-hook [--socket S] [--config F] -- NAME OPERATION SUB-OPERATION [EXTRA]`,
// and whether this call asks the agent at all. libvirtd runs the hook on every event of every
// domain (start, started, stopped, release, reconnect, ...); only a start, migration or restore of
// a domain with a PCI hostdev asks. gpunode-agent answers every other call itself, before it maps
// the hook's module (main.cpp), so those cost no more than the executable's own start.
//
// libvirt's four arguments are data, read by position: a domain's name is chosen by whoever defines
// the domain, and a domain named `--help` or `--socket=x` must be asked about like any other. So the
// hook's arguments are not given to an option parser: options come first, `--` ends them, and what
// follows is libvirt's. Read before anything else runs (main.cpp), and pure, for the tests.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/error/error.hpp"

namespace gpunode::agent {

struct HookCommand {
  std::optional<std::string> socket;                    // --socket: else admin.socket of the config
  std::string config_file = "/etc/gpunode/agent.yaml";  // --config
  std::vector<std::string> args;                        // NAME OPERATION SUB-OPERATION EXTRA
};

// `argv`: what follows `libvirt-hook`. Options (`--socket S`, `--socket=S`, `--config F`,
// `--config=F`) until `--`; after it, libvirt's four arguments taken as they are. Without `--`
// (an older 50-gpunode, which passed no option), the four are libvirt's only when none of them
// begins with '-': else they cannot be told from options, and that is an error. The error (a help
// request included: Errc::invalid, every one) says why; the hook then refuses (fails closed).
error::Result<HookCommand> parse_hook_command(std::span<const std::string_view> argv);

// Only these ask: `prepare begin`, `migrate begin`, `restore begin`. Every other call exits 0 at once.
bool hook_asks(std::string_view operation, std::string_view sub_operation);

// Whether the domain XML may hold a `<hostdev ... type='pci'>`: a scan of the start tags, no XML
// parse (the agent parses). When in doubt it says yes (the agent is asked and decides).
bool may_have_pci_hostdev(std::string_view domain_xml);

// The largest admission request the agent takes (CONTRACT §9: 16 MiB); a domain whose request
// would be larger is refused by the hook itself, whatever when_agent_down says.
inline constexpr std::size_t kAdmissionBodyLimit = 16 * 1024 * 1024;

inline constexpr std::string_view kHookUsage =
    "usage: gpunode-agent libvirt-hook [--socket PATH] [--config FILE] -- NAME OPERATION SUB-OPERATION EXTRA";

}  // namespace gpunode::agent
