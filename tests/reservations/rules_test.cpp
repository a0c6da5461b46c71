// Reservation rules (CONTRACT §4, §7) as tables of cases.
#include "gpunode/reservations/rules.hpp"

#include <doctest/doctest.h>

#include <memory>

#include "gpunode/reservations/permissions.hpp"

using namespace gpunode::reservations;
using std::chrono::hours;
using std::chrono::seconds;

namespace {

Time at(const char* text) {
  auto t = parse_time(text);
  REQUIRE_MESSAGE(t.has_value(), text);
  return *t;
}

Reservation rsv(std::string id, std::vector<std::string> units, const char* starts, const char* ends,
                State state = State::active) {
  Reservation r;
  r.id = std::move(id);
  r.node_id = "node-1";
  r.unit_ids = std::move(units);
  r.audience_org_ids = {"org-aud"};
  r.managing_org_ids = {"org-mgr"};
  r.starts_at = at(starts);
  r.ends_at = at(ends);
  r.state = state;
  return r;
}

Caller org(const char* o, std::vector<std::string> roles = {}) {
  return Caller{"sub", std::string(o), std::move(roles), "https"};
}

const NodeView kNode{"node-1", "org-owner"};

}  // namespace

TEST_CASE("RFC 3339 times") {
  CHECK(format_time(at("2027-01-31T00:00:00Z")) == "2027-01-31T00:00:00Z");
  CHECK(at("2027-01-31T01:30:00+01:30") == at("2027-01-31T00:00:00Z"));
  CHECK(at("2027-01-31T00:00:00.123456Z") == at("2027-01-31T00:00:00Z"));
  CHECK(at("2028-02-29T12:00:00Z") == at("2028-02-29T12:00:00Z"));
  CHECK(format_time(at("1970-01-01T00:00:00Z")) == "1970-01-01T00:00:00Z");
  CHECK(format_time(at("2199-12-31T23:59:59Z")) == "2199-12-31T23:59:59Z");
  CHECK(at("2199-12-31T23:59:59Z") == kLatestTime);
  // Any Time formats, past the clock's 2262 too (fmt's chrono formatting overflowed there).
  CHECK(format_time(Time{std::chrono::sys_days{std::chrono::year{4054} / 2 / 1}} +
                    std::chrono::seconds{3723}) == "4054-02-01T01:02:03Z");
  CHECK(format_time(Time{std::chrono::seconds{-1}}) == "1969-12-31T23:59:59Z");
  for (const char* bad :
       {"", "2027-01-31", "2027-01-31T00:00:00", "2027-02-30T00:00:00Z", "2027-01-31T24:00:00Z",
        "2027-01-31 00:00:00Z", "2027-1-31T00:00:00Z", "2027-01-31T00:00:00Zjunk", "2027-01-31T00:00:00.Z",
        "2027-01-31T00:00:00+0100", "yyyy-01-31T00:00:00Z",
        // Outside 1970..2199 (tests/fuzz/regressions/http_request/far-future-ends-at).
        "4054-02-01T00:00:00Z", "2200-01-01T00:00:00Z", "2199-12-31T23:59:59-00:01", "1969-12-31T23:59:59Z",
        "1970-01-01T00:00:00+00:01", "0000-01-01T00:00:00Z"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_time(bad).has_value());
  }
}

TEST_CASE("terms are half-open") {
  struct Case {
    const char *a0, *a1, *b0, *b1;
    bool overlap;
  } cases[] = {
      {"2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z", "2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z", false},
      {"2027-01-01T00:00:00Z", "2027-02-01T00:00:01Z", "2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z", true},
      {"2027-01-01T00:00:00Z", "2027-03-01T00:00:00Z", "2027-01-15T00:00:00Z", "2027-01-16T00:00:00Z", true},
      {"2027-02-01T00:00:00Z", "2027-03-01T00:00:00Z", "2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z", false},
  };
  for (const auto& c : cases) {
    CAPTURE(c.a0);
    CAPTURE(c.b0);
    CHECK(terms_overlap(at(c.a0), at(c.a1), at(c.b0), at(c.b1)) == c.overlap);
    CHECK(terms_overlap(at(c.b0), at(c.b1), at(c.a0), at(c.a1)) == c.overlap);
  }
}

TEST_CASE("overlap names every blocker, ignores ended ones, other units and itself") {
  std::vector<Reservation> existing{
      rsv("rsv_b", {"u-1"}, "2027-01-01T00:00:00Z", "2027-06-01T00:00:00Z"),
      rsv("rsv_a", {"u-2", "u-1"}, "2027-05-01T00:00:00Z", "2027-07-01T00:00:00Z", State::scheduled),
      rsv("rsv_c", {"u-1"}, "2027-01-01T00:00:00Z", "2027-09-01T00:00:00Z", State::ended),
      rsv("rsv_d", {"u-3"}, "2027-01-01T00:00:00Z", "2027-09-01T00:00:00Z"),
      rsv("rsv_e", {"u-1"}, "2027-08-01T00:00:00Z", "2027-09-01T00:00:00Z", State::scheduled),
  };
  auto candidate = rsv("rsv_new", {"u-1"}, "2027-04-01T00:00:00Z", "2027-08-01T00:00:00Z");
  CHECK(blocking_reservations(candidate, existing) == std::vector<std::string>{"rsv_a", "rsv_b"});
  // amending rsv_b itself: it does not block itself
  auto amended = existing[0];
  amended.ends_at = at("2027-08-01T00:00:00Z");
  CHECK(blocking_reservations(amended, existing) == std::vector<std::string>{"rsv_a"});
}

