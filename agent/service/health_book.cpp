// Unit health as the service keeps it (see health_book.hpp), and what a change of it writes.
#include "health_book.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "decision.hpp"
#include "gpunode/discovery/json.hpp"
#include "gpunode/text/printable.hpp"

namespace gpunode::service::detail {

discovery::UnitHealth HealthBook::unit_health(std::string_view unit_id) const {
  const auto v = verdicts.find(unit_id);
  return v == verdicts.end() ? discovery::UnitHealth{} : health::unit_health(v->second, settings);
}

void HealthBook::follow(const HealthRows& rows) {
  for (const auto& [address, state] : rows.devices) devices.insert_or_assign(address, state);
  for (const auto& address : rows.devices_gone) devices.erase(address);
  for (const auto& [unit, verdict] : rows.units) verdicts.insert_or_assign(unit, verdict);
  for (const auto& address : rows.restart) memos.erase(address);
}

const discovery::health::Reading* HealthBook::last_reading(std::string_view address) const {
  for (const auto& r : last) {
    if (r.address == address) return &r;
  }
  return nullptr;
}

namespace {

// One line for the log about a unit whose health changed (text from sysfs escaped).
std::pair<config::LogLevel, std::string> health_line(const std::string& unit,
                                                     const discovery::UnitHealth& h) {
  std::vector<std::string> why;
  for (const auto& r : h.reasons) why.push_back(fmt::format("{} on {}: {}", r.code, r.pci_address, r.detail));
  const auto state = h.state();
  return {state == discovery::HealthState::failing ? config::LogLevel::warning : config::LogLevel::info,
          text::printable(fmt::format("UNIT={} health {}{}{}", unit, discovery::to_string(state),
                                      why.empty() ? "" : ": ", fmt::join(why, "; ")))};
}

}  // namespace

std::vector<std::pair<config::LogLevel, std::string>> add_health_change(Change& c, HealthRows rows,
                                                                        const Inventory& inventory,
                                                                        const HealthBook& book) {
  std::vector<std::pair<config::LogLevel, std::string>> said;
  std::map<std::string, const health::Verdict*, std::less<>> changed;
  for (const auto& [unit, verdict] : rows.units) changed.emplace(unit, &verdict);
  if (!changed.empty()) {
    const auto next = inventory.with_health([&](std::string_view id) {
      const auto v = changed.find(id);
      return v == changed.end() ? book.unit_health(id) : health::unit_health(*v->second, book.settings);
    });
    for (const auto& [unit, verdict] : changed) {
      const auto kept = book.verdicts.find(unit);
      const health::Verdict before = kept == book.verdicts.end() ? health::Verdict{} : kept->second;
      const auto after = health::unit_health(*verdict, book.settings);
      if (const auto* u = next.find(unit))
        c.units.push_back({unit, {json::serialize(discovery::unit_to_json(*u)), false}});
      if (!health::reportable(before, *verdict, book.settings)) continue;
      auto doc = discovery::health_to_json(after);
      c.events.push_back(EventDraft{
          "unit.health",
          json::object{{"unitId", unit}, {"state", doc["state"]}, {"reasons", std::move(doc["reasons"])}}});
      said.push_back(health_line(unit, after));
    }
    if (!c.units.empty()) c.inventory_digest = next.digest();
  }
  c.health = std::move(rows);
  return said;
}

}  // namespace gpunode::service::detail
