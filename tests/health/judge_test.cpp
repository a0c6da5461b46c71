// Unit health's judge (CONTRACT §13) as tables: each case is a function's polls, one reading a
// minute unless it says otherwise, and the reasons the unit has after the last one. The field's
// false positives are cases of their own: counts at first sight, a count that goes down, a sleeping
// device's link and config, an idle GPU's speed, a file that cannot be read.
#include "gpunode/health/judge.hpp"

#include <doctest/doctest.h>

#include <boost/json.hpp>

#include "gpunode/health/state_json.hpp"

using namespace gpunode::health;
namespace dh = gpunode::discovery::health;
using std::chrono::minutes;

namespace {

constexpr Time kStart{std::chrono::seconds(1'800'000'000)};
const dh::Target kGpu{*gpunode::discovery::PciAddress::parse("0000:41:00.0"), true, true};
const dh::Target kPort{*gpunode::discovery::PciAddress::parse("0000:40:01.1"), false, true};
const dh::Target kAudio{*gpunode::discovery::PciAddress::parse("0000:41:00.1"), false, false};

dh::Reading d0(std::uint64_t fatal, std::uint64_t nonfatal, std::uint64_t cor, int width = 16) {
  dh::Reading r;
  r.counts = {fatal, nonfatal, cor};
  r.power = dh::Power::d0;
  r.power_text = "D0";
  r.width = width;
  r.max_width = 16;
  r.speed = "32.0 GT/s PCIe";
  r.config = dh::ConfigAnswer::answers;
  return r;
}

dh::Reading asleep(const char* state) {
  dh::Reading r = d0(0, 0, 0);
  r.power = dh::Power::asleep;
  r.power_text = state;
  r.width.reset();  // not read: a sleeping device is never woken
  r.config = dh::ConfigAnswer::not_read;
  return r;
}

// One function polled with `readings` (each `step` apart) as the unit's only one.
struct Run {
  DeviceState state;
  DeviceMemo memo;
  Verdict verdict;
  Rises rises;  // summed
  Time now = kStart;

  Run& poll(const dh::Reading& reading, const dh::Target& target = kGpu, const Settings& s = {}) {
    dh::Reading r = reading;
    r.address = target.address.to_string();
    auto v = judge_device(state, memo, r, target, now, s);
    state = v.state;
    memo = v.memo;
    rises.fatal += v.rises.fatal;
    rises.nonfatal += v.rises.nonfatal;
    rises.correctable += v.rises.correctable;
    verdict = judge_unit(verdict, {{r.address, v.findings}}, now);
    now += minutes(1);
    return *this;
  }
  Run& polls(int n, const dh::Reading& reading, const dh::Target& target = kGpu, const Settings& s = {}) {
    for (int i = 0; i < n; ++i) poll(reading, target, s);
    return *this;
  }
  [[nodiscard]] std::vector<std::string> codes() const {
    std::vector<std::string> out;
    for (const auto& r : verdict) out.push_back(r.code);
    return out;
  }
  [[nodiscard]] std::string state_of(const Settings& s = {}) const {
    return std::string(gpunode::discovery::to_string(unit_health(verdict, s).state()));
  }
};

using Codes = std::vector<std::string>;

}  // namespace

TEST_CASE("counts found at first sight are the baseline, never an alarm") {
  Run run;
  run.poll(d0(5, 7, 1000));
  CHECK(run.codes().empty());
  CHECK(run.state.fatal == 5u);
  CHECK(run.state.nonfatal == 7u);
  CHECK(run.rises.fatal == 0);
  run.polls(20, d0(5, 7, 1000));
  CHECK(run.codes().empty());
}

TEST_CASE("a fatal error on the GPU or on its upstream port fails the unit, latched") {
  for (const auto& target : {kGpu, kPort}) {
    CAPTURE(target.address.to_string());
    Run run;
    run.poll(d0(0, 0, 0), target).poll(d0(1, 0, 0), target);
    CHECK(run.codes() == Codes{"pcie-fatal-error"});
    CHECK(run.verdict.front().pci_address == target.address.to_string());
    CHECK(run.verdict.front().detail == "fatal PCIe errors rose from 0 to 1 (aer_dev_fatal)");
    CHECK(run.state_of() == "failing");
    CHECK(run.rises.fatal == 1);
    const auto since = run.verdict.front().since;
    run.polls(60 * 24 * 2, d0(1, 0, 0), target);  // two quiet days later: still there, unchanged
    CHECK(run.codes() == Codes{"pcie-fatal-error"});
    CHECK(run.verdict.front().since == since);
  }
}

TEST_CASE("non-fatal errors: below the threshold a warning, at it a failure, cleared 24 h later") {
  Run run;
  run.poll(d0(0, 10, 0)).poll(d0(0, 11, 0)).poll(d0(0, 12, 0));
  CHECK(run.codes() == Codes{"pcie-nonfatal-error"});
  CHECK(run.state_of() == "warning");
  run.poll(d0(0, 13, 0));
  CHECK(run.codes() == Codes{"pcie-uncorrectable-errors"});
  CHECK(run.state_of() == "failing");
  CHECK(run.verdict.front().detail ==
        "3 non-fatal PCIe errors within 24 h (health.nonfatal_threshold 3); count 13");
  run.now += std::chrono::hours(22);  // the rises came at +1, +2 and +3 minutes
  run.poll(d0(0, 13, 0));
  CHECK(run.codes() == Codes{"pcie-uncorrectable-errors"});  // still within 24 h of all three
  run.now += std::chrono::minutes(116);
  run.poll(d0(0, 13, 0));  // at +24 h 1 min the first rise is 24 h old: two left, below the threshold
  CHECK(run.codes() == Codes{"pcie-nonfatal-error"});
  run.now += std::chrono::hours(1);
  run.poll(d0(0, 13, 0));
  CHECK(run.codes().empty());
  // A threshold of 5 (health.nonfatal_threshold) and 4 at once: a warning.
  Run five;
  const Settings s{5, std::chrono::seconds(600), {}};
  five.poll(d0(0, 0, 0), kGpu, s).poll(d0(0, 4, 0), kGpu, s);
  CHECK(five.codes() == Codes{"pcie-nonfatal-error"});
}

TEST_CASE("a count that goes down is a re-enumerated device: a new baseline, no alarm") {
  Run run;
  run.poll(d0(3, 40, 500)).poll(d0(0, 0, 2));
  CHECK(run.codes().empty());
  CHECK(run.state.fatal == 0u);
  CHECK(run.state.nonfatal == 0u);
  CHECK(run.rises.fatal == 0);
  run.poll(d0(1, 0, 2));  // and from the new baseline a rise is a rise
  CHECK(run.codes() == Codes{"pcie-fatal-error"});
}

TEST_CASE(
    "a link that trains down: degraded on the third narrow read in D0, recovered after health.recovery") {
  Run run;
  const Settings s{3, std::chrono::seconds(300), {}};
  run.poll(d0(0, 0, 0, 16), kPort, s).polls(2, d0(0, 0, 0, 4), kPort, s);
  CHECK(run.codes().empty());
  run.poll(d0(0, 0, 0, 4), kPort, s);
  CHECK(run.codes() == Codes{"link-degraded"});
  CHECK(run.verdict.front().detail == "link x4 at 32.0 GT/s PCIe on 3 reads in a row in D0, widest seen x16");
  run.polls(3, d0(0, 0, 0, 16), kPort, s);  // back, not yet long enough
  run.poll(d0(0, 0, 0, 8), kPort, s);       // narrow again: the recovery starts over
  run.polls(5, d0(0, 0, 0, 16), kPort, s);
  CHECK(run.codes() == Codes{"link-degraded"});
  run.poll(d0(0, 0, 0, 16), kPort, s);  // five minutes back at x16
  CHECK(run.codes().empty());
  // A link that goes down (x0) counts as narrow.
  Run down;
  down.poll(d0(0, 0, 0, 16), kPort).polls(3, d0(0, 0, 0, 0), kPort);
  CHECK(down.codes() == Codes{"link-degraded"});
  CHECK(down.verdict.front().detail.starts_with("link down (x0)"));
}

TEST_CASE("a sleeping device is never judged on link or config; an idle GPU's speed never") {
  Run run;
  run.poll(d0(0, 0, 0, 16));
  run.polls(10, asleep("D3hot")).polls(10, asleep("D3cold"));
  CHECK(run.codes().empty());
  CHECK(run.memo.narrow_reads == 0);
  CHECK(run.memo.unanswered_reads == 0);
  dh::Reading idle = d0(0, 0, 0, 16);
  idle.speed = "2.5 GT/s PCIe";
  run.polls(10, idle);
  CHECK(run.codes().empty());
  // Asleep between narrow reads neither breaks nor counts: a row is of reads in D0.
  Run row;
  row.poll(d0(0, 0, 0, 16)).polls(2, d0(0, 0, 0, 8)).poll(asleep("D3hot")).poll(d0(0, 0, 0, 8));
  CHECK(row.codes() == Codes{"link-degraded"});
}

TEST_CASE("config space all ones, or unreadable, on three reads in a row in D0: unresponsive, latched") {
  dh::Reading ones = d0(0, 0, 0);
  ones.config = dh::ConfigAnswer::all_ones;
  ones.width.reset();  // the link reads 63 then: unknown
  dh::Reading failed = ones;
  failed.config = dh::ConfigAnswer::failed;
  failed.config_error = "Input/output error";
  Run run;
  run.poll(d0(0, 0, 0)).polls(2, ones).poll(d0(0, 0, 0)).polls(2, failed);
  CHECK(run.codes().empty());  // never three in a row
  run.poll(failed);
  CHECK(run.codes() == Codes{"device-unresponsive"});
  CHECK(run.verdict.front().detail ==
        "config space could not be read (Input/output error) on 3 reads in a row in D0");
  run.polls(5, d0(0, 0, 0));
  CHECK(run.codes() == Codes{"device-unresponsive"});  // latched: a person looks at it
  Run port;                                            // the port's config is not the GPU's: not judged
  port.polls(5, ones, kPort);
  CHECK(port.codes().empty());
}

TEST_CASE("a file that cannot be read is unknown this poll: neither good nor bad") {
  dh::Reading unknown = d0(0, 0, 0);
  unknown.counts = {};
  unknown.width.reset();
  Run run;
  run.poll(d0(2, 2, 2, 16)).polls(5, unknown);
  CHECK(run.codes().empty());
  CHECK(run.state.fatal == 2u);  // the baseline kept
  run.poll(d0(3, 2, 2, 16));
  CHECK(run.codes() == Codes{"pcie-fatal-error"});
}

TEST_CASE("no AER files: the warning aer-not-monitored, on GPUs only") {
  dh::Reading quiet = d0(0, 0, 0);
  quiet.counts = {};
  quiet.aer_monitored = false;
  Run gpu, audio;
  gpu.poll(quiet);
  audio.poll(quiet, kAudio);
  CHECK(gpu.codes() == Codes{"aer-not-monitored"});
  CHECK(gpu.state_of() == "warning");
  CHECK(audio.codes().empty());
}

TEST_CASE("correctable errors: a warning only past 8 a minute over 10 minutes") {
  Run slow, fast;
  for (std::uint64_t i = 0; i <= 12; ++i) slow.poll(d0(0, 0, 8 * i));
  CHECK(slow.codes().empty());
  for (std::uint64_t i = 0; i <= 12; ++i) fast.poll(d0(0, 0, 9 * i));
  CHECK(fast.codes() == Codes{"pcie-correctable-errors"});
  CHECK(fast.state_of() == "warning");
  CHECK(fast.rises.correctable == 108);
  fast.polls(11, d0(0, 0, 108));
  CHECK(fast.codes().empty());
  CHECK(fast.memo.correctable_at.size() <= kMaxSamples);
}

TEST_CASE("health.ignore shows a failing code as a warning; what makes a unit.health event") {
  Run run;
  const Settings ignore{3, std::chrono::seconds(600), {"pcie-fatal-error"}};
  run.poll(d0(0, 0, 0)).poll(d0(1, 0, 0));
  CHECK(run.state_of(ignore) == "warning");
  CHECK(run.state_of() == "failing");
  CHECK(reportable({}, run.verdict, Settings{}));
  CHECK(reportable({}, run.verdict, ignore));  // ok -> warning is a change of state
  Verdict later = run.verdict;
  later.push_back({"aer-not-monitored", "0000:41:00.0", "x", kStart});
  CHECK_FALSE(reportable(run.verdict, later, Settings{}));  // a warning more on a failing unit
  CHECK(unit_health(later, Settings{}).reasons.back().since == "2027-01-15T08:00:00Z");
}

TEST_CASE("a clear begins again from the last reading") {
  dh::Reading last = d0(4, 9, 70, 8);
  const auto s = cleared(last);
  CHECK(s.fatal == 4u);
  CHECK(s.nonfatal == 9u);
  CHECK(s.widest == 8);
  CHECK(s.nonfatal_rises.empty());
  CHECK_FALSE(s.degraded_since);
  CHECK(standing(s, {}, last, kGpu, kStart, Settings{}).empty());
  CHECK_FALSE(cleared(asleep("D3cold")).widest);  // a width not read in D0 is not taken
}

TEST_CASE("what is kept reads back as it was written; a document it did not write is refused") {
  Run run;
  run.poll(d0(0, 0, 0, 16), kPort).poll(d0(1, 1, 0, 16), kPort).polls(3, d0(1, 1, 0, 4), kPort);
  const auto back = device_state_from_json(boost::json::value(to_json(run.state)));
  REQUIRE(back);
  CHECK(*back == run.state);
  const auto verdict = verdict_from_json(boost::json::value(to_json(run.verdict)));
  REQUIRE(verdict);
  CHECK(*verdict == run.verdict);
  CHECK_FALSE(device_state_from_json(boost::json::parse(R"({"fatal": "x"})")));
  CHECK_FALSE(device_state_from_json(boost::json::parse(R"({"widest": 64})")));
  CHECK_FALSE(device_state_from_json(boost::json::parse(R"({"nonfatalRises": [["yesterday", 1]]})")));
  CHECK_FALSE(verdict_from_json(boost::json::parse(R"([{"code": "pcie-fatal-error"}])")));
  CHECK_FALSE(verdict_from_json(boost::json::parse(R"({})")));
}
