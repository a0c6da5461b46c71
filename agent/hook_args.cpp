#include "hook_args.hpp"

namespace gpunode::agent {
namespace {

// libvirt always passes four (virHookCall: EXTRA is "-" when there is none). Requiring all four
// keeps a name that looks like `--` from shifting the others into its place.
constexpr std::size_t kLibvirtArgs = 4;

// Every refusal here is of arguments that cannot be read.
std::unexpected<error::Error> refuse(std::string why) {
  return error::fail(error::Errc::invalid, std::move(why));
}

bool blank(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

error::Result<HookCommand> with_args(HookCommand cmd, std::span<const std::string_view> rest) {
  if (rest.size() != kLibvirtArgs) {
    return refuse("expected libvirt's NAME OPERATION SUB-OPERATION EXTRA, got " +
                  std::to_string(rest.size()) + " argument" + (rest.size() == 1 ? "" : "s"));
  }
  for (const auto a : rest) cmd.args.emplace_back(a);
  return cmd;
}

}  // namespace

error::Result<HookCommand> parse_hook_command(std::span<const std::string_view> argv) {
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
      return refuse(std::string("a help request is not a hook call; ") + std::string(kHookUsage));
    } else if (a.starts_with("-") && a != "-") {
      return refuse("unknown option '" + std::string(a) + "' before '--'; " + std::string(kHookUsage));
    } else {
      break;  // the first of libvirt's arguments, without `--`
    }
    if (!value) {
      if (i + 1 >= argv.size()) return refuse(std::string(name) + " needs a value");
      value = argv[++i];
    }
    if (value->empty()) return refuse(std::string(name) + " needs a value");
    *into = std::string(*value);
  }
  if (i > 0)
    return refuse("options must be followed by '--' and libvirt's arguments; " + std::string(kHookUsage));
  const auto rest = argv.subspan(i);
  for (const auto a : rest) {
    if (a.starts_with("-") &&
        a != "-") {  // a bare "-" is libvirt's EXTRA when there is none, never an option
      return refuse("libvirt's arguments follow '--' (a domain's name may begin with '-'): cannot tell '" +
                    std::string(a) + "' from an option; " + std::string(kHookUsage));
    }
  }
  return with_args(std::move(cmd), rest);
}

bool hook_asks(std::string_view operation, std::string_view sub_operation) {
  return sub_operation == "begin" &&
         (operation == "prepare" || operation == "migrate" || operation == "restore");
}

bool may_have_pci_hostdev(std::string_view xml) {
  constexpr std::string_view kTag = "<hostdev";
  for (std::size_t at = xml.find(kTag); at != std::string_view::npos; at = xml.find(kTag, at + 1)) {
    std::size_t i = at + kTag.size();
    if (i >= xml.size()) return true;                                // cut short: let the agent judge
    if (!blank(xml[i]) && xml[i] != '>' && xml[i] != '/') continue;  // <hostdevfoo: another element
    // Attributes up to the tag's end: NAME = 'VALUE' | "VALUE".
    while (i < xml.size() && xml[i] != '>') {
      while (i < xml.size() && (blank(xml[i]) || xml[i] == '/')) ++i;
      const std::size_t name_at = i;
      while (i < xml.size() && !blank(xml[i]) && xml[i] != '=' && xml[i] != '>' && xml[i] != '/') ++i;
      const std::string_view name = xml.substr(name_at, i - name_at);
      if (name.find_first_of("'\"<") != std::string_view::npos) return true;  // not a tag we can read: ask
      while (i < xml.size() && blank(xml[i])) ++i;
      if (i >= xml.size()) return true;
      if (xml[i] != '=') {
        if (name.empty() && xml[i] != '>') return true;  // not a tag we can read: ask
        continue;
      }
      ++i;
      while (i < xml.size() && blank(xml[i])) ++i;
      if (i >= xml.size() || (xml[i] != '\'' && xml[i] != '"')) return true;
      const char quote = xml[i++];
      const std::size_t end = xml.find(quote, i);
      if (end == std::string_view::npos) return true;
      if (name == "type" && xml.substr(i, end - i) == "pci") return true;
      i = end + 1;
    }
  }
  return false;
}

}  // namespace gpunode::agent
