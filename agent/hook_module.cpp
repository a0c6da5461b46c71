// gpunode-agent-hook.so: `libvirt-hook` alone (see command_line.hpp for why commands live in
// modules). libvirtd runs the hook on every domain start and its whole run counts (CONTRACT §9
// "Speed"), so this module maps only what the hook uses: the config reader (yaml-cpp), Boost.JSON
// and the admin socket's client; not libpci, libudev or anything of discovery's.
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <type_traits>

#include "command_line.hpp"
#include "libvirt_hook.hpp"

extern "C" GPUNODE_EXPORT int gpunode_agent_command(const gpunode::agent::CommandLine& line) {
  namespace agent = gpunode::agent;
  static_assert(std::is_same_v<decltype(gpunode_agent_command), agent::CommandEntry>);
  if (line.command != agent::CommandLine::Command::libvirt_hook) return 2;
  return agent::report_internal_errors([&] {
    // libvirt runs hooks as HOOK NAME OPERATION SUB-OPERATION EXTRA, the domain XML on stdin (§9).
    std::string xml;
    char buf[65536];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, stdin)) > 0;) xml.append(buf, n);
    const auto verdict = agent::run_libvirt_hook(line.hook_args, line.hook_socket, line.config_file, xml);
    for (const auto& text : verdict.stderr_lines) fmt::print(stderr, "{}\n", text);
    return verdict.exit_code;
  });
}
