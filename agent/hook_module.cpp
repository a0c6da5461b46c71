// gpunode-agent-hook.so: `libvirt-hook` for the calls that ask the agent (see command_line.hpp for
// why commands live in modules; main.cpp answers every other call before loading this one).
// libvirtd runs it on every GPU domain start and its whole run counts (CONTRACT §9 "Speed"), so it
// maps only what asking takes: fmt, Boost.JSON and the admin socket's client. Not yaml-cpp: the
// settings come from the hook's cache, and on a miss from the agent's config reader in
// gpunode-agent-tools.so, loaded then (hook_settings.hpp).
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <type_traits>

#include "command_line.hpp"
#include "hook_settings.hpp"
#include "libvirt_hook.hpp"
#include "modules.hpp"

extern "C" GPUNODE_EXPORT int gpunode_agent_command_v2(const gpunode::agent::CommandLine& line);

namespace {

namespace agent = gpunode::agent;
namespace error = gpunode::error;

constexpr int kRefuse = 1;  // CONTRACT §9: any error of the hook's own before an answer refuses the start

// agent.yaml read by the agent's own reader, in gpunode-agent-tools.so beside this module.
error::Result<agent::HookSettings> read_with_agents_reader(const std::string& config_file,
                                                           std::string_view bytes) {
  auto path = agent::module_beside(reinterpret_cast<const void*>(&gpunode_agent_command_v2),
                                   "gpunode-agent-tools.so");
  auto entry = path ? agent::load_entry(*path, agent::kHookSettingsEntry) : std::unexpected(path.error());
  if (!entry)
    return error::fail(error::Errc::unavailable,
                       fmt::format("cannot read {}: {}", config_file, entry.error().detail));
  error::Result<agent::HookSettings> settings =
      error::fail(error::Errc::internal, "cannot read " + config_file + ": its reader said nothing");
  reinterpret_cast<agent::HookSettingsEntry*> (*entry)(config_file, bytes, &settings);
  return settings;
}

}  // namespace

extern "C" GPUNODE_EXPORT int gpunode_agent_command_v2(const gpunode::agent::CommandLine& line) {
  static_assert(std::is_same_v<decltype(gpunode_agent_command_v2), agent::CommandEntry>);
  if (line.command != agent::CommandLine::Command::libvirt_hook) return 2;
  return agent::report_internal_errors(
      [&] {
        const agent::HookSettingsCache cache;
        const auto settings = [&] {
          return agent::hook_settings(line.config_file, cache, read_with_agents_reader);
        };
        const auto verdict = agent::run_libvirt_hook(line.hook_args, line.hook_socket, settings,
                                                     line.hook_domain_xml, line.hook_domain_xml_cut_short);
        for (const auto& text : verdict.stderr_lines) fmt::print(stderr, "{}\n", text);
        return verdict.exit_code;
      },
      kRefuse);
}