TEST_CASE("terms activate and expire by the clock, in time order") {
  std::vector<Reservation> rs{
      rsv("rsv_late", {"u-1"}, "2027-03-01T00:00:00Z", "2027-04-01T00:00:00Z", State::scheduled),
      rsv("rsv_gone", {"u-2"}, "2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z", State::scheduled),
      rsv("rsv_now", {"u-3"}, "2027-01-15T00:00:00Z", "2027-12-01T00:00:00Z", State::active),
  };
  SUBCASE("nothing due") {
    CHECK(due_transitions(rs, at("2026-12-01T00:00:00Z")).empty());
  }
  SUBCASE("a term that both started and ended while down gets both, in time order") {
    auto due = due_transitions(rs, at("2027-02-15T00:00:00Z"));
    REQUIRE(due.size() == 2);
    CHECK(due[0].kind == Transition::Kind::activate);
    CHECK(due[0].reservation_id == "rsv_gone");
    CHECK(due[0].at == at("2027-01-01T00:00:00Z"));
    CHECK(due[1].kind == Transition::Kind::expire);
    CHECK(due[1].at == at("2027-02-01T00:00:00Z"));
    Reservation r = rs[1];
    r.released_unit_ids = {"u-2"};
    for (const auto& t : due) apply(r, t);
    CHECK(r.state == State::ended);
    CHECK(r.end_reason == EndReason::term_expired);
    CHECK(r.ended_at == r.ends_at);  // ended at its endsAt, not at the moment it was applied
    CHECK(r.released_unit_ids.empty());
  }
  SUBCASE("the start instant is inside the term, the end instant is not") {
    auto due = due_transitions(rs, at("2027-03-01T00:00:00Z"));
    CHECK(due.size() == 3);  // rsv_gone activate+expire, rsv_late activate
    CHECK(due.back().reservation_id == "rsv_late");
    CHECK(due.back().kind == Transition::Kind::activate);
  }
}

TEST_CASE("a ReservationsView reads plain and shared reservations alike, in order, without a copy") {
  std::vector<Reservation> plain{
      rsv("rsv_a", {"u-1"}, "2027-01-01T00:00:00Z", "2027-02-01T00:00:00Z", State::active),
      rsv("rsv_b", {"u-1"}, "2027-01-20T00:00:00Z", "2027-03-01T00:00:00Z", State::scheduled),
  };
  std::vector<SharedReservation> shared;
  for (const auto& x : plain) shared.push_back(std::make_shared<const Reservation>(x));
  const ReservationsView a = plain;
  const ReservationsView b = shared;
  CHECK(a.size() == 2);
  CHECK(b.size() == 2);
  CHECK_FALSE(b.empty());
  CHECK(ReservationsView{}.empty());
  CHECK(ReservationsView{}.begin() == ReservationsView{}.end());
  std::vector<const Reservation*> seen;
  for (const auto& x : b) seen.push_back(&x);
  CHECK(seen == std::vector<const Reservation*>{shared[0].get(), shared[1].get()});  // the values, not copies
  CHECK(&*a.begin() == plain.data());
  auto it = b.begin();
  CHECK((it++)->id == "rsv_a");
  CHECK(it->id == "rsv_b");
  CHECK(++it == b.end());
  // The rules answer the same over either.
  const auto candidate = rsv("rsv_c", {"u-1"}, "2027-01-25T00:00:00Z", "2027-01-26T00:00:00Z");
  CHECK(blocking_reservations(candidate, a) == blocking_reservations(candidate, b));
  CHECK(blocking_reservations(candidate, b) == std::vector<std::string>{"rsv_a", "rsv_b"});
  CHECK(due_transitions(b, at("2027-02-15T00:00:00Z")).size() ==
        due_transitions(a, at("2027-02-15T00:00:00Z")).size());
}

