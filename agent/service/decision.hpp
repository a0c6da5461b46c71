// The mutating routes as decisions (private to gpunode_service). A route is a plain function of
// the node's facts at this instant, the request and its caller; it changes nothing. It returns a
// Decision, and the committer (NodeService::Impl::carry_out) does what it says: commits the change
// and answers, asks the driver for the domains (then the route runs again with them), or writes
// terminations ahead and hands them to the driver. Since a route cannot change anything, asking
// for the domains half-way through a route leaves nothing to undo.
//
//   request ──route(Facts, request, caller)──▶ Decision ──carry_out──▶ Outcome (the driver's)
//
// The routes are tested as functions, without SQLite or a hypervisor (tests/service/decisions_test).
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "caller.hpp"
#include "gpunode/reservations/live_index.hpp"
#include "gpunode/reservations/model.hpp"
#include "gpunode/reservations/permissions.hpp"
#include "gpunode/service/node_service.hpp"
#include "gpunode/service/spot_plan.hpp"
#include "inventory.hpp"
#include "reservation_table.hpp"
#include "state_store.hpp"
#include "termination_ledger.hpp"

namespace gpunode::service {
namespace r = gpunode::reservations;
namespace json = boost::json;
}  // namespace gpunode::service

namespace gpunode::service::detail {

inline r::Time to_time(std::chrono::system_clock::time_point t) {
  return std::chrono::time_point_cast<std::chrono::seconds>(t);
}

inline Caller agent_caller() {
  return Caller{r::Caller{"gpunode-agent", std::nullopt, {}, "agent"}};
}

inline ApiResponse forbidden(std::string_view detail) {
  return problem(403, "forbidden", detail);
}

// 503 storage-unavailable for a store error: `what` failed because of its kind ("disk full",
// "busy", "corrupt", ...: store::DbError::kind, which names no file or statement), then `after`.
// The log line, written where it failed, carries the whole error.
inline ApiResponse storage_problem(const store::DbError& e, std::string_view what, std::string_view after) {
  return problem(503, "storage-unavailable", fmt::format("{} ({}); {}", what, e.kind(), after));
}

// 422 unknown-unit naming each of `ids` that `current` does not hold (release, reclaim).
inline std::optional<ApiResponse> units_not_held(const reservations::Reservation& current,
                                                 const std::vector<std::string>& ids) {
  std::vector<gpunode::json::FieldError> unknown;
  for (const auto& u : ids) {
    if (!current.holds_unit(u))
      unknown.push_back({"unitIds", fmt::format("{} is not a unit of reservation {}", u, current.id)});
  }
  if (unknown.empty()) return std::nullopt;
  return problem(422, "unknown-unit", "some units are not units of this reservation", unknown);
}

inline ApiResponse with_header(ApiResponse resp, std::string name, std::string value) {
  resp.headers.emplace_back(std::move(name), std::move(value));
  return resp;
}

inline json::value opt_str(const std::optional<std::string>& s) {
  return s ? json::value(*s) : json::value(nullptr);
}

using Workload = spot::Occupant;  // a domain and the units its PCI hostdevs are members of

// The keys a VM is named by in answers, events and termination records (CONTRACT §4, §5, §6).
enum class VmKey : std::uint8_t { vm_id, domain_uuid, name, org, tier, unit_ids };
// What they are read from: a domain's (or a domain XML's) label, uuid and name, and its units.
struct VmRef {
  const std::optional<vmctl::WorkloadLabel>& label;
  const std::string& uuid;
  const std::string& name;
  const std::vector<std::string>& unit_ids;
};
// The one VM object: each of `keys`, in that order; `vmId`, `org` and `tier` from the label (null
// for an unlabelled domain, CONTRACT §7). Each place adds its own keys after these.
json::object vm_json(const VmRef& vm, std::initializer_list<VmKey> keys);

// Commit `change` (with its Idempotency-Key's answer, when it has one); once stored, answer
// `answer` and write `log` (info). `apply_terms`: a term may be due at once (an amended endsAt).
// A change that cannot be stored answers 503 storage-unavailable: "`unstored_what` (why);
// `unstored_after`", or, with `answer_anyway`, `answer` all the same (a refusal stands even when
// its event is lost). The terminations it records count in gpunode_terminations_total once stored.
struct CommitThen {
  Change change;
  ApiResponse answer;
  std::optional<std::string> log{};
  bool apply_terms = false;
  std::string unstored_what = "the change could not be stored";
  std::string unstored_after = "nothing was changed";
  bool answer_anyway = false;
  std::uint64_t terminations_ok = 0, terminations_failed = 0;
};

// Write the terminations of `plan` ahead together with `change` (a reclaim's), then run them
// (RunBatch); without terminations, commit `change` and answer at once. The plan points into
// `workloads`, the list the route was given, which outlives the decision's carrying out.
struct Terminate {
  Batch batch;
  Change change;
  spot::Plan plan;
  std::chrono::seconds grace{0};
  std::optional<std::string> reason{};
  // CONTRACT §12: answer what would be done, and do nothing (no commit, audit, event or answer kept).
  bool dry_run = false;
  const std::vector<Workload>* workloads = nullptr;  // the list the plan points into (when listed)
};

// What a route decided: the answer alone (a refusal, a read), a change to commit, the domains it
// needs first (nothing was changed), or terminations to start.
using Decision = std::variant<ApiResponse, CommitThen, NeedsWorkloads, Terminate>;

// The domains a route may need: as listed for this request, a list kept current by the
// hypervisor's events (when its age allows), or why there is none.
using WorkloadsOrNot = std::expected<const std::vector<Workload>*, std::variant<ApiResponse, NeedsWorkloads>>;

// A body's "unitIds" that must name at least one unit: its problem, unless reading it found one.
inline void require_unit_ids(std::vector<gpunode::json::FieldError>& problems,
                             const std::optional<std::vector<std::string>>& ids) {
  if (ids && !ids->empty()) return;
  for (const auto& p : problems) {
    if (p.field == "unitIds") return;
  }
  problems.push_back({"unitIds", "must name at least one unit"});
}

inline Decision refused(std::variant<ApiResponse, NeedsWorkloads> why) {
  return std::visit([](auto&& v) -> Decision { return std::move(v); }, std::move(why));
}

// What a route may ask beyond the state in Facts. Reads only: none of them changes the node.
class Lookups {
 public:
  virtual ~Lookups() = default;
  // Idempotency-Key (CONTRACT §4 Conventions): the draft to store with the change (nothing without
  // a key), or the answer to give now (the stored answer replayed, a 409 or a 422).
  virtual std::expected<std::optional<IdempotencyDraft>, ApiResponse> idempotency(const ApiRequest& q,
                                                                                  const Caller& c) const = 0;
  // The domains with the units they occupy, at most `max_age` old (zero: listed for this request).
  virtual WorkloadsOrNot workloads(std::chrono::milliseconds max_age) const = 0;
  // Domains the hook let through that libvirt does not list running yet (the start race, §9).
  virtual std::vector<Workload> starting() const = 0;
  // A reservation by id, ended ones included (read from the store into `kept`); nullptr if none.
  virtual const reservations::Reservation* reservation(
      std::string_view id, std::optional<reservations::Reservation>& kept) const = 0;
  // A new id with this prefix ("rsv_").
  virtual std::string new_id(std::string_view prefix) const = 0;
};

struct HealthBook;  // health_book.hpp

// The node's state at this instant, as the routes read it.
struct Facts {
  reservations::NodeView node;
  const ReservationTable& reservations;  // the ones not ended
  const reservations::LiveIndex& live;   // the same, by unit and start
  const Inventory& inventory;
  reservations::Time now;
  std::chrono::seconds shutdown_grace{0};  // terminate-spot's default grace
  const Lookups& ask;
  const HealthBook* health = nullptr;  // unit health, for its clear (CONTRACT §13)

