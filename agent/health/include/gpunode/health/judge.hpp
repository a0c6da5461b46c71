// gpunode/health/judge.hpp: how a unit's health is judged (CONTRACT §13). Pure functions over plain
// data: what discovery read this poll (discovery::health::Reading), what the agent keeps of each
// function across restarts (DeviceState, in the state database) and while it runs (DeviceMemo), and
// the unit's reasons as last judged (Verdict). No I/O, no clock: tests/health tables the cases.
//
// The field's false positives, each a rule here: counts found at first sight are the baseline, never
// an alarm; a count below its baseline is a re-enumerated device (a new baseline); link and config
// are judged only in D0 (a sleeping GPU's link reads Unknown/63 and its config all ones); the link's
// speed is never judged (idle GPUs drop to 2.5 GT/s); a file that cannot be read is unknown this
// poll, neither good nor bad, except config for a D0 gpu.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpunode/discovery/health.hpp"
#include "gpunode/discovery/model.hpp"

namespace gpunode::health {

using Time = std::chrono::sys_seconds;

// The codes, failing ones first (discovery::kHealthFailingCodes' order), then the warnings.
inline constexpr std::string_view kFatal = "pcie-fatal-error";
inline constexpr std::string_view kUncorrectable = "pcie-uncorrectable-errors";
inline constexpr std::string_view kUnresponsive = "device-unresponsive";
inline constexpr std::string_view kLinkDegraded = "link-degraded";
inline constexpr std::string_view kNonfatal = "pcie-nonfatal-error";
inline constexpr std::string_view kCorrectable = "pcie-correctable-errors";
inline constexpr std::string_view kNotMonitored = "aer-not-monitored";
inline constexpr std::array<std::string_view, 7> kCodes = {
    kFatal, kUncorrectable, kUnresponsive, kLinkDegraded, kNonfatal, kCorrectable, kNotMonitored};

// How many reads in a row make link-degraded and device-unresponsive; how fast correctable errors
// may come (DCGM's PCIe watch: 8 a minute over 10 minutes); how long non-fatal errors count.
inline constexpr int kInARow = 3;
inline constexpr std::uint64_t kCorrectablePerMinute = 8;
inline constexpr std::chrono::minutes kCorrectableWindow{10};
inline constexpr std::chrono::hours kNonfatalWindow{24};
// Bounds: non-fatal rises kept per function (beyond it the two oldest merge, which can only make a
// rise count longer), correctable samples kept per function.
inline constexpr std::size_t kMaxRises = 64;
inline constexpr std::size_t kMaxSamples = 128;

// health.* of agent.yaml.
struct Settings {
  std::uint64_t nonfatal_threshold = 3;
  std::chrono::seconds recovery{600};
  std::vector<std::string> ignore;  // failing codes shown as warnings instead
};

// What the agent keeps of one function across restarts.
struct DeviceState {
  std::optional<std::uint64_t> fatal,
      nonfatal;               // the counts last judged: the baseline increases are judged over
  std::optional<int> widest;  // the widest link width seen in D0 (at most max_link_width)
  std::vector<std::pair<Time, std::uint64_t>> nonfatal_rises;  // within 24 h, oldest first
  std::optional<Time> degraded_since;                          // link-degraded holds since then
  std::string degraded_detail;                                 // what was seen then
  std::optional<Time> back_since;  // degraded, and back at the widest width since then
  bool operator==(const DeviceState&) const = default;
};

// What the agent keeps of one function while it runs (a restart begins these again).
struct DeviceMemo {
  int narrow_reads = 0;                      // in a row, in D0, below the widest width
  int unanswered_reads = 0;                  // config reads in a row, in D0, that read all ones or failed
  std::optional<std::uint64_t> correctable;  // the last count seen
  std::deque<std::pair<Time, std::uint64_t>>
      correctable_at;  // (when, count), the last 10 minutes and one before
};

// A reason that applies to one function now.
struct Finding {
  std::string_view code;
  std::string detail;
  bool operator==(const Finding&) const = default;
};

// Increases seen this poll (gpunode_pcie_errors_total).
struct Rises {
  std::uint64_t fatal = 0, nonfatal = 0, correctable = 0;
};

struct DeviceVerdict {
  DeviceState state;
  DeviceMemo memo;
  std::vector<Finding> findings;  // one per code at most, in kCodes' order
  Rises rises;
};

// One poll of one function: its reading judged against what is kept of it.
DeviceVerdict judge_device(const DeviceState& before, const DeviceMemo& memo,
                           const discovery::health::Reading& reading, const discovery::health::Target& target,
                           Time now, const Settings& settings);

// What an operator's clear leaves of a function: its last reading's counts as the baseline and its
// width (read in D0) as the widest, nothing degraded, no rises; the memo begun again.
DeviceState cleared(const discovery::health::Reading& last);
// The reasons a function's state and last reading give without a new read (after a clear).
std::vector<Finding> standing(const DeviceState& state, const DeviceMemo& memo,
                              const discovery::health::Reading& last, const discovery::health::Target& target,
                              Time now, const Settings& settings);

// A unit's reasons, sorted by code (kCodes' order), then address.
struct Reason {
  std::string code, pci_address, detail;
  Time since;
  bool operator==(const Reason&) const = default;
};
using Verdict = std::vector<Reason>;

// The unit's reasons now, from `before` and each of its functions' findings (address, findings):
// pcie-fatal-error and device-unresponsive stay once found (latched, until a clear); every other
// reason stays while its finding holds; a reason that stays keeps its detail and since, a new one
// is since `now`.
Verdict judge_unit(const Verdict& before,
                   const std::vector<std::pair<std::string, std::vector<Finding>>>& findings, Time now);

// A unit's health from one read with nothing kept: what a first poll says (discover's health).
discovery::UnitHealth at_first_sight(const std::vector<discovery::health::Target>& targets,
                                     const std::vector<discovery::health::Reading>& readings, Time now,
                                     const Settings& settings);

// Whether `code` fails a unit under `settings` (a failing code not in health.ignore).
bool failing(std::string_view code, const Settings& settings);
// The unit JSON's health (CONTRACT §13).
discovery::UnitHealth unit_health(const Verdict& v, const Settings& settings);
// Whether going from `before` to `after` is a unit.health event: the state or the failing reasons changed.
bool reportable(const Verdict& before, const Verdict& after, const Settings& settings);

}  // namespace gpunode::health
