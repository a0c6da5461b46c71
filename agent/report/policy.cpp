// The pure rules of reporting (see policy.hpp).
#include "gpunode/report/policy.hpp"

#include <algorithm>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>
#include <charconv>

namespace gpunode::report {
namespace json = boost::json;

std::string_view label(Failure f) {
  switch (f) {
    case Failure::transport:
      return "transport";
    case Failure::server_error:
      return "5xx";
    case Failure::rate_limited:
      return "429";
    case Failure::rejected:
      return "4xx";
  }
  return "transport";
}

Failure classify_status(unsigned status) {
  if (status == 429) return Failure::rate_limited;
  if (status >= 500 && status <= 599) return Failure::server_error;
  return Failure::rejected;
}

std::optional<milliseconds> parse_retry_after(std::string_view value) {
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
  if (value.empty() || value.size() > 12) return std::nullopt;  // more digits than any sane delay
  std::uint64_t seconds = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
  if (ec != std::errc() || end != value.data() + value.size()) return std::nullopt;
  const std::uint64_t cap = static_cast<std::uint64_t>(Limits::kRetryAfterCap.count() / 1000);
  return milliseconds(static_cast<std::int64_t>(std::min(seconds, cap)) * 1000);
}

milliseconds backoff_ceiling(unsigned attempt) {
  const unsigned doublings = attempt == 0 ? 0 : attempt - 1;
  // 0.5 s * 2^7 = 64 s is past the cap already: no overflow for any attempt count.
  if (doublings >= 7) return Limits::kBackoffCap;
  return std::min(Limits::kBackoffCap, Limits::kBackoffBase * (std::int64_t{1} << doublings));
}

milliseconds full_jitter(unsigned attempt, std::uint64_t random) {
  const auto ceiling = static_cast<std::uint64_t>(backoff_ceiling(attempt).count());
  return milliseconds(static_cast<std::int64_t>(random % (ceiling + 1)));
}

milliseconds retry_delay(Failure f, unsigned attempt, std::optional<milliseconds> retry_after,
                         std::uint64_t random) {
  if (retry_after) return std::min(*retry_after, Limits::kRetryAfterCap);
  if (f == Failure::rejected) return Limits::kHold;
  return full_jitter(attempt, random);
}

error::Result<std::int64_t> parse_ack(std::string_view body) {
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  if (ec) return error::fail(error::Errc::protocol, "the answer is not JSON: " + ec.message());
  const json::object* o = v.if_object();
  if (o == nullptr) return error::fail(error::Errc::protocol, "the answer is not a JSON object");
  const json::value* acked = o->if_contains("ackedSeq");
  if (acked == nullptr) return error::fail(error::Errc::protocol, "the answer has no ackedSeq");
  if (!acked->is_int64() && !acked->is_uint64())
    return error::fail(error::Errc::protocol, "ackedSeq is not an integer");
  const auto n = acked->to_number<std::int64_t>(ec);
  if (ec || n < 0) return error::fail(error::Errc::protocol, "ackedSeq is out of range");
  return n;
}

AckVerdict judge_ack(std::int64_t base, std::int64_t last, std::int64_t acked) {
  using K = AckVerdict::Kind;
  if (acked < base) return {K::backwards, acked};
  if (acked == base) return {K::nothing, acked};
  if (acked > last) return {K::beyond, acked};
  return {K::progress, acked};
}

BatchBuilder::BatchBuilder(std::string_view node_id, std::size_t max_events, std::size_t max_bytes)
    : max_events_(std::max<std::size_t>(1, max_events)), max_bytes_(max_bytes) {
  body_ = "{\"nodeId\":" + json::serialize(json::value(json::string_view(node_id.data(), node_id.size()))) +
          ",\"events\":[";
}

error::Result<BatchBuilder::Add> BatchBuilder::add(std::int64_t seq, std::string_view event) {
  if (count_ >= max_events_) return Add::full;
  constexpr std::size_t kClose = 2;  // "]}"
  if (count_ > 0 && body_.size() + 1 + event.size() + kClose > max_bytes_) return Add::full;
  boost::system::error_code ec;
  const json::value v = json::parse(event, ec);
  const json::object* o = ec ? nullptr : v.if_object();
  const json::value* s = o ? o->if_contains("seq") : nullptr;
  if (o == nullptr)
    return error::fail(error::Errc::corrupt, "outbox row " + std::to_string(seq) + " is not a JSON object");
  if (s == nullptr || !s->is_int64() || s->get_int64() != seq) {
    return error::fail(error::Errc::corrupt, "outbox row " + std::to_string(seq) +
                                                 " holds an event whose seq is not " + std::to_string(seq));
  }
  if (count_ > 0) body_ += ',';
  body_ += event;
  if (count_ == 0) first_ = seq;
  last_ = seq;
  ++count_;
  return Add::taken;
}

std::string BatchBuilder::finish() {
  body_ += "]}";
  return std::move(body_);
}

std::optional<std::string> event_at(std::string_view event) {
  boost::system::error_code ec;
  const json::value v = json::parse(event, ec);
  const json::object* o = ec ? nullptr : v.if_object();
  const json::value* at = o ? o->if_contains("at") : nullptr;
  if (at == nullptr || !at->is_string()) return std::nullopt;
  return std::string(at->get_string());
}

std::string heartbeat_body(const Heartbeat& h) {
  json::object o;
  o["nodeId"] = h.node_id;
  o["at"] = h.at;
  o["version"] = h.version;
  o["revision"] = h.revision;
  o["outboxDepth"] = h.outbox_depth;
  o["oldestUndeliveredAt"] =
      h.oldest_undelivered_at ? json::value(*h.oldest_undelivered_at) : json::value(nullptr);
  o["libvirt"] = h.libvirt_connected ? "connected" : "disconnected";
  o["auditKey"] = h.audit_key;
  return json::serialize(o);
}

}  // namespace gpunode::report
