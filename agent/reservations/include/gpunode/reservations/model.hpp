// gpunode/reservations/model.hpp: reservations and callers as plain data (CONTRACT §4). No I/O.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace gpunode::reservations {

using Time = std::chrono::sys_seconds;  // the API speaks RFC 3339 UTC to the second

// The instants the agent takes, from 1970-01-01T00:00:00Z to 2199-12-31T23:59:59Z. The clock it
// compares them with, and the timers it arms for them, count nanoseconds in 64 bits, which end in
// 2262: a later time overflowed there (found by tests/fuzz/http_request: an endsAt in 4054). The
// margin keeps a term plus a grace or a retention far from that end.
inline constexpr Time kEarliestTime{std::chrono::sys_days{std::chrono::year{1970} / 1 / 1}};
inline constexpr Time kLatestTime{std::chrono::sys_days{std::chrono::year{2200} / 1 / 1} -
                                  std::chrono::seconds{1}};

// "2027-01-31T00:00:00Z"; fractions of a second are accepted on input and dropped. Nothing
// outside [kEarliestTime, kLatestTime].
std::optional<Time> parse_time(std::string_view text);
// Any Time (the civil date, never through the clock's nanoseconds).
std::string format_time(Time t);

enum class State { scheduled, active, ended };
enum class EndReason { ended_early, term_expired };

std::string_view to_string(State state);
std::optional<State> parse_state(std::string_view text);
std::string_view to_string(EndReason reason);

struct Reservation {
  std::string id;  // rsv_...
  std::string node_id;
  std::vector<std::string> unit_ids;
  std::vector<std::string> audience_org_ids;
  std::vector<std::string> managing_org_ids;
  Time starts_at{};
  Time ends_at{};  // the term is [starts_at, ends_at)
  State state = State::scheduled;
  std::optional<Time> ended_at;
  std::optional<EndReason> end_reason;
  std::vector<std::string> released_unit_ids;
  std::vector<std::string> reclaiming_unit_ids;
  std::string note;
  Time created_at{};
  Time updated_at{};
  std::int64_t version = 1;

  [[nodiscard]] bool holds_unit(std::string_view unit_id) const;
  [[nodiscard]] bool ended() const { return state == State::ended; }
};

// A reservation as the service keeps it: an immutable value its table and every snapshot it
// publishes share, so that publishing a state copies pointers, not reservations. A change
// replaces the value; nothing edits one in place.
using SharedReservation = std::shared_ptr<const Reservation>;

// Which orgs manage, or are in the audience of, a reservation not ended of a list: what "sees the
// node" asks of every request (CONTRACT §4 Relations), answered by one lookup rather than a scan of
// the reservations, so that it costs the same for an org that sees the node, one that does not and
// a node id that is not this node (CONTRACT §10 "Hiding includes time"). Kept in step with its list
// by the list's owner (add before a reservation joins, remove before it leaves or changes).
class OrgIndex {
 public:
  struct Relations {
    bool manager = false;
    bool audience = false;
  };
  [[nodiscard]] Relations of(std::string_view org) const;
  void add(const Reservation& x);     // counts x's orgs, unless x has ended
  void remove(const Reservation& x);  // what add(x) counted
  [[nodiscard]] std::size_t orgs() const { return counts_.size(); }
  bool operator==(const OrgIndex&) const = default;

 private:
  struct Counts {
    std::size_t managing = 0, audience = 0;
    bool operator==(const Counts&) const = default;
  };
  std::map<std::string, Counts, std::less<>> counts_;
};

// A list of reservations as the rules read it, without a copy: a contiguous run of reservations
// (a vector, as the tests build them) or of shared ones (the service's table), iterated in order
// as `const Reservation&`, and the OrgIndex of the whole list when its owner keeps one. It lasts as
// long as what it views.
class ReservationsView {
 public:
  class iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = Reservation;
    using difference_type = std::ptrdiff_t;
    using pointer = const Reservation*;
    using reference = const Reservation&;

    iterator() = default;
    reference operator*() const { return shared_ != nullptr ? **shared_ : *plain_; }
    pointer operator->() const { return &**this; }
    iterator& operator++() {
      if (shared_ != nullptr)
        ++shared_;
      else
        ++plain_;
      return *this;
    }
    iterator operator++(int) {
      auto was = *this;
      ++*this;
      return was;
    }
    bool operator==(const iterator&) const = default;

   private:
    friend class ReservationsView;
    iterator(const Reservation* plain, const SharedReservation* shared) : plain_(plain), shared_(shared) {}
    const Reservation* plain_ = nullptr;
    const SharedReservation* shared_ = nullptr;
  };

  ReservationsView() = default;
  ReservationsView(std::span<const Reservation> plain) : plain_(plain.data()), size_(plain.size()) {}
  ReservationsView(const std::vector<Reservation>& plain)
      : ReservationsView(std::span<const Reservation>(plain)) {}
  ReservationsView(std::span<const SharedReservation> shared)
      : shared_(shared.data()), size_(shared.size()) {}
  ReservationsView(const std::vector<SharedReservation>& shared)
      : ReservationsView(std::span<const SharedReservation>(shared)) {}
  ReservationsView(std::span<const SharedReservation> shared, const OrgIndex* orgs)
      : shared_(shared.data()), size_(shared.size()), orgs_(orgs) {}

  // The index of exactly these reservations, or nullptr (a part of a list, a list without one).
  [[nodiscard]] const OrgIndex* orgs() const { return orgs_; }

  [[nodiscard]] iterator begin() const { return at(0); }
  [[nodiscard]] iterator end() const { return at(size_); }
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] bool empty() const { return size_ == 0; }

 private:
  [[nodiscard]] iterator at(std::size_t i) const {
    return shared_ != nullptr ? iterator(nullptr, shared_ + i)
                              : iterator(plain_ == nullptr ? nullptr : plain_ + i, nullptr);
  }
  const Reservation* plain_ = nullptr;
  const SharedReservation* shared_ = nullptr;
  std::size_t size_ = 0;
  const OrgIndex* orgs_ = nullptr;
};

// Who is calling, as the token (or the admin socket) says.
struct Caller {
  std::string sub;
  std::optional<std::string> org;
  std::vector<std::string> roles;  // platform-admin, platform-operator
  std::string via;                 // https | admin-socket | agent

  [[nodiscard]] bool admin() const;
  [[nodiscard]] bool operator_role() const;
};

}  // namespace gpunode::reservations
