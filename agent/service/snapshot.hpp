// One state of the node, immutable once published (private to gpunode_service): the units, the
// reservations not ended, the workloads as last listed and the revision. The core thread builds
// and publishes the next one after every change (its generation: every commit, revision bump and
// reload setting moves it; Impl::publish); the network threads answer GET units, state and
// reservations from the published one without a hop, as long as its generation is the current one
// and no term has come since (NodeService::read). What it renders for a class of caller is kept in
// it, so an answer lives exactly as long as the state it shows.
#pragma once

#include <boost/json.hpp>
#include <chrono>
#include <compare>
#include <cstdint>
#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gpunode/reservations/model.hpp"
#include "gpunode/reservations/rules.hpp"
#include "gpunode/service/api.hpp"
#include "gpunode/service/node_service.hpp"
#include "inventory.hpp"
#include "reservation_table.hpp"

namespace gpunode::service::detail {

// A route and a class of callers the read rules cannot tell apart (their transport, org and roles):
// what a rendering is kept under. A tuple compared as values (CONTRACT §10 "Callers are tuples"),
// never joined into one string a claim could forge another class's with. The view a read looks up
// by (it allocates nothing); AnswerKey owns one.
struct AnswerClass {
  std::string_view route;
  std::string_view via;
  std::optional<std::string_view> org;
  std::span<const std::string> roles;  // sorted
  // `sorted` holds the roles sorted when who's are not (two or more, out of order); it must live
  // as long as the class.
  static AnswerClass of(std::string_view route, const reservations::Caller& who,
                        std::vector<std::string>& sorted);
};
std::strong_ordering compare(const AnswerClass& a, const AnswerClass& b);
struct AnswerKey {
  explicit AnswerKey(const AnswerClass& c)
      : route(c.route), via(c.via), org(c.org), roles(c.roles.begin(), c.roles.end()) {}
  AnswerClass view() const { return {route, via, org, roles}; }
  std::string route, via;
  std::optional<std::string> org;
  std::vector<std::string> roles;
};
struct AnswerLess {
  using is_transparent = void;
  static AnswerClass view(const AnswerClass& c) { return c; }
  static AnswerClass view(const AnswerKey& k) { return k.view(); }
  template <class A, class B>
  bool operator()(const A& a, const B& b) const {
    return compare(view(a), view(b)) < 0;
  }
};

struct Snapshot {
  std::uint64_t generation = 0;  // the core's generation it was built at
  std::int64_t revision = 0;
  reservations::NodeView node;
  ReservationTable reservations;
  Inventory inventory;
  boost::json::array workloads;    // as last listed (GET state)
  bool workloads_current = false;  // the hypervisor's events say they still hold (GET workloads)
  // The next term's instant: from then on the clock changes what the node shows, and only the
  // core thread (which applies the term first) may answer.
  std::optional<std::chrono::system_clock::time_point> next_term;

  // The answer for `key` (a route and a class of caller), rendered by `render` the first time.
  // Any thread; at most kMaxAnswers kept (then the table starts again).
  template <class Render>
  std::shared_ptr<const ApiResponse> answer(const AnswerClass& key, Render&& render) const {
    {
      std::lock_guard lock(mu_);
      if (auto hit = answers_.find(key); hit != answers_.end()) return hit->second;
    }
    auto made = std::make_shared<const ApiResponse>(render());
    std::lock_guard lock(mu_);
    if (answers_.size() >= kMaxAnswers) answers_.clear();
    return answers_.emplace(AnswerKey(key), std::move(made)).first->second;
  }
  static constexpr std::size_t kMaxAnswers = 64;

