// Unit tests of gpunode::report's pure rules (CONTRACT §6): backoff with full jitter and
// Retry-After, the classes of failure, acknowledgements, batches and the heartbeat's body.
#include "gpunode/report/policy.hpp"

#include <doctest/doctest.h>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <limits>
#include <string>

namespace {

using namespace std::chrono_literals;
using gpunode::report::AckVerdict;
using gpunode::report::BatchBuilder;
using gpunode::report::Failure;
using gpunode::report::Limits;
namespace report = gpunode::report;
namespace json = boost::json;

constexpr std::uint64_t kMaxRandom = std::numeric_limits<std::uint64_t>::max();

std::string event(std::int64_t seq, std::size_t pad = 0) {
  return R"({"seq":)" + std::to_string(seq) + R"(,"id":"evt_)" + std::to_string(seq) +
         R"(","type":"reservation.created","at":"2027-01-31T00:00:00Z","data":{"p":")" +
         std::string(pad, 'x') + R"("}})";
}

}  // namespace

TEST_CASE("backoff: the ceiling doubles from 0.5 s and stops at 60 s") {
  CHECK(report::backoff_ceiling(1) == 500ms);
  CHECK(report::backoff_ceiling(2) == 1000ms);
  CHECK(report::backoff_ceiling(3) == 2000ms);
  CHECK(report::backoff_ceiling(7) == 32000ms);
  CHECK(report::backoff_ceiling(8) == 60000ms);
  CHECK(report::backoff_ceiling(1000) == 60000ms);
  CHECK(report::backoff_ceiling(0) == 500ms);
}

TEST_CASE("full jitter: uniform over [0, ceiling], both ends reachable") {
  CHECK(report::full_jitter(1, 0) == 0ms);
  CHECK(report::full_jitter(1, 500) == 500ms);
  CHECK(report::full_jitter(1, 501) == 0ms);
  CHECK(report::full_jitter(3, 1234) == 1234ms);
  CHECK(report::full_jitter(50, kMaxRandom) <= 60000ms);
  for (std::uint64_t r = 0; r < 5000; r += 7)
    CHECK(report::full_jitter(4, r * 0x9e3779b97f4a7c15ULL) <= 4000ms);
}

TEST_CASE("Retry-After: delay-seconds only, capped at 5 minutes") {
  CHECK(report::parse_retry_after("1") == 1000ms);
  CHECK(report::parse_retry_after(" 30 ") == 30000ms);
  CHECK(report::parse_retry_after("0") == 0ms);
  CHECK(report::parse_retry_after("300") == 300000ms);
  CHECK(report::parse_retry_after("86400") == 300000ms);
  CHECK(report::parse_retry_after("99999999999999999999") == std::nullopt);
  CHECK(report::parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == std::nullopt);
  CHECK(report::parse_retry_after("-5") == std::nullopt);
  CHECK(report::parse_retry_after("1.5") == std::nullopt);
  CHECK(report::parse_retry_after("") == std::nullopt);
}

TEST_CASE("status classes and their metric labels") {
  CHECK(report::classify_status(429) == Failure::rate_limited);
  CHECK(report::classify_status(500) == Failure::server_error);
  CHECK(report::classify_status(503) == Failure::server_error);
  CHECK(report::classify_status(400) == Failure::rejected);
  CHECK(report::classify_status(404) == Failure::rejected);
  CHECK(report::classify_status(301) == Failure::rejected);  // redirects are not followed
  CHECK(report::label(Failure::transport) == "transport");
  CHECK(report::label(Failure::server_error) == "5xx");
  CHECK(report::label(Failure::rate_limited) == "429");
  CHECK(report::label(Failure::rejected) == "4xx");
}

TEST_CASE("retry_delay: Retry-After wins, a refused request is held 5 minutes, the rest back off") {
  CHECK(report::retry_delay(Failure::rate_limited, 1, 1000ms, 0) == 1000ms);
  CHECK(report::retry_delay(Failure::server_error, 9, 2000ms, kMaxRandom) == 2000ms);
  CHECK(report::retry_delay(Failure::rejected, 1, 1000ms, 0) == 1000ms);
  CHECK(report::retry_delay(Failure::rejected, 1, std::nullopt, 0) == 300000ms);
  CHECK(report::retry_delay(Failure::rate_limited, 1, 3600000ms, 0) == 300000ms);
  CHECK(report::retry_delay(Failure::transport, 2, std::nullopt, 700) == 700ms);
  CHECK(report::retry_delay(Failure::server_error, 1, std::nullopt, 999) <= 500ms);
}

TEST_CASE("acknowledgements: progress, nothing, beyond what was sent, backwards") {
  // sent (10, 20]
  CHECK(report::judge_ack(10, 20, 20).kind == AckVerdict::Kind::progress);
  CHECK(report::judge_ack(10, 20, 15).kind == AckVerdict::Kind::progress);  // partial: 16..20 again
  CHECK(report::judge_ack(10, 20, 15).acked == 15);
  CHECK(report::judge_ack(10, 20, 11).kind == AckVerdict::Kind::progress);
  CHECK(report::judge_ack(10, 20, 10).kind == AckVerdict::Kind::nothing);
  CHECK(report::judge_ack(10, 20, 21).kind == AckVerdict::Kind::beyond);
  CHECK(report::judge_ack(10, 20, 9).kind == AckVerdict::Kind::backwards);
  CHECK(report::judge_ack(0, 1, 1).kind == AckVerdict::Kind::progress);
}

