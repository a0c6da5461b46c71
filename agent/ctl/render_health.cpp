// `gpunodectl health` for people (CONTRACT §8, §13): a table of the functions each unit is judged on,
// then the reasons in full.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpunode/ctl/render.hpp"

namespace gpunode::ctl {
namespace {

std::string state_text(const std::string& state, const Style& style) {
  if (state == "failing") return style.paint("1;31", state);
  if (state == "warning") return style.paint("33", state);
  return style.paint("32", state);
}

std::string link_text(const HealthDevice& d) {
  if (!d.link_width) return "-";
  std::string out = fmt::format("x{}", *d.link_width);
  if (d.widest_link_width && *d.widest_link_width != *d.link_width)
    out += fmt::format(" (widest x{})", *d.widest_link_width);
  else if (d.max_link_width && *d.max_link_width != *d.link_width)
    out += fmt::format(" (max x{})", *d.max_link_width);
  return out;
}

std::string aer_text(const HealthDevice& d) {
  if (!d.aer) return "not monitored";
  std::vector<std::string> parts;
  for (const auto& n : *d.aer) parts.push_back(n ? std::to_string(*n) : "?");
  return fmt::format("{}", fmt::join(parts, "/"));
}

}  // namespace

std::string render_health(const std::vector<UnitHealthView>& units, const Style& style) {
  std::vector<std::vector<std::string>> rows;
  std::string reasons;
  for (const auto& u : units) {
    std::vector<std::string> codes;
    for (const auto& r : u.health.reasons) {
      if (std::find(codes.begin(), codes.end(), r.code) == codes.end()) codes.push_back(r.code);
      reasons +=
          fmt::format("{}: {} on {} since {}: {}\n", u.unit_id, r.code, r.pci_address, r.since, r.detail);
    }
    const std::string why = codes.empty() ? "-" : fmt::format("{}", fmt::join(codes, ","));
    if (u.devices.empty())
      rows.push_back({u.unit_id, state_text(u.health.state, style), why, "-", "", "", "", "", ""});
    for (std::size_t i = 0; i < u.devices.size(); ++i) {
      const auto& d = u.devices[i];
      const bool first = i == 0;
      rows.push_back({first ? u.unit_id : "", first ? state_text(u.health.state, style) : "",
                      first ? why : "", d.pci_address, d.role, d.power_state.value_or("-"), link_text(d),
                      d.link_speed.value_or("-"), aer_text(d)});
    }
  }
  if (units.empty()) return "no GPU units\n";
  std::string out =
      table({"UNIT", "STATE", "REASONS", "FUNCTION", "ROLE", "POWER", "LINK", "SPEED", "AER F/NF/COR"}, rows,
            style);
  if (!reasons.empty()) out += "\n" + reasons;
  return out;
}

}  // namespace gpunode::ctl
