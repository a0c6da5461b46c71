#include "hook_args.hpp"

namespace gpunode::agent {
namespace {

// libvirt always passes four (virHookCall: EXTRA is "-" when there is none). Requiring all four
// keeps a name that looks like `--` from shifting the others into its place.
constexpr std::size_t kLibvirtArgs = 4;

std::expected<HookCommand, std::string> with_args(HookCommand cmd, std::span<const std::string_view> rest) {
  if (rest.size() != kLibvirtArgs) {
    return std::unexpected("expected libvirt's NAME OPERATION SUB-OPERATION EXTRA, got " +
                           std::to_string(rest.size()) + " argument" + (rest.size() == 1 ? "" : "s"));
  }
  for (const auto a : rest) cmd.args.emplace_back(a);
  return cmd;
}

}  // namespace

std::expected<HookCommand, std::string> parse_hook_command(std::span<const std::string_view> argv) {
  HookCommand cmd;
  std::size_t i = 0;
  for (; i < argv.size(); ++i) {
    const std::string_view a = argv[i];
    if (a == "--") return with_args(std::move(cmd), argv.subspan(i + 1));
    std::string* into = nullptr;
    std::string_view name = a;
    std::optional<std::string_view> value;
    if (const auto eq = a.find('='); eq != std::string_view::npos && a.starts_with("--")) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
    }
    if (name == "--socket") {
      cmd.socket.emplace();
      into = &*cmd.socket;
    } else if (name == "--config") {
      into = &cmd.config_file;
    } else if (a == "-h" || a == "--help" || a == "--help-all") {
      return std::unexpected(std::string("a help request is not a hook call; ") + std::string(kHookUsage));
    } else if (a.starts_with("-") && a != "-") {
      return std::unexpected("unknown option '" + std::string(a) + "' before '--'; " +
                             std::string(kHookUsage));
    } else {
      break;  // the first of libvirt's arguments, without `--`
    }
    if (!value) {
      if (i + 1 >= argv.size()) return std::unexpected(std::string(name) + " needs a value");
      value = argv[++i];
    }
    if (value->empty()) return std::unexpected(std::string(name) + " needs a value");
    *into = std::string(*value);
  }
  if (i > 0)
    return std::unexpected("options must be followed by '--' and libvirt's arguments; " +
                           std::string(kHookUsage));
  const auto rest = argv.subspan(i);
  for (const auto a : rest) {
    if (a.starts_with("-") &&
        a != "-") {  // a bare "-" is libvirt's EXTRA when there is none, never an option
      return std::unexpected(
          "libvirt's arguments follow '--' (a domain's name may begin with '-'): cannot tell '" +
          std::string(a) + "' from an option; " + std::string(kHookUsage));
    }
  }
  return with_args(std::move(cmd), rest);
}

}  // namespace gpunode::agent
