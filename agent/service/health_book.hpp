// Unit health as the service keeps it (CONTRACT §13), private to gpunode_service: what the store
// holds (each function's DeviceState, each unit's Verdict), what this run keeps beside it (the
// memos, the last readings, the increases seen for /metrics), and the functions each present unit
// is judged on. Core thread only, like the rest of NodeService::Impl. Bounded by the units and
// their functions: rows of functions no unit is judged on any more are deleted with the next
// change, memos and readings are rebuilt with the targets.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/config/config.hpp"
#include "gpunode/discovery/health.hpp"
#include "gpunode/discovery/model.hpp"
#include "gpunode/health/judge.hpp"
#include "inventory.hpp"
#include "state_store.hpp"

namespace gpunode::service::detail {

struct HealthBook {
  bool enabled = false;
  health::Settings settings;
  std::map<std::string, health::DeviceState, std::less<>> devices;  // as stored, by PCI address
  std::map<std::string, health::Verdict, std::less<>> verdicts;     // as stored, by unit id
  std::map<std::string, health::DeviceMemo, std::less<>> memos;     // this run's, by PCI address

  // The functions judged: the reader's targets, which of them each present unit is judged on, and
  // the membership they were built for (rebuilt when a scan changes it).
  std::unique_ptr<discovery::health::Reader> reader;
  std::map<std::string, std::vector<std::size_t>, std::less<>> unit_targets;  // unit id -> target indexes
  std::string built_for;
  std::vector<discovery::health::Reading> last;  // the last poll's, by target index
  std::optional<health::Time> polled_at;
  // gpunode_pcie_errors_total: increases seen since the agent started, per (unit, address), in the
  // order fatal, nonfatal, correctable.
  std::map<std::pair<std::string, std::string>, std::array<std::uint64_t, 3>> errors_seen;

  // The unit JSON's health of `unit_id` (CONTRACT §13), from its stored reasons.
  [[nodiscard]] discovery::UnitHealth unit_health(std::string_view unit_id) const;
  // Memory follows a commit: the rows written become what is kept.
  void follow(const HealthRows& rows);
  // The reading of `address` in the last poll, if it was read.
  [[nodiscard]] const discovery::health::Reading* last_reading(std::string_view address) const;
};

// Puts into `c` what `rows` changes (HealthRows): the rows, each changed present unit's stored JSON
// with the inventory's new digest, and a unit.health event for each unit whose state or failing
// reasons changed (CONTRACT §6, §13); returns a log line for each such unit. `inventory` and
// `book` are as they are before the change.
std::vector<std::pair<config::LogLevel, std::string>> add_health_change(Change& c, HealthRows rows,
                                                                        const Inventory& inventory,
                                                                        const HealthBook& book);

}  // namespace gpunode::service::detail