TEST_CASE("create bodies: every invalid field is named") {
  const Time now = at("2027-01-01T00:00:00Z");
  CreateRequest ok{{"u-1", "u-2"}, {"org-a"}, {}, std::nullopt, now + hours(24), "note"};
  CHECK(validate_create(ok, now).empty());
  struct Case {
    const char* name;
    CreateRequest q;
    std::vector<std::string> fields;
  } cases[] = {
      {"no units", {{}, {"org-a"}, {}, std::nullopt, now + hours(1), ""}, {"unitIds"}},
      {"a unit twice", {{"u-1", "u-1"}, {"org-a"}, {}, std::nullopt, now + hours(1), ""}, {"unitIds"}},
      {"no audience", {{"u-1"}, {}, {}, std::nullopt, now + hours(1), ""}, {"audienceOrgIds"}},
      {"no end", {{"u-1"}, {"org-a"}, {}, std::nullopt, std::nullopt, ""}, {"endsAt"}},
      {"end before start", {{"u-1"}, {"org-a"}, {}, now + hours(5), now + hours(4), ""}, {"endsAt"}},
      {"end now", {{"u-1"}, {"org-a"}, {}, now - hours(5), now, ""}, {"endsAt"}},
      {"long note", {{"u-1"}, {"org-a"}, {}, std::nullopt, now + hours(1), std::string(1025, 'x')}, {"note"}},
      {"everything",
       {{}, {}, {"m", "m"}, std::nullopt, std::nullopt, std::string(2000, 'x')},
       {"unitIds", "audienceOrgIds", "managingOrgIds", "endsAt", "note"}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    std::vector<std::string> got;
    for (const auto& e : validate_create(c.q, now)) {
      CHECK_FALSE(e.message.empty());
      if (got.empty() || got.back() != e.field) got.push_back(e.field);
    }
    CHECK(got == c.fields);
  }
}

TEST_CASE("who sees the node, its units and its reservations") {
  std::vector<Reservation> rs{
      rsv("rsv_1", {"u-1"}, "2027-01-01T00:00:00Z", "2027-06-01T00:00:00Z"),
      rsv("rsv_old", {"u-1"}, "2026-01-01T00:00:00Z", "2026-06-01T00:00:00Z", State::ended)};
  rs[1].audience_org_ids = {"org-past"};
  rs[1].managing_org_ids = {"org-past-mgr"};
  struct Case {
    const char* name;
    Caller caller;
    bool node, units, reservation;
  } cases[] = {
      {"admin", org("org-x", {"platform-admin"}), true, true, true},
      {"operator", org("org-x", {"platform-operator"}), true, true, true},
      {"owner", org("org-owner"), true, true, true},
      {"manager", org("org-mgr"), true, true, true},
      {"audience", org("org-aud"), true, false, true},
      {"unrelated", org("org-x"), false, false, false},
      {"audience of an ended reservation only", org("org-past"), false, false, false},
      {"manager of an ended reservation only", org("org-past-mgr"), false, false, false},
      {"no org, no roles", Caller{"sub", std::nullopt, {}, "https"}, false, false, false},
      {"an unknown role is no role", org("org-x", {"platform-superuser"}), false, false, false},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    CHECK(may(Action::see_node, c.caller, Subject{kNode, rs, nullptr, {}}) == c.node);
    CHECK(may(Action::list_units, c.caller, Subject{kNode, rs, nullptr, {}}) == c.units);
    CHECK(may(Action::see_reservation, c.caller, Subject{kNode, rs, &rs[0], {}}) == c.reservation);
    CHECK(visible_reservation_ids(c.caller, kNode, rs, "u-1") ==
          (c.reservation ? std::vector<std::string>{"rsv_1"} : std::vector<std::string>{}));
  }
}

TEST_CASE(
    "terminate-spot reach: admin and owner everything, a manager its active released and reclaiming units") {
  auto active = rsv("rsv_1", {"u-1", "u-2", "u-3"}, "2026-01-01T00:00:00Z", "2027-06-01T00:00:00Z");
  active.released_unit_ids = {"u-1"};
  active.reclaiming_unit_ids = {"u-2"};
  auto scheduled = rsv("rsv_2", {"u-4"}, "2027-07-01T00:00:00Z", "2027-08-01T00:00:00Z", State::scheduled);
  scheduled.released_unit_ids = {"u-4"};  // cannot happen through the API; the rule still ignores it
  auto ended = rsv("rsv_3", {"u-5"}, "2025-01-01T00:00:00Z", "2025-02-01T00:00:00Z", State::ended);
  ended.released_unit_ids = {"u-5"};
  auto other = rsv("rsv_4", {"u-6"}, "2026-01-01T00:00:00Z", "2027-06-01T00:00:00Z");
  other.managing_org_ids = {"org-other-mgr"};
  other.released_unit_ids = {"u-6"};
  const std::vector<Reservation> rs{active, scheduled, ended, other};
  const std::vector<std::string> all{"u-1", "u-2", "u-3", "u-4", "u-5", "u-6", "u-7"};
  using Set = std::set<std::string>;
  struct Case {
    const char* name;
    Caller caller;
    Set reach;
  } cases[] = {
      {"admin", org("org-x", {"platform-admin"}), Set(all.begin(), all.end())},
      {"owner", org("org-owner"), Set(all.begin(), all.end())},
      {"operator", org("org-x", {"platform-operator"}), {}},
      {"manager",
       org("org-mgr"),
       {"u-1", "u-2"}},  // not u-3 (held, not released), not u-6 (rsv_4 is not its)
      {"audience", org("org-aud"), {}},
      {"unrelated", org("org-x"), {}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    CHECK(terminate_reach(c.caller, kNode, rs, all) == c.reach);
  }
  CHECK(terminate_reach(org("org-other-mgr"), kNode, rs, all) == Set{"u-6"});
}
