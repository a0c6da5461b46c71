// The node's reservations not ended, in id order: the core thread's one copy of them (private to
// gpunode_service). Ended ones stay on disk (StateStore::reservation, reservations_after): memory
// grows with what is live, not with history (CONTRACT §11). A sorted vector of shared, immutable
// reservations: the rules read it as a list (reservations::ReservationsView), a snapshot copies its
// pointers and shares the reservations themselves, and a change replaces one pointer (a new id is
// the newest, so a create appends). Its OrgIndex answers "which orgs see the node" by lookup.
#pragma once

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "gpunode/reservations/model.hpp"

namespace gpunode::service::detail {

class ReservationTable {
 public:
  using List = std::vector<reservations::SharedReservation>;
  using const_iterator = reservations::ReservationsView::iterator;

  [[nodiscard]] reservations::ReservationsView all() const { return {list_, &orgs_}; }
  [[nodiscard]] const_iterator begin() const { return all().begin(); }
  [[nodiscard]] const_iterator end() const { return all().end(); }
  [[nodiscard]] std::size_t size() const { return list_.size(); }

  [[nodiscard]] const reservations::Reservation* find(std::string_view id) const {
    auto at = lower(id);
    return at != list_.end() && (*at)->id == id ? at->get() : nullptr;
  }
  // The reservation with this id, which must be here (as std::map::at: std::out_of_range if not).
  [[nodiscard]] const reservations::Reservation& at(std::string_view id) const {
    if (const auto* x = find(id)) return *x;
    throw std::out_of_range("no such reservation");
  }
  // From the first reservation after `id` in id order (where a page that ended at `id` goes on).
  [[nodiscard]] reservations::ReservationsView after(std::string_view id) const {
    auto from = std::upper_bound(list_.begin(), list_.end(), id,
                                 [](std::string_view v, const auto& x) { return v < x->id; });
    return std::span<const reservations::SharedReservation>(from, list_.end());
  }
  // Stores `x` in place of the reservation with its id, or adds it.
  void put(const reservations::Reservation& x) {
    auto shared = std::make_shared<const reservations::Reservation>(x);
    auto at = lower(x.id);
    orgs_.add(x);
    if (at != list_.end() && (*at)->id == x.id) {
      orgs_.remove(**at);
      list_[static_cast<std::size_t>(at - list_.begin())] = std::move(shared);
    } else {
      list_.insert(at, std::move(shared));
    }
  }
  // Drops the reservation with this id (it ended); whether it was here.
  bool erase(std::string_view id) {
    auto at = lower(id);
    if (at == list_.end() || (*at)->id != id) return false;
    orgs_.remove(**at);
    list_.erase(at);
    return true;
  }
  void assign(List sorted) {
    list_ = std::move(sorted);
    orgs_ = {};
    for (const auto& x : list_) orgs_.add(*x);
  }

 private:
  [[nodiscard]] List::const_iterator lower(std::string_view id) const {
    return std::lower_bound(list_.begin(), list_.end(), id,
                            [](const auto& x, std::string_view v) { return x->id < v; });
  }
  List list_;
  reservations::OrgIndex orgs_;  // of list_, kept by put, erase and assign
};

}  // namespace gpunode::service::detail
