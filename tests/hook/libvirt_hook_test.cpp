// The libvirt hook's rules (CONTRACT §9): the verdict on each answer the agent can give (or not
// give), and the whole hook with its settings.
#include "libvirt_hook.hpp"

#include <doctest/doctest.h>

#include "answers.hpp"

using gpunode::agent::hook_verdict;
using gpunode::config::WhenAgentDown;
using gpunode::ctl::Response;
using gpunode::ctl::TransportError;

using gpunode::test::answer;
using gpunode::test::failure;

TEST_CASE("allowed: exit 0, nothing said") {
  auto v = hook_verdict(answer(200, R"({"allowed":true,"mode":"enforce","unitIds":["u-1"],"reasons":[]})"),
                        "/s", "vm1", WhenAgentDown::deny);
  CHECK(v.exit_code == 0);
  CHECK(v.stderr_lines.empty());
}

TEST_CASE("refused: exit 1, one line per reason; audit mode lets it start") {
  const std::string refused =
      R"({"allowed":false,"mode":"enforce","unitIds":["u-0000-41-00-0","u-0000-42-00-0"],"reasons":[)"
      R"({"code":"unit-reserved","message":"u-0000-41-00-0 is held by an active reservation","unitId":"u-0000-41-00-0"},)"
      R"({"code":"unknown-unit","message":"hostdev 0000:05:00.0 is a GPU of no unit of node n","unitId":null}]})";
  auto v = hook_verdict(answer(200, refused), "/s", "train-7", WhenAgentDown::allow);
  CHECK(v.exit_code == 1);
  REQUIRE(v.stderr_lines.size() == 2);
  CHECK(v.stderr_lines[0] ==
        "gpunode: domain train-7 refused: u-0000-41-00-0: unit-reserved: u-0000-41-00-0 is held by an active "
        "reservation");
  CHECK(
      v.stderr_lines[1] ==
      "gpunode: domain train-7 refused: -: unknown-unit: hostdev 0000:05:00.0 is a GPU of no unit of node n");
  std::string audit = refused;
  audit.replace(audit.find("enforce"), 7, "audit");
  auto a = hook_verdict(answer(200, audit), "/s", "train-7", WhenAgentDown::deny);
  CHECK(a.exit_code == 0);
  REQUIRE(a.stderr_lines.size() == 2);
  CHECK(a.stderr_lines[0].find("would be refused (audit mode") != std::string::npos);
  // A question the agent refuses (a definition it cannot read) is no decision: when_agent_down's.
  auto bad = hook_verdict(
      answer(400, R"({"code":"invalid-request","detail":"domainXml is not a libvirt domain definition"})"),
      "/s", "x", WhenAgentDown::deny);
  CHECK(bad.exit_code == 1);
  CHECK(bad.stderr_lines ==
        std::vector<std::string>{"gpunode: agent unreachable at /s: answered 400 invalid-request: domainXml "
                                 "is not a libvirt domain definition"});
}

TEST_CASE("the agent cannot be asked: when_agent_down decides, and the line says why") {
  const std::vector<std::expected<Response, TransportError>> down{
      failure(TransportError::Kind::missing, "No such file or directory"),
      failure(TransportError::Kind::not_listening),
      failure(TransportError::Kind::denied),
      failure(TransportError::Kind::refused_peer),
      failure(TransportError::Kind::timeout),
      failure(TransportError::Kind::broken, "not HTTP"),
      failure(TransportError::Kind::untrusted, "its directory /tmp is writable by others (mode 1777)"),
      answer(413, R"({"code":"body-too-large","detail":"the request body exceeds 65536 bytes"})"),
      answer(400, R"({"code":"invalid-request","detail":"domainXml is not XML"})"),
      answer(401, R"({"code":"unauthenticated"})"),
      answer(503, R"({"code":"storage-unavailable","detail":"disk full"})"),
      answer(500, "not json"),
      answer(404, R"({"code":"not-found","detail":"no such resource"})"),  // an agent without the route
      answer(200, R"({"allowed":"yes"})"),                                 // not an admission
      answer(200, "garbage"),
  };
  for (const auto& d : down) {
    auto deny = hook_verdict(d, "/run/gpunode/admin.sock", "vm", WhenAgentDown::deny);
    CHECK(deny.exit_code == 1);
    REQUIRE(deny.stderr_lines.size() == 1);
    CHECK(deny.stderr_lines[0].starts_with("gpunode: agent unreachable at /run/gpunode/admin.sock: "));
    auto allow = hook_verdict(d, "/run/gpunode/admin.sock", "vm", WhenAgentDown::allow);
    CHECK(allow.exit_code == 0);
    REQUIRE(allow.stderr_lines.size() == 1);
    CHECK(allow.stderr_lines[0].find("allowed (enforcement.when_agent_down: allow)") != std::string::npos);
  }
  CHECK(
      hook_verdict(failure(TransportError::Kind::timeout), "/s", "vm", WhenAgentDown::deny).stderr_lines[0] ==
      "gpunode: agent unreachable at /s: no answer within 5 s");
  CHECK(hook_verdict(answer(503, R"({"detail":"disk full"})"), "/s", "vm", WhenAgentDown::deny)
            .stderr_lines[0] == "gpunode: agent unreachable at /s: answered 503: disk full");
  CHECK(hook_verdict(answer(413, R"({"code":"body-too-large","detail":"over 16 MiB"})"), "/s", "vm",
                     WhenAgentDown::deny)
            .stderr_lines[0] == "gpunode: agent unreachable at /s: answered 413 body-too-large: over 16 MiB");
  CHECK(hook_verdict(failure(TransportError::Kind::untrusted, "served by uid 1000"), "/s", "vm",
                     WhenAgentDown::deny)
            .stderr_lines[0] == "gpunode: agent unreachable at /s: an untrusted server (served by uid 1000)");
}

