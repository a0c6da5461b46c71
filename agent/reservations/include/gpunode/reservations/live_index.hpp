// gpunode/reservations/live_index.hpp: the reservations not ended, by unit and start, so that an
// overlap check looks at the few whose terms can meet the candidate's instead of every one the
// unit holds (a unit reserved hour by hour a year ahead holds thousands).
#pragma once

#include <chrono>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpunode/reservations/model.hpp"

namespace gpunode::reservations {

class LiveIndex {
 public:
  // Follows one reservation's change: `before` as it was (nullptr if new), `after` as it is now
  // (nullptr if gone). Ended reservations are not kept.
  void follow(const Reservation* before, const Reservation* after);
  void clear() { units_.clear(); }

  // The ids of the live reservations on any of `units` whose terms may meet [starts, ends):
  // every one that does, and perhaps a few that do not (blocking_reservations decides), each
  // once, sorted. The views last until the next follow() or clear().
  std::vector<std::string_view> near(std::span<const std::string> units, Time starts, Time ends) const;

  std::size_t size(std::string_view unit) const;  // live reservations holding `unit`

 private:
  struct OnUnit {
    std::map<std::pair<Time, std::string>, std::chrono::seconds> by_start;  // (starts_at, id) → length
    // The lengths of those terms: a term that meets [S, E) starts after S minus the longest.
    std::multiset<std::chrono::seconds> lengths;
  };
  std::map<std::string, OnUnit, std::less<>> units_;
};

}  // namespace gpunode::reservations
