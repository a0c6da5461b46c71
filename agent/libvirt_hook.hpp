// gpunode-agent libvirt-hook (CONTRACT §9): libvirt's qemu hook, asking the agent whether a domain
// may start on the units its PCI hostdevs belong to. libvirt runs it as
// `HOOK NAME OPERATION SUB-OPERATION EXTRA` with the domain XML on stdin; a non-zero exit refuses
// the start and libvirt shows the hook's stderr in its error.
//
// What it decides is split from how it talks: the rules below are pure (tested without a socket);
// run_libvirt_hook() does the I/O (the admin socket, bounded by 5 s; agent.yaml through
// hook_settings.hpp). Which calls ask at all is decided before this module loads (hook_args.hpp).
#pragma once

#include <expected>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/config/config.hpp"
#include "gpunode/ctl/client.hpp"
#include "gpunode/error/error.hpp"
#include "hook_settings.hpp"

namespace gpunode::agent {

// What the hook prints on stderr and exits with.
struct HookVerdict {
  int exit_code = 0;
  std::vector<std::string> stderr_lines;
};

// The verdict on the agent's answer (or on why there is none). `socket` and `name` go into the
// lines; `when_down` is enforcement.when_agent_down.
HookVerdict hook_verdict(const std::expected<ctl::Response, ctl::TransportError>& answer,
                         const std::string& socket, const std::string& name, config::WhenAgentDown when_down);

// Where run_libvirt_hook takes admin.socket and enforcement.when_agent_down from when it asks
// (hook_settings(): the cache, else agent.yaml); an error refuses the start.
using HookSettingsSource = std::function<error::Result<HookSettings>()>;

// The whole hook. `args`: NAME OPERATION SUB-OPERATION [EXTRA]. `socket_flag`: --socket.
// `domain_xml` is stdin's text, `domain_xml_cut_short` when stdin held more than
// kAdmissionBodyLimit (then refused). Settings are taken only when the call asks the agent. A
// domain too large to ask about is refused whatever when_agent_down says.
HookVerdict run_libvirt_hook(const std::vector<std::string>& args,
                             const std::optional<std::string>& socket_flag,
                             const HookSettingsSource& settings, std::string_view domain_xml,
                             bool domain_xml_cut_short = false);

}  // namespace gpunode::agent
