// The node's reservations not ended, in id order: the core thread's one copy of them (private to
// gpunode_service). Ended ones stay on disk (StateStore::reservation, reservations_after): memory
// grows with what is live, not with history (CONTRACT §11). A sorted vector, so that the rules, which read a
// list, read it as it is, and a snapshot copies it in one pass; a change moves the tail (a new id is the
// newest, so a create appends).
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "gpunode/reservations/model.hpp"

namespace gpunode::service::detail {

class ReservationTable {
 public:
  using List = std::vector<reservations::Reservation>;

  [[nodiscard]] const List& all() const { return list_; }
  [[nodiscard]] List::const_iterator begin() const { return list_.begin(); }
  [[nodiscard]] List::const_iterator end() const { return list_.end(); }
  [[nodiscard]] std::size_t size() const { return list_.size(); }

  [[nodiscard]] const reservations::Reservation* find(std::string_view id) const {
    auto at = lower(id);
    return at != list_.end() && at->id == id ? &*at : nullptr;
  }
  // The reservation with this id, which must be here (as std::map::at: std::out_of_range if not).
  [[nodiscard]] const reservations::Reservation& at(std::string_view id) const {
    if (const auto* x = find(id)) return *x;
    throw std::out_of_range("no such reservation");
  }
  // The first reservation after `id` in id order (where a page that ended at `id` goes on).
  [[nodiscard]] List::const_iterator after(std::string_view id) const {
    return std::upper_bound(list_.begin(), list_.end(), id,
                            [](std::string_view v, const reservations::Reservation& x) { return v < x.id; });
  }
  // Stores `x` in place of the reservation with its id, or adds it.
  void put(const reservations::Reservation& x) {
    auto at = lower(x.id);
    if (at != list_.end() && at->id == x.id)
      list_[static_cast<std::size_t>(at - list_.begin())] = x;
    else
      list_.insert(at, x);
  }
  // Drops the reservation with this id (it ended); whether it was here.
  bool erase(std::string_view id) {
    auto at = lower(id);
    if (at == list_.end() || at->id != id) return false;
    list_.erase(at);
    return true;
  }
  void assign(List sorted) { list_ = std::move(sorted); }

 private:
  [[nodiscard]] List::const_iterator lower(std::string_view id) const {
    return std::lower_bound(list_.begin(), list_.end(), id,
                            [](const reservations::Reservation& x, std::string_view v) { return x.id < v; });
  }
  List list_;
};

}  // namespace gpunode::service::detail
