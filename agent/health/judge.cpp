// How a unit's health is judged (see judge.hpp). Pure functions.
#include "gpunode/health/judge.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "gpunode/reservations/model.hpp"

namespace gpunode::health {
namespace dh = discovery::health;
namespace {

bool latched(std::string_view code) {
  return code == kFatal || code == kUnresponsive;
}

std::size_t rank(std::string_view code) {
  return static_cast<std::size_t>(std::find(kCodes.begin(), kCodes.end(), code) - kCodes.begin());
}

std::uint64_t rises_within(const DeviceState& s, Time now) {
  std::uint64_t sum = 0;
  for (const auto& [at, n] : s.nonfatal_rises) {
    if (at > now - kNonfatalWindow) sum += n;
  }
  return sum;
}

// A count below its baseline: the device was enumerated again (hot reset, remove and rescan, a
// driver's reset) and its counters began at 0. Every count starts over from what it shows now.
bool reenumerated(const DeviceState& s, const DeviceMemo& m, const dh::Counts& c) {
  const auto below = [](const std::optional<std::uint64_t>& base, const std::optional<std::uint64_t>& now) {
    return base && now && *now < *base;
  };
  return below(s.fatal, c.fatal) || below(s.nonfatal, c.nonfatal) || below(m.correctable, c.correctable);
}

// The correctable rate over the last 10 minutes (or more, back to the newest sample at least that
// old): too fast when it passes 8 a minute.
std::optional<std::string> correctable_too_fast(const DeviceMemo& m, Time now) {
  if (m.correctable_at.empty()) return std::nullopt;
  const auto& last = m.correctable_at.back();
  const std::pair<Time, std::uint64_t>* base = nullptr;
  for (const auto& s : m.correctable_at) {
    if (s.first <= now - kCorrectableWindow) base = &s;
  }
  if (base == nullptr || last.second <= base->second) return std::nullopt;
  const auto minutes =
      static_cast<double>(
          std::chrono::duration_cast<std::chrono::seconds>(last.first - base->first).count()) /
      60.0;
  const auto rose = last.second - base->second;
  if (minutes <= 0 || static_cast<double>(rose) <= kCorrectablePerMinute * minutes) return std::nullopt;
  return fmt::format("{} correctable PCIe errors in {:.0f} minutes (more than {} a minute)", rose, minutes,
                     kCorrectablePerMinute);
}

void judge_counts(DeviceVerdict& v, const dh::Counts& c, Time now, std::vector<Finding>& events) {
  DeviceState& s = v.state;
  DeviceMemo& m = v.memo;
  if (reenumerated(s, m, c)) {
    if (c.fatal) s.fatal = c.fatal;
    if (c.nonfatal) s.nonfatal = c.nonfatal;
    m.correctable.reset();
    m.correctable_at.clear();
  }
  if (c.fatal) {
    if (s.fatal && *c.fatal > *s.fatal) {
      v.rises.fatal = *c.fatal - *s.fatal;
      events.push_back(
          {kFatal, fmt::format("fatal PCIe errors rose from {} to {} (aer_dev_fatal)", *s.fatal, *c.fatal)});
    }
    s.fatal = c.fatal;
  }
  if (c.nonfatal) {
    if (s.nonfatal && *c.nonfatal > *s.nonfatal) {
      v.rises.nonfatal = *c.nonfatal - *s.nonfatal;
      s.nonfatal_rises.emplace_back(now, v.rises.nonfatal);
    }
    s.nonfatal = c.nonfatal;
  }
  std::erase_if(s.nonfatal_rises, [&](const auto& r) { return r.first <= now - kNonfatalWindow; });
  while (s.nonfatal_rises.size() > kMaxRises) {  // merge the two oldest: the sum stays, counted longer
    s.nonfatal_rises[1].second += s.nonfatal_rises[0].second;
    s.nonfatal_rises.erase(s.nonfatal_rises.begin());
  }
  if (c.correctable) {
    if (m.correctable && *c.correctable > *m.correctable)
      v.rises.correctable = *c.correctable - *m.correctable;
    m.correctable = c.correctable;
    m.correctable_at.emplace_back(now, *c.correctable);
    // Keep the newest sample at least 10 minutes old and everything after it.
    while (m.correctable_at.size() > 1 && m.correctable_at[1].first <= now - kCorrectableWindow)
      m.correctable_at.pop_front();
    while (m.correctable_at.size() > kMaxSamples) m.correctable_at.pop_front();
  }
}

std::string width_text(int w) {
  return w == 0 ? std::string("down (x0)") : fmt::format("x{}", w);
}

void judge_link(DeviceVerdict& v, const dh::Reading& r, Time now, const Settings& settings) {
  if (r.power != dh::Power::d0 || !r.width) return;  // asleep or unknown: neither good nor bad
  DeviceState& s = v.state;
  DeviceMemo& m = v.memo;
  const int w = r.max_width ? std::min(*r.width, *r.max_width) : *r.width;
  if (w > 0 && (!s.widest || w > *s.widest)) s.widest = w;
  const bool narrow = s.widest && w < *s.widest;
  m.narrow_reads = narrow ? m.narrow_reads + 1 : 0;
  if (!s.degraded_since) {
    if (m.narrow_reads >= kInARow) {
      s.degraded_since = now;
      s.degraded_detail = fmt::format("link {}{} on {} reads in a row in D0, widest seen x{}", width_text(w),
                                      r.speed.empty() ? "" : " at " + r.speed, kInARow, *s.widest);
    }
    return;
  }
  if (narrow) {
    s.back_since.reset();
  } else if (!s.back_since) {
    s.back_since = now;
  }
  if (s.back_since && now - *s.back_since >= settings.recovery) {
    s.degraded_since.reset();
    s.degraded_detail.clear();
    s.back_since.reset();
  }
}

void judge_config(DeviceVerdict& v, const dh::Reading& r, std::vector<Finding>& events) {
  if (r.power != dh::Power::d0 || r.config == dh::ConfigAnswer::not_read) return;
  DeviceMemo& m = v.memo;
  if (r.config == dh::ConfigAnswer::answers) {
    m.unanswered_reads = 0;
    return;
  }
  ++m.unanswered_reads;
  if (m.unanswered_reads < kInARow) return;
  events.push_back(
      {kUnresponsive, r.config == dh::ConfigAnswer::all_ones
                          ? fmt::format("config space read all ones on {} reads in a row in D0", kInARow)
                          : fmt::format("config space could not be read ({}) on {} reads in a row in D0",
                                        r.config_error, kInARow)});
}

}  // namespace

std::vector<Finding> standing(const DeviceState& s, const DeviceMemo& m, const dh::Reading& last,
                              const dh::Target& target, Time now, const Settings& settings) {
  std::vector<Finding> out;
  const auto within = rises_within(s, now);
  if (within >= settings.nonfatal_threshold) {
    out.push_back(
        {kUncorrectable, fmt::format("{} non-fatal PCIe errors within 24 h (health.nonfatal_threshold {}); "
                                     "count {}",
                                     within, settings.nonfatal_threshold, s.nonfatal.value_or(0))});
  }
  if (s.degraded_since) out.push_back({kLinkDegraded, s.degraded_detail});
  if (within > 0 && within < settings.nonfatal_threshold) {
    out.push_back(
        {kNonfatal, fmt::format("{} non-fatal PCIe error{} within 24 h (health.nonfatal_threshold {})",
                                within, within == 1 ? "" : "s", settings.nonfatal_threshold)});
  }
  if (auto fast = correctable_too_fast(m, now)) out.push_back({kCorrectable, *fast});
  if (target.gpu && !last.aer_monitored) {
    out.push_back({kNotMonitored,
                   "no aer_dev_* files: PCIe errors are not counted here (firmware-first AER, or a kernel "
                   "before 4.19)"});
  }
  return out;
}

DeviceVerdict judge_device(const DeviceState& before, const DeviceMemo& memo, const dh::Reading& reading,
                           const dh::Target& target, Time now, const Settings& settings) {
  DeviceVerdict v{before, memo, {}, {}};
  std::vector<Finding> events;  // what happened this poll (fatal rose, config unanswered)
  judge_counts(v, reading.counts, now, events);
  if (target.link_judged) judge_link(v, reading, now, settings);
  if (target.gpu) judge_config(v, reading, events);
  v.findings = standing(v.state, v.memo, reading, target, now, settings);
  v.findings.insert(v.findings.end(), events.begin(), events.end());
  std::stable_sort(v.findings.begin(), v.findings.end(),
                   [](const Finding& a, const Finding& b) { return rank(a.code) < rank(b.code); });
  return v;
}

DeviceState cleared(const dh::Reading& last) {
  DeviceState s;
  s.fatal = last.counts.fatal;
  s.nonfatal = last.counts.nonfatal;
  if (last.power == dh::Power::d0 && last.width && *last.width > 0)
    s.widest = last.max_width ? std::min(*last.width, *last.max_width) : *last.width;
  return s;
}

Verdict judge_unit(const Verdict& before,
                   const std::vector<std::pair<std::string, std::vector<Finding>>>& findings, Time now) {
  std::map<std::pair<std::string, std::string>, std::string> found;  // (code, address) -> detail
  for (const auto& [address, list] : findings) {
    for (const auto& f : list) found.emplace(std::pair(std::string(f.code), address), f.detail);
  }
  Verdict out;
  std::set<std::pair<std::string, std::string>> kept;
  for (const auto& r : before) {
    const auto key = std::pair(r.code, r.pci_address);
    if (latched(r.code) || found.contains(key)) {
      out.push_back(r);
      kept.insert(key);
    }
  }
  for (const auto& [key, detail] : found) {
    if (!kept.contains(key)) out.push_back({key.first, key.second, detail, now});
  }
  std::sort(out.begin(), out.end(), [](const Reason& a, const Reason& b) {
    return std::pair(rank(a.code), a.pci_address) < std::pair(rank(b.code), b.pci_address);
  });
  return out;
}

discovery::UnitHealth at_first_sight(const std::vector<dh::Target>& targets,
                                     const std::vector<dh::Reading>& readings, Time now,
                                     const Settings& settings) {
  std::vector<std::pair<std::string, std::vector<Finding>>> found;
  for (std::size_t i = 0; i < targets.size() && i < readings.size(); ++i)
    found.emplace_back(readings[i].address,
                       judge_device({}, {}, readings[i], targets[i], now, settings).findings);
  return unit_health(judge_unit({}, found, now), settings);
}

bool failing(std::string_view code, const Settings& settings) {
  const bool fails =
      code == kFatal || code == kUncorrectable || code == kUnresponsive || code == kLinkDegraded;
  return fails && std::find(settings.ignore.begin(), settings.ignore.end(), code) == settings.ignore.end();
}

discovery::UnitHealth unit_health(const Verdict& v, const Settings& settings) {
  discovery::UnitHealth h;
  for (const auto& r : v) {
    h.reasons.push_back(
        {r.code, r.pci_address, r.detail, reservations::format_time(r.since), failing(r.code, settings)});
  }
  return h;
}

bool reportable(const Verdict& before, const Verdict& after, const Settings& settings) {
  const auto failing_keys = [&](const Verdict& v) {
    std::set<std::pair<std::string, std::string>> out;
    for (const auto& r : v) {
      if (failing(r.code, settings)) out.emplace(r.code, r.pci_address);
    }
    return out;
  };
  return unit_health(before, settings).state() != unit_health(after, settings).state() ||
         failing_keys(before) != failing_keys(after);
}

}  // namespace gpunode::health
