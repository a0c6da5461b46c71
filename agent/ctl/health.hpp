// gpunodectl's `health [UNIT]` and `health clear UNIT --reason TEXT` (CONTRACT §8, §13), private to
// gpunode::ctl: app.cpp parses their options and hands them a way to call the agent.
#pragma once

#include <expected>
#include <functional>
#include <string>

#include "gpunode/ctl/app.hpp"
#include "gpunode/ctl/paging.hpp"
#include "gpunode/ctl/render.hpp"

namespace CLI {
class App;
}

namespace gpunode::ctl {

struct HealthArgs {
  std::string unit;    // health UNIT ("": every unit)
  std::string clear;   // health clear UNIT
  std::string reason;  // health clear --reason
};

// `health`'s positional UNIT and its subcommand clear, their options into `a`.
void health_arguments(CLI::App& health, HealthArgs& a);

// One call to the agent, its answer parsed.
using HealthCall = std::function<std::expected<Page, Failure>(const Request&)>;

// health: the table (or with --json the route's body); health clear: the unit's health after it.
Result health_command(const HealthCall& call, const CLI::App& cmd, const HealthArgs& a, bool json,
                      const Style& style);

}  // namespace gpunode::ctl
