// The hook's command line (CONTRACT §9 "Arguments"): libvirt's arguments by position after `--`,
// whatever they look like; options before it; anything else fails closed.
#include "hook_args.hpp"

#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <vector>

using gpunode::agent::parse_hook_command;

namespace {

auto parse(std::vector<std::string_view> argv) {
  return parse_hook_command(argv);
}

}  // namespace

TEST_CASE("hook arguments: a domain's name is data, whatever it looks like") {
  for (std::string_view name :
       {"vm-1", "--", "--help", "-h", "--socket=x", "--config=/tmp/evil.yaml", "--socket", "-", ""}) {
    CAPTURE(name);
    const auto r = parse({"--", name, "prepare", "begin", "-"});
    REQUIRE(r);
    CHECK(r->args == std::vector<std::string>{std::string(name), "prepare", "begin", "-"});
    CHECK_FALSE(r->socket);
    CHECK(r->config_file == "/etc/gpunode/agent.yaml");
  }
}

TEST_CASE("hook arguments: options before `--`, both spellings") {
  auto r =
      parse({"--socket", "/run/s.sock", "--config=/etc/a.yaml", "--", "--help", "prepare", "begin", "-"});
  REQUIRE(r);
  CHECK(r->socket == "/run/s.sock");
  CHECK(r->config_file == "/etc/a.yaml");
  CHECK(r->args == std::vector<std::string>{"--help", "prepare", "begin", "-"});
  r = parse({"--socket=/s", "--config", "/c", "--", "vm", "stopped", "end", "-"});
  REQUIRE(r);
  CHECK(r->socket == "/s");
  CHECK(r->config_file == "/c");
}

TEST_CASE("hook arguments: without `--` (an older 50-gpunode), plain arguments are still libvirt's") {
  const auto r = parse({"vm-1", "prepare", "begin", "-"});
  REQUIRE(r);
  CHECK(r->args == std::vector<std::string>{"vm-1", "prepare", "begin", "-"});
  CHECK(parse({"-", "prepare", "begin", "-"}));  // a bare "-" is never an option
}

TEST_CASE("hook arguments: what cannot be read refuses, saying why") {
  const auto refused = [](std::vector<std::string_view> argv, std::string_view why) {
    CAPTURE(why);
    const auto r = parse(std::move(argv));
    REQUIRE_FALSE(r);
    CHECK(r.error().find(why) != std::string::npos);
  };
  refused({"--help", "prepare", "begin", "-"}, "help request");
  refused({"-h"}, "help request");
  // What an older 50-gpunode (no `--`) passes for domains named like options: never shifted.
  refused({"--socket=x", "prepare", "begin", "-"}, "options must be followed by '--'");
  refused({"--config=/tmp/e.yaml", "prepare", "begin", "-"}, "options must be followed by '--'");
  refused({"--", "prepare", "begin", "-"}, "got 3 arguments");
  refused({"vm", "--socket=x", "begin", "-"}, "cannot tell '--socket=x' from an option");
  refused({"-x", "prepare", "begin", "-"}, "unknown option '-x'");
  refused({"--", "vm", "prepare", "begin"}, "got 3 arguments");
  refused({"--", "vm", "prepare", "begin", "-", "x"}, "got 5 arguments");
  refused({}, "got 0 arguments");
  refused({"--socket"}, "--socket needs a value");
  refused({"--config=", "--", "vm", "prepare", "begin", "-"}, "--config needs a value");
  refused({"--verbose", "--", "vm", "prepare", "begin", "-"}, "unknown option '--verbose'");
}
