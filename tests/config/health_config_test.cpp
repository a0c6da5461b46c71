// health.* of agent.yaml (CONTRACT §2, §13): defaults, values, and every bad value at its position.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "gpunode/config/config.hpp"

using gpunode::config::load_file;
using gpunode::config::load_string;
using gpunode::config::LoadResult;
using gpunode::config::Purpose;
using namespace std::chrono_literals;

namespace {

std::string problems_of(const std::string& yaml) {
  std::string out;
  for (const auto& p : load_string(yaml, "agent.yaml", Purpose::discover).problems)
    out += p.to_string() + "\n";
  return out;
}

}  // namespace

TEST_CASE("health: the contract's example and the defaults") {
  const LoadResult r =
      load_file(std::string(GPUNODE_CONFIG_TEST_DATA) + "/contract_example.yaml", Purpose::run);
  REQUIRE(r.ok());
  const auto& h = r.config.health;
  CHECK(h.enabled);
  CHECK(h.interval == 30s);
  CHECK(h.recovery == 10min);
  CHECK(h.nonfatal_threshold == 3);
  CHECK(h.ignore.empty());
  const LoadResult empty = load_string("", "agent.yaml", Purpose::discover);
  REQUIRE(empty.ok());
  CHECK(empty.config.health.enabled);
  CHECK(empty.config.health.interval == 30s);
  CHECK(empty.config.health.recovery == 10min);
}

TEST_CASE("health: values other than the defaults") {
  const LoadResult r = load_string(
      "health:\n  enabled: false\n  interval: 5s\n  recovery: 0s\n  nonfatal_threshold: 10\n"
      "  ignore: [link-degraded, pcie-uncorrectable-errors]\n",
      "agent.yaml", Purpose::discover);
  REQUIRE(r.ok());
  CHECK_FALSE(r.config.health.enabled);
  CHECK(r.config.health.interval == 5s);
  CHECK(r.config.health.recovery == 0s);
  CHECK(r.config.health.nonfatal_threshold == 10);
  CHECK(r.config.health.ignore == std::vector<std::string>{"link-degraded", "pcie-uncorrectable-errors"});
}

TEST_CASE("health: each bad value at its FILE:LINE:COLUMN") {
  CHECK(problems_of("health:\n  enabled: yes\n  interval: 500ms\n  recovery: 25h\n") ==
        "agent.yaml:2:12: invalid value \"yes\" for health.enabled: expected true or false\n"
        "agent.yaml:3:13: invalid value \"500ms\" for health.interval: must be from 1s to 1h\n"
        "agent.yaml:4:13: invalid value \"25h\" for health.recovery: must be from 0s to 24h\n");
  CHECK(problems_of("health: {nonfatal_threshold: 0, interval: 2h}\n") ==
        "agent.yaml:1:30: invalid value \"0\" for health.nonfatal_threshold: a threshold is a whole number "
        "from 1 "
        "to 1000000\n"
        "agent.yaml:1:43: invalid value \"2h\" for health.interval: must be from 1s to 1h\n");
  CHECK(problems_of("health:\n  ignore: [aer-not-monitored, link-degraded]\n") ==
        "agent.yaml:2:12: invalid entry \"aer-not-monitored\" in health.ignore: expected a failing code: "
        "pcie-fatal-error, pcie-uncorrectable-errors, device-unresponsive or link-degraded\n");
  CHECK(problems_of("health:\n  intervall: 30s\n") ==
        "agent.yaml:2:3: unknown key \"intervall\" in health (did you mean \"interval\"?)\n");
  CHECK(problems_of("health: on\n") == "agent.yaml:1:9: health must be a mapping, not a scalar\n");
}

TEST_CASE("health: a changed key needs a restart") {
  const auto a = load_string("", "agent.yaml", Purpose::discover).config;
  auto b = a;
  b.health.ignore = {"link-degraded"};
  b.health.interval = 10s;
  CHECK(gpunode::config::keys_needing_restart(a, b) ==
        std::vector<std::string>{"health.interval", "health.ignore"});
}
