// What the hook decides before it loads anything (CONTRACT §9): its command line (libvirt's
// arguments by position after `--`, whatever they look like; options before it; anything else fails
// closed), which calls ask, and the tag scan.
#include "hook_args.hpp"

#include <doctest/doctest.h>

#include <string>
#include <string_view>
#include <vector>

using gpunode::agent::hook_asks;
using gpunode::agent::may_have_pci_hostdev;
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
    CHECK(r.error().detail.find(why) != std::string::npos);
    CHECK(r.error().code == gpunode::error::Errc::invalid);
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

TEST_CASE("only prepare, migrate and restore begin ask") {
  CHECK(hook_asks("prepare", "begin"));
  CHECK(hook_asks("migrate", "begin"));
  CHECK(hook_asks("restore", "begin"));
  for (const char* op : {"start", "started", "stopped", "release", "reconnect", "attach"})
    CHECK_FALSE(hook_asks(op, "begin"));
  CHECK_FALSE(hook_asks("prepare", "end"));
  CHECK_FALSE(hook_asks("prepare", "-"));
  CHECK_FALSE(hook_asks("", ""));
}

TEST_CASE("the tag scan finds every spelling of a PCI hostdev, and never misses one") {
  CHECK(may_have_pci_hostdev(
      "<domain><devices><hostdev mode='subsystem' type='pci' managed='yes'/></devices></domain>"));
  CHECK(may_have_pci_hostdev(
      R"(<domain><devices><hostdev mode="subsystem" type="pci"></hostdev></devices></domain>)"));
  CHECK(may_have_pci_hostdev("<hostdev\n    type = 'pci'\n    mode='subsystem'>"));
  CHECK(may_have_pci_hostdev("<hostdev type='pci'/>"));
  // Other hostdevs and elements whose name starts alike are not PCI hostdevs.
  CHECK_FALSE(
      may_have_pci_hostdev("<domain><devices><hostdev mode='subsystem' type='usb'/></devices></domain>"));
  CHECK_FALSE(may_have_pci_hostdev(
      "<domain><devices><hostdevice type='pci'/><interface type='hostdev'/></devices></domain>"));
  CHECK_FALSE(may_have_pci_hostdev("<domain><name>vm</name><devices><disk type='file'/></devices></domain>"));
  CHECK_FALSE(may_have_pci_hostdev(""));
  CHECK_FALSE(may_have_pci_hostdev("<hostdev mode='subsystem' type='pcie'/>"));
  // What it cannot read, it hands to the agent.
  CHECK(may_have_pci_hostdev("<hostdev"));
  CHECK(may_have_pci_hostdev("<hostdev type='pci"));
  CHECK(may_have_pci_hostdev("<hostdev type=pci>"));
  CHECK(may_have_pci_hostdev("<hostdev \"x\">"));
}