TEST_CASE("parse_ack: {\"ackedSeq\": N}, unknown keys ignored, nothing else") {
  CHECK(report::parse_ack(R"({"ackedSeq": 42})") == 42);
  CHECK(report::parse_ack(R"({"ackedSeq": 0, "extra": [1, 2]})") == 0);
  CHECK(report::parse_ack(R"({"ackedSeq": 9223372036854775807})") == 9223372036854775807);
  CHECK(!report::parse_ack(R"({"ackedSeq": 18446744073709551615})"));
  CHECK(!report::parse_ack(R"({"ackedSeq": -1})"));
  CHECK(!report::parse_ack(R"({"ackedSeq": 1.5})"));
  CHECK(!report::parse_ack(R"({"ackedSeq": "7"})"));
  CHECK(!report::parse_ack(R"({"acked": 7})"));
  CHECK(!report::parse_ack(R"([7])"));
  CHECK(!report::parse_ack("<html>bad gateway</html>"));
  CHECK(!report::parse_ack(""));
  CHECK(report::parse_ack("{\"ackedSeq\": 3").error().detail.starts_with("the answer is not JSON"));
}

TEST_CASE("batches: the stored events byte for byte, in order, under the event and byte limits") {
  BatchBuilder b("node-1", 3, 1 << 20);
  CHECK(b.add(5, event(5)) == BatchBuilder::Add::taken);
  CHECK(b.add(6, event(6)) == BatchBuilder::Add::taken);
  CHECK(b.add(7, event(7)) == BatchBuilder::Add::taken);
  CHECK(b.add(8, event(8)) == BatchBuilder::Add::full);
  CHECK(b.count() == 3);
  CHECK(b.first() == 5);
  CHECK(b.last() == 7);
  const std::string body = b.finish();
  CHECK(body == R"({"nodeId":"node-1","events":[)" + event(5) + "," + event(6) + "," + event(7) + "]}");
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  REQUIRE(!ec);
  CHECK(v.at("events").as_array().size() == 3);
}

TEST_CASE("batches: the byte limit leaves the next event for the next batch, but one event always goes") {
  const std::string big = event(1, 600);
  BatchBuilder b("n", 500, 1000);
  CHECK(b.add(1, big) == BatchBuilder::Add::taken);
  CHECK(b.add(2, event(2, 600)) == BatchBuilder::Add::full);
  CHECK(b.count() == 1);
  BatchBuilder huge("n", 500, 100);
  CHECK(huge.add(1, big) == BatchBuilder::Add::taken);  // alone over the limit: still sent
  CHECK(huge.finish().size() > 100);
  // The default limits are the documented ones.
  BatchBuilder d("n");
  for (std::int64_t s = 1; s <= 500; ++s) REQUIRE(d.add(s, event(s)) == BatchBuilder::Add::taken);
  CHECK(d.add(501, event(501)) == BatchBuilder::Add::full);
  BatchBuilder bytes("n");
  std::int64_t s = 1;
  while (bytes.add(s, event(s, 10000)) == BatchBuilder::Add::taken) ++s;
  CHECK(bytes.count() < 500);
  CHECK(bytes.finish().size() <= Limits::kBatchBytes);
}

TEST_CASE("batches: a row that is not the event it should be is refused, never sent") {
  BatchBuilder b("n");
  CHECK(b.add(1, event(1)) == BatchBuilder::Add::taken);
  const auto not_json = b.add(2, "{not json");
  REQUIRE(!not_json);
  CHECK(not_json.error().detail == "outbox row 2 is not a JSON object");
  CHECK(not_json.error().code == gpunode::error::Errc::corrupt);
  const auto other_seq = b.add(2, event(3));
  REQUIRE(!other_seq);
  CHECK(other_seq.error().detail == "outbox row 2 holds an event whose seq is not 2");
  CHECK(!b.add(2, "[1]"));
  CHECK(b.count() == 1);
  CHECK(b.last() == 1);
}

TEST_CASE("a node id that needs escaping stays valid JSON") {
  BatchBuilder b("we\"ird\\");
  CHECK(b.add(1, event(1)) == BatchBuilder::Add::taken);
  boost::system::error_code ec;
  const json::value v = json::parse(b.finish(), ec);
  REQUIRE(!ec);
  CHECK(v.at("nodeId").as_string() == "we\"ird\\");
}

TEST_CASE("event_at and the heartbeat body") {
  CHECK(report::event_at(event(1)) == "2027-01-31T00:00:00Z");
  CHECK(report::event_at("{}") == std::nullopt);
  CHECK(report::event_at("{\"at\": 5}") == std::nullopt);
  CHECK(report::event_at("nope") == std::nullopt);
  report::Heartbeat h{"node-1", "2027-01-31T00:00:00Z", "0.1.0", 42,
                      7,        "2027-01-30T23:00:00Z", true,    "PEM\n"};
  CHECK(report::heartbeat_body(h) ==
        R"({"nodeId":"node-1","at":"2027-01-31T00:00:00Z","version":"0.1.0","revision":42,"outboxDepth":7,)"
        R"("oldestUndeliveredAt":"2027-01-30T23:00:00Z","libvirt":"connected","auditKey":"PEM\n"})");
  h.oldest_undelivered_at.reset();
  h.outbox_depth = 0;
  h.libvirt_connected = false;
  CHECK(report::heartbeat_body(h) ==
        R"({"nodeId":"node-1","at":"2027-01-31T00:00:00Z","version":"0.1.0","revision":42,"outboxDepth":0,)"
        R"("oldestUndeliveredAt":null,"libvirt":"disconnected","auditKey":"PEM\n"})");
}