  // CONTRACT §4's relation table for `c` on this node, and on `x` when the action is on one.
  [[nodiscard]] bool allowed(reservations::Action action, const Caller& c,
                             const reservations::Reservation* x = nullptr) const;
};

// How old the occupancy check's list may be when events keep it current (CONTRACT §7 Occupancy
// is a check at the moment of the change; the hook's admission closes the start race).
inline constexpr std::chrono::milliseconds kOccupancyListAge{5000};
// GET workloads: a list the events keep current is as good as a new one, however old.
inline constexpr std::chrono::milliseconds kAnyListAge = std::chrono::milliseconds::max();

namespace routes {
// POST reservations, PATCH, end, release (CONTRACT §4, §7).
Decision create(const Facts& f, const ApiRequest& q, const Caller& c);
Decision amend(const Facts& f, const ApiRequest& q, const Caller& c,
               const reservations::Reservation& current);
Decision end(const Facts& f, const ApiRequest& q, const Caller& c, const reservations::Reservation& current);
Decision release(const Facts& f, const ApiRequest& q, const Caller& c,
                 const reservations::Reservation& current);
// POST reclaim, terminate-spot (CONTRACT §4, §5, §7).
Decision reclaim(const Facts& f, const ApiRequest& q, const Caller& c,
                 const reservations::Reservation& current);
Decision terminate_spot(const Facts& f, const ApiRequest& q, const Caller& c);
// POST admission: a question; with an Idempotency-Key its answer is kept (no revision moves).
Decision admission(const Facts& f, const ApiRequest& q, const Caller& c);
// POST /v1/admin/units/{unitId}/health/clear (CONTRACT §13): every function the unit is judged on
// begins again from its last reading, the unit's reasons are cleared, the act is audited
// (unit.health-clear); answers the unit. Needs f.health.
Decision health_clear(const Facts& f, const ApiRequest& q, const Caller& c, const std::string& unit_id);
}  // namespace routes

// A body {"reason"} of at most 1024 characters (end's optional one, a health clear's required one):
// the reason (nothing when absent and not required), or the 400 that says what is wrong.
std::expected<std::optional<std::string>, ApiResponse> reason_of(const std::string& body, bool required);

// The checks the routes share: units named in a request (422 unknown-unit, 409
// unit-not-reservable), overlapping terms (409 reservation-overlap), occupancy once the term has
// started (409 unit-occupied; spot workloads are listed in `spot`, or NeedsWorkloads).
std::optional<ApiResponse> check_units(const Facts& f, const std::vector<std::string>& ids);
std::optional<ApiResponse> check_overlap(const Facts& f, const reservations::Reservation& candidate);
std::optional<Decision> check_occupancy(const Facts& f, const reservations::Reservation& x,
                                        const std::vector<std::string>& checked, boost::json::array& spot);

}  // namespace gpunode::service::detail
