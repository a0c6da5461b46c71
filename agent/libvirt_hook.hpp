// gpunode-agent libvirt-hook (CONTRACT §9): libvirt's qemu hook, asking the agent whether a domain
// may start on the units its PCI hostdevs belong to. libvirt runs it as
// `HOOK NAME OPERATION SUB-OPERATION EXTRA` with the domain XML on stdin; a non-zero exit refuses
// the start and libvirt shows the hook's stderr in its error.
//
// What it decides is split from how it talks: the rules below are pure (tested without a socket);
// run_libvirt_hook() does the I/O (stdin, agent.yaml, the admin socket, bounded by 5 s).
#pragma once

#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/config/config.hpp"
#include "gpunode/ctl/client.hpp"

namespace gpunode::agent {

// Only these ask: `prepare begin`, `migrate begin`, `restore begin`. Every other call exits 0 at once.
bool hook_asks(std::string_view operation, std::string_view sub_operation);

// Whether the domain XML may hold a `<hostdev ... type='pci'>`: a scan of the start tags, no XML
// parse (the agent parses). When in doubt it says yes (the agent is asked and decides).
bool may_have_pci_hostdev(std::string_view domain_xml);

// What the hook prints on stderr and exits with.
struct HookVerdict {
  int exit_code = 0;
  std::vector<std::string> stderr_lines;
};

// The verdict on the agent's answer (or on why there is none). `socket` and `name` go into the
// lines; `when_down` is enforcement.when_agent_down.
HookVerdict hook_verdict(const std::expected<ctl::Response, ctl::TransportError>& answer, const std::string& socket,
                         const std::string& name, config::WhenAgentDown when_down);

// The whole hook. `args`: NAME OPERATION SUB-OPERATION [EXTRA]. `socket_flag`: --socket.
// `config_file`: agent.yaml for admin.socket and enforcement.when_agent_down (a missing file means
// the defaults). `domain_xml` is stdin's text.
HookVerdict run_libvirt_hook(const std::vector<std::string>& args, const std::optional<std::string>& socket_flag,
                             const std::string& config_file, std::string_view domain_xml);

}  // namespace gpunode::agent
