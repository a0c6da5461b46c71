#include "gpunode/reservations/live_index.hpp"

#include <algorithm>

namespace gpunode::reservations {

void LiveIndex::follow(const Reservation* before, const Reservation* after) {
  if (before != nullptr && !before->ended()) {
    for (const auto& u : before->unit_ids) {
      auto it = units_.find(u);
      if (it == units_.end()) continue;
      OnUnit& on = it->second;
      auto entry = on.by_start.find({before->starts_at, before->id});
      if (entry == on.by_start.end()) continue;
      on.lengths.erase(on.lengths.find(entry->second));  // there, as by_start's entry is
      on.by_start.erase(entry);
      if (on.by_start.empty()) units_.erase(it);
    }
  }
  if (after != nullptr && !after->ended()) {
    const auto length = std::max(std::chrono::seconds{0}, after->ends_at - after->starts_at);
    for (const auto& u : after->unit_ids) {
      auto& on = units_[u];
      if (on.by_start.emplace(std::pair{after->starts_at, after->id}, length).second)
        on.lengths.insert(length);
    }
  }
}

std::vector<std::string_view> LiveIndex::near(std::span<const std::string> units, Time starts,
                                              Time ends) const {
  std::vector<std::string_view> out;
  for (const auto& u : units) {
    const auto it = units_.find(u);
    if (it == units_.end()) continue;
    const OnUnit& on = it->second;
    // A unit is kept only while it holds a term, so `lengths` is not empty. Seconds in 64 bits: no
    // stored term comes near overflowing them.
    const Time from = starts - *on.lengths.rbegin();
    for (auto x = on.by_start.lower_bound(std::pair{from, std::string()});
         x != on.by_start.end() && x->first.first < ends; ++x) {
      out.emplace_back(x->first.second);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::size_t LiveIndex::size(std::string_view unit) const {
  const auto it = units_.find(unit);
  return it == units_.end() ? 0 : it->second.by_start.size();
}

}  // namespace gpunode::reservations
