// gpunodectl's `health` and `health clear` (see health.hpp).
#include "health.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <boost/json/serialize.hpp>

#include "gpunode/ctl/model.hpp"
#include "gpunode/text/printable.hpp"

namespace gpunode::ctl {

void health_arguments(CLI::App& health, HealthArgs& a) {
  health.add_option("UNIT", a.unit, "Only this unit");
  auto* clear = health.add_subcommand(
      "clear", "Clear a unit's health: its reasons go, its counters and link widths begin again (audited)");
  clear->add_option("UNIT", a.clear, "The unit")->required();
  clear->add_option("--reason", a.reason, "Why (kept in the audit log)")->required();
}

Result health_command(const HealthCall& call, const CLI::App& cmd, const HealthArgs& a, bool json,
                      const Style& style) {
  const bool clearing = cmd.got_subcommand("clear");
  const auto answer = call(
      clearing ? health_clear_request(a.clear, a.reason)
               : health_request(a.unit.empty() ? std::nullopt : std::optional<std::string_view>(a.unit)));
  if (!answer)
    return Result{answer.error().exit_code,
                  json && !answer.error().body.empty() ? answer.error().body + "\n" : "",
                  answer.error().message};
  if (json) return Result{kExitOk, answer->raw + "\n", {}};
  if (clearing) {  // the unit, as GET units shows it
    auto state = decode_state(boost::json::object{{"units", boost::json::array{answer->doc}}});
    if (!state || state->units.size() != 1)
      return Result{kExitProblem,
                    {},
                    fmt::format("gpunodectl: bad-answer: {}\n", state ? "no unit" : state.error().detail)};
    const auto& u = state->units.front();
    std::string out = fmt::format("{}: health cleared; now {}\n", u.id, u.health.state);
    for (const auto& r : u.health.reasons)
      out += fmt::format("  {} on {}: {}\n", r.code, r.pci_address, r.detail);
    return Result{kExitOk, out, {}};
  }
  auto units = decode_health(answer->doc);
  if (!units)
    return Result{kExitProblem, {}, fmt::format("gpunodectl: bad-answer: {}\n", units.error().detail)};
  return Result{kExitOk, render_health(*units, style), {}};
}

}  // namespace gpunode::ctl
