#include "gpunode/reservations/model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

namespace gpunode::reservations {
namespace {

bool digits(std::string_view s, std::size_t pos, std::size_t n, int& out) {
  if (pos + n > s.size()) return false;
  int v = 0;
  for (std::size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  out = v;
  return true;
}

}  // namespace

std::optional<Time> parse_time(std::string_view s) {
  // YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM)
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, se = 0;
  if (s.size() < 20 || !digits(s, 0, 4, y) || s[4] != '-' || !digits(s, 5, 2, mo) || s[7] != '-' ||
      !digits(s, 8, 2, d) || (s[10] != 'T' && s[10] != 't') || !digits(s, 11, 2, h) || s[13] != ':' ||
      !digits(s, 14, 2, mi) || s[16] != ':' || !digits(s, 17, 2, se)) {
    return std::nullopt;
  }
  std::size_t pos = 19;
  if (pos < s.size() && s[pos] == '.') {
    ++pos;
    const std::size_t start = pos;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') ++pos;
    if (pos == start || pos - start > 9) return std::nullopt;
  }
  int offset_minutes = 0;
  if (pos < s.size() && (s[pos] == 'Z' || s[pos] == 'z')) {
    ++pos;
  } else if (pos < s.size() && (s[pos] == '+' || s[pos] == '-')) {
    int oh = 0, om = 0;
    if (!digits(s, pos + 1, 2, oh) || pos + 3 >= s.size() || s[pos + 3] != ':' ||
        !digits(s, pos + 4, 2, om) || oh > 23 || om > 59) {
      return std::nullopt;
    }
    offset_minutes = (s[pos] == '+' ? 1 : -1) * (oh * 60 + om);
    pos += 6;
  } else {
    return std::nullopt;
  }
  if (pos != s.size() || h > 23 || mi > 59 || se > 59) return std::nullopt;
  using namespace std::chrono;
  const year_month_day ymd{year{y}, month{static_cast<unsigned>(mo)}, day{static_cast<unsigned>(d)}};
  if (!ymd.ok()) return std::nullopt;
  const Time t = sys_days{ymd} + hours{h} + minutes{mi} + seconds{se} - minutes{offset_minutes};
  if (t < kEarliestTime || t > kLatestTime) return std::nullopt;
  return t;
}

// fmt's chrono formatting converts a time point to the system clock's nanoseconds first, which
// overflows past 2262; this stays in days and seconds.
std::string format_time(Time t) {
  using namespace std::chrono;
  const sys_days day = floor<days>(t);
  const year_month_day ymd{day};
  const hh_mm_ss hms{t - day};
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", static_cast<int>(ymd.year()),
                     static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                     hms.hours().count(), hms.minutes().count(), hms.seconds().count());
}

std::string_view to_string(State state) {
  switch (state) {
    case State::scheduled:
      return "scheduled";
    case State::active:
      return "active";
    case State::ended:
      return "ended";
  }
  return "ended";
}

std::optional<State> parse_state(std::string_view text) {
  if (text == "scheduled") return State::scheduled;
  if (text == "active") return State::active;
  if (text == "ended") return State::ended;
  return std::nullopt;
}

std::string_view to_string(EndReason reason) {
  return reason == EndReason::ended_early ? "ended-early" : "term-expired";
}

bool Reservation::holds_unit(std::string_view unit_id) const {
  return std::find(unit_ids.begin(), unit_ids.end(), unit_id) != unit_ids.end();
}

OrgIndex::Relations OrgIndex::of(std::string_view org) const {
  const auto at = counts_.find(org);
  if (at == counts_.end()) return {};
  return {at->second.managing > 0, at->second.audience > 0};
}

void OrgIndex::add(const Reservation& x) {
  if (x.ended()) return;
  for (const auto& org : x.managing_org_ids) ++counts_[org].managing;
  for (const auto& org : x.audience_org_ids) ++counts_[org].audience;
}

void OrgIndex::remove(const Reservation& x) {
  if (x.ended()) return;
  const auto drop = [this](const std::string& org, std::size_t Counts::*field) {
    auto at = counts_.find(org);
    if (at == counts_.end() || at->second.*field == 0) return;  // never counted: nothing to take back
    if (--(at->second.*field) == 0 && at->second == Counts{}) counts_.erase(at);
  };
  for (const auto& org : x.managing_org_ids) drop(org, &Counts::managing);
  for (const auto& org : x.audience_org_ids) drop(org, &Counts::audience);
}

bool Caller::admin() const {
  return std::find(roles.begin(), roles.end(), "platform-admin") != roles.end();
}

bool Caller::operator_role() const {
  return std::find(roles.begin(), roles.end(), "platform-operator") != roles.end();
}

}  // namespace gpunode::reservations
