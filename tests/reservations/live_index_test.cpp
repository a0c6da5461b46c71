// LiveIndex: what an overlap check looks at. It must find every live term that meets the
// candidate's, however the terms lie, and on a calendar of back-to-back terms only a few others.
#include "gpunode/reservations/live_index.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "gpunode/reservations/rules.hpp"

using namespace gpunode::reservations;
using std::chrono::hours;
using std::chrono::seconds;

namespace {

const Time kBase = *parse_time("2027-01-01T00:00:00Z");

Reservation term(std::string id, std::vector<std::string> units, Time starts, Time ends,
                 State state = State::scheduled) {
  Reservation r;
  r.id = std::move(id);
  r.node_id = "node-1";
  r.unit_ids = std::move(units);
  r.starts_at = starts;
  r.ends_at = ends;
  r.state = state;
  return r;
}

std::vector<std::string> ids(const std::vector<std::string_view>& v) {
  return {v.begin(), v.end()};
}

// The ids near() gives for a candidate, and the ones that truly meet it, by brute force.
std::vector<std::string> truly_meeting(const std::vector<Reservation>& all,
                                       const std::vector<std::string>& units, Time s, Time e) {
  std::vector<std::string> out;
  for (const auto& r : all) {
    if (r.ended() || !terms_overlap(s, e, r.starts_at, r.ends_at)) continue;
    if (std::any_of(units.begin(), units.end(), [&](const std::string& u) { return r.holds_unit(u); }))
      out.push_back(r.id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("on a calendar of back-to-back hours, a candidate looks at its neighbours only") {
  LiveIndex index;
  std::vector<Reservation> all;
  for (int i = 0; i < 2000; ++i) {
    all.push_back(term("rsv_" + std::to_string(10000 + i), {"u1"}, kBase + hours(i), kBase + hours(i + 1)));
  }
  for (const auto& r : all) index.follow(nullptr, &r);
  CHECK(index.size("u1") == 2000);
  // The hour after the last: nothing meets it, and at most the last term is looked at.
  auto after = index.near(std::vector<std::string>{"u1"}, kBase + hours(2000), kBase + hours(2001));
  CHECK(after.size() <= 1);
  // Half an hour straddling terms 999 and 1000.
  auto mid = ids(index.near(std::vector<std::string>{"u1"}, kBase + hours(1000) - seconds(1800),
                            kBase + hours(1000) + seconds(1800)));
  CHECK(mid.size() <= 3);
  const std::vector<std::string> neighbours{"rsv_10999", "rsv_11000"};
  CHECK(std::includes(mid.begin(), mid.end(), neighbours.begin(), neighbours.end()));
  // Another unit is not looked at.
  CHECK(index.near(std::vector<std::string>{"u2"}, kBase, kBase + hours(5000)).empty());
}

TEST_CASE("a long term is found by a candidate that starts long after it did") {
  LiveIndex index;
  auto year = term("rsv_year", {"u1"}, kBase, kBase + hours(24 * 365));
  auto hour = term("rsv_hour", {"u1"}, kBase + hours(24 * 400), kBase + hours(24 * 400 + 1));
  index.follow(nullptr, &year);
  index.follow(nullptr, &hour);
  CHECK(ids(index.near(std::vector<std::string>{"u1"}, kBase + hours(24 * 300),
                       kBase + hours(24 * 300 + 1))) == std::vector<std::string>{"rsv_year"});
}

TEST_CASE("once a long term ends, candidates look at their neighbours only again") {
  LiveIndex index;
  std::vector<Reservation> hours_of;
  for (int i = 0; i < 2000; ++i) {
    hours_of.push_back(
        term("rsv_" + std::to_string(10000 + i), {"u1"}, kBase + hours(i), kBase + hours(i + 1)));
  }
  for (const auto& r : hours_of) index.follow(nullptr, &r);
  auto year = term("rsv_year", {"u1"}, kBase - hours(24 * 365), kBase);
  index.follow(nullptr, &year);
  const auto mid = [&] {
    return index.near(std::vector<std::string>{"u1"}, kBase + hours(1500) + seconds(600),
                      kBase + hours(1500) + seconds(1200));
  };
  CHECK(mid().size() > 1000);  // a year's term could reach any of them, so all are looked at
  auto ended = year;
  ended.state = State::ended;
  index.follow(&year, &ended);
  CHECK(mid().size() <= 2);
}

TEST_CASE("follow: amended terms move, ended ones leave, paired units are looked at once") {
  LiveIndex index;
  auto a = term("rsv_a", {"u1", "u2"}, kBase, kBase + hours(1));
  index.follow(nullptr, &a);
  CHECK(ids(index.near(std::vector<std::string>{"u1", "u2"}, kBase, kBase + hours(1))) ==
        std::vector<std::string>{"rsv_a"});

  auto moved = a;
  moved.starts_at = kBase + hours(10);
  moved.ends_at = kBase + hours(11);
  index.follow(&a, &moved);
  CHECK(index.near(std::vector<std::string>{"u1"}, kBase, kBase + hours(1)).empty());
  CHECK(ids(index.near(std::vector<std::string>{"u2"}, kBase + hours(10), kBase + hours(11))) ==
        std::vector<std::string>{"rsv_a"});

  auto ended = moved;
  ended.state = State::ended;
  index.follow(&moved, &ended);
  CHECK(index.size("u1") == 0);
  CHECK(index.size("u2") == 0);
  CHECK(index.near(std::vector<std::string>{"u1", "u2"}, kBase, kBase + hours(100)).empty());

  // An ended reservation is never added; following it again changes nothing.
  index.follow(&ended, &ended);
  CHECK(index.size("u1") == 0);

  // An amendment that changes the units: the term leaves the old unit and holds the new one.
  auto b = term("rsv_b", {"u1"}, kBase, kBase + hours(1));
  index.follow(nullptr, &b);
  auto moved_units = b;
  moved_units.unit_ids = {"u3"};
  index.follow(&b, &moved_units);
  CHECK(index.size("u1") == 0);
  CHECK(ids(index.near(std::vector<std::string>{"u3"}, kBase, kBase + hours(1))) ==
        std::vector<std::string>{"rsv_b"});
}

TEST_CASE("near() finds every term that meets the candidate, even where terms overlap each other") {
  // The service never keeps two live terms on a unit that overlap, but the index must not rely on
  // it: a state file from elsewhere could hold them. Random terms and candidates, checked
  // against a scan of all of them.
  std::mt19937 rng(7);
  const std::vector<std::string> units{"u1", "u2", "u3"};
  for (int round = 0; round < 50; ++round) {
    LiveIndex index;
    std::vector<Reservation> all;
    for (int i = 0; i < 60; ++i) {
      const auto s = kBase + hours(rng() % 500);
      const auto len = hours(1 + rng() % (i % 7 == 0 ? 400 : 6));
      std::vector<std::string> on{units[rng() % 3]};
      if (rng() % 4 == 0) on.push_back(units[(rng() % 2 + 1 + (on[0][1] - '1')) % 3]);
      all.push_back(
          term("rsv_" + std::to_string(i), on, s, s + len, rng() % 5 == 0 ? State::ended : State::scheduled));
    }
    for (const auto& r : all) index.follow(nullptr, &r);
    // Amend a few, end a few: the index follows.
    for (int i = 0; i < 10; ++i) {
      auto& r = all[rng() % all.size()];
      auto before = r;
      const auto what = rng() % 3;
      if (what == 0) {
        r.starts_at += hours(rng() % 50);
        r.ends_at = r.starts_at + hours(1 + rng() % 30);
      } else if (what == 1) {
        r.unit_ids = {units[rng() % 3]};
      } else {
        r.state = State::ended;
      }
      index.follow(&before, &r);
    }
    for (int c = 0; c < 40; ++c) {
      const auto s = kBase + hours(rng() % 520);
      const auto e = s + hours(1 + rng() % 20);
      std::vector<std::string> on{units[rng() % 3]};
      if (rng() % 3 == 0) on.push_back(units[rng() % 3]);
      const auto got = ids(index.near(on, s, e));
      const auto want = truly_meeting(all, on, s, e);
      CHECK(std::is_sorted(got.begin(), got.end()));
      CHECK(std::adjacent_find(got.begin(), got.end()) == got.end());
      CHECK_MESSAGE(std::includes(got.begin(), got.end(), want.begin(), want.end()), "round ", round,
                    " candidate ", c);
    }
  }
}