 private:
  mutable std::mutex mu_;
  mutable std::map<AnswerKey, std::shared_ptr<const ApiResponse>, AnswerLess> answers_;  // guarded by mu_
};

// What a read from the snapshot is given on a network thread (the route table's `read`).
struct ReadCall {
  const Snapshot& s;
  const ApiRequest& q;
  const reservations::Caller& who;
  const reservations::Reservation* reservation;  // Scope::reservation: the one the path names
};

// The read routes, as functions of a snapshot and a caller: the same code answers on the core
// thread and on a network thread. Each returns the answer: a 200 with its ETag, or a refusal.
ApiResponse units_answer(const Snapshot& s, const reservations::Caller& who);
// GET state: the full answer, a 304, or (a poll whose revision has not passed `after` and that
// waits) Park.
std::variant<ApiResponse, Park> state_answer(const Snapshot& s, const ApiRequest& q,
                                             const reservations::Caller& who);
// GET reservations' query: its state, limit and pageToken, or the 400.
struct ReservationQuery {
  std::optional<reservations::State> state;
  std::size_t limit = 0;
  std::string token;  // the last id of the previous page
  // Ended reservations are on disk, not in a snapshot: a list that holds them (no state, or
  // state=ended) is paged from the store on the core thread (NodeService::Impl::stored_reservations).
  [[nodiscard]] bool lists_ended() const { return !state || *state == reservations::State::ended; }
};
std::expected<ReservationQuery, ApiResponse> reservation_query(const ApiRequest& q);
// One page of reservations in id order: add() each the caller sees, in order, until full().
class ReservationPage {
 public:
  explicit ReservationPage(std::size_t limit) : limit_(limit) {}
  void add(const reservations::Reservation& x);  // past the limit: only notes that there is more
  [[nodiscard]] bool full() const { return more_; }
  ApiResponse answer();  // {"reservations", "nextPageToken"} with its ETag
 private:
  std::size_t limit_;
  boost::json::array list_;
  std::string last_;
  bool more_ = false;
};
// The live states' list (scheduled or active) from a snapshot.
ApiResponse reservations_answer(const Snapshot& s, const ReservationQuery& query,
                                const reservations::Caller& who);
ApiResponse reservation_answer(const reservations::Reservation& x);  // needs no snapshot: `x` is its own
// GET workloads: {"nodeId", "workloads"}, each as workload_json gives it.
ApiResponse workloads_answer(const std::string& node_id, boost::json::array workloads);
// GET capacity?org=ORG: the units ORG may place on now, each with its tier (CONTRACT §4).
ApiResponse capacity_answer(const Snapshot& s, const ApiRequest& q, const reservations::Caller& who);

// A unit as `who` sees it (its reservationIds: the non-ended ones holding it that `who` sees); an
// absent unit from its last JSON; all units, present ones first by id.
boost::json::object unit_json(const reservations::NodeView& node, const ReservationTable& reservations,
                              const discovery::Unit& u, const reservations::Caller& who);
boost::json::object absent_unit_json(const reservations::NodeView& node, const ReservationTable& reservations,
                                     const std::string& id, boost::json::object doc,
                                     const reservations::Caller& who);
boost::json::array units_json(const reservations::NodeView& node, const ReservationTable& reservations,
                              const Inventory& inventory, const reservations::Caller& who);

// A page's limit and pageToken (the last id of the previous page), or the 400 for a bad limit.
std::expected<std::pair<std::size_t, std::string>, ApiResponse> paging(const ApiRequest& q);

// A page of stored documents (`rows`: seq and JSON text, read `limit + 1` to see whether more
// follow): the documents, and the seq to continue after when more follow. A row that is not JSON
// is a 500 naming it (`name_of(seq)`: "audit record aud_12").
struct StoredPage {
  boost::json::array documents;
  std::optional<std::int64_t> next_after;
};
std::expected<StoredPage, ApiResponse> stored_page(std::vector<std::pair<std::int64_t, std::string>> rows,
                                                   std::size_t limit,
                                                   const std::function<std::string(std::int64_t)>& name_of);

// A strong ETag over a body; the answer to If-None-Match (304 when it matches).
std::string strong_etag(std::string_view body);
ApiResponse conditional(const ApiRequest& q, ApiResponse resp);

}  // namespace gpunode::service::detail
