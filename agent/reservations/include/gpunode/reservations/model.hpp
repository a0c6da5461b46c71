// gpunode/reservations/model.hpp: reservations and callers as plain data (CONTRACT §4). No I/O.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpunode::reservations {

using Time = std::chrono::sys_seconds;  // the API speaks RFC 3339 UTC to the second

// "2027-01-31T00:00:00Z"; fractions of a second are accepted on input and dropped.
std::optional<Time> parse_time(std::string_view text);
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