TEST_CASE("what reaches libvirt's error is escaped: a domain's name, the agent's reasons") {
  const auto v = hook_verdict(
      answer(
          200,
          R"({"allowed":false,"mode":"enforce","reasons":[{"unitId":"u-1","code":"unit-reserved","message":"held\u001b[2J"}]})"),
      "/s", "vm\n\x1b[31mforged", WhenAgentDown::deny);
  REQUIRE(v.stderr_lines.size() == 1);
  CHECK(v.stderr_lines[0] ==
        "gpunode: domain vm\\x0a\\x1b[31mforged refused: u-1: unit-reserved: held\\x1b[2J");
}

TEST_CASE(
    "the whole hook: other operations and domains without PCI hostdevs never ask, nor read settings; bad "
    "arguments and settings refuse") {
  using gpunode::agent::HookSettings;
  using gpunode::agent::run_libvirt_hook;
  const std::string gpu =
      "<domain><name>vm</name><devices><hostdev mode='subsystem' type='pci'/></devices></domain>";
  int reads = 0;
  const auto defaults = [&]() -> gpunode::error::Result<HookSettings> {
    ++reads;
    return HookSettings{};
  };
  // No agent anywhere: had it asked, deny would refuse.
  const std::optional<std::string> nowhere = "/nonexistent/gpunode/admin.sock";
  CHECK(run_libvirt_hook({"vm", "started", "begin", "-"}, nowhere, defaults, gpu).exit_code == 0);
  CHECK(run_libvirt_hook({"vm", "prepare", "begin", "-"}, nowhere, defaults, "<domain><devices/></domain>")
            .exit_code == 0);
  CHECK(reads == 0);
  auto asked = run_libvirt_hook({"vm", "prepare", "begin", "-"}, nowhere, defaults, gpu);
  CHECK(reads == 1);
  CHECK(asked.exit_code == 1);
  REQUIRE(asked.stderr_lines.size() == 1);
  CHECK(asked.stderr_lines[0].starts_with(
      "gpunode: agent unreachable at /nonexistent/gpunode/admin.sock: no socket"));
  // Without --socket, admin.socket of the settings; with allow, the start goes ahead.
  const auto allow = [&]() -> gpunode::error::Result<HookSettings> {
    return HookSettings{"/nonexistent/other/admin.sock", gpunode::config::WhenAgentDown::allow};
  };
  auto allowed = run_libvirt_hook({"vm", "prepare", "begin", "-"}, std::nullopt, allow, gpu);
  CHECK(allowed.exit_code == 0);
  REQUIRE(allowed.stderr_lines.size() == 1);
  CHECK(allowed.stderr_lines[0].starts_with(
      "gpunode: agent unreachable at /nonexistent/other/admin.sock: no socket"));
  // Settings that cannot be read: refused, whatever when_agent_down would have said.
  const auto invalid = []() -> gpunode::error::Result<HookSettings> {
    return gpunode::error::fail(gpunode::error::Errc::invalid, "/etc/gpunode/agent.yaml is invalid: x\x1b");
  };
  auto refused = run_libvirt_hook({"vm\n", "prepare", "begin", "-"}, std::nullopt, invalid, gpu);
  CHECK(refused.exit_code == 1);
  CHECK(refused.stderr_lines ==
        std::vector<std::string>{
            "gpunode: domain vm\\x0a refused: /etc/gpunode/agent.yaml is invalid: x\\x1b"});
  CHECK(run_libvirt_hook({"vm"}, nowhere, defaults, gpu).exit_code == 1);  // fails closed
  // More XML than the agent takes: refused whatever when_agent_down says (never judged on a part,
  // and never let through as "agent down"), but only for a call that asks.
  const auto cut = run_libvirt_hook({"vm", "prepare", "begin", "-"}, std::nullopt, allow, "<domain>", true);
  CHECK(cut.exit_code == 1);
  CHECK(cut.stderr_lines ==
        std::vector<std::string>{
            "gpunode: domain vm refused: its XML is larger, over the 16777216 bytes the agent takes"});
  CHECK(run_libvirt_hook({"vm", "stopped", "end", "-"}, std::nullopt, allow, "<domain>", true).exit_code ==
        0);
}
