// gpunode/report/policy.hpp: the pure rules of reporting to the central API (CONTRACT §6): what
// to wait after a failure, how an answer is classified, what an acknowledgement allows to delete,
// how a batch of outbox events becomes a request body, and the heartbeat's body. No I/O, no
// clock, no randomness of its own (the caller passes a random number in), so a table of cases
// tests each rule.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>

#include "gpunode/error/error.hpp"

namespace gpunode::report {

using std::chrono::milliseconds;

// The constants, and why:
// - Batches of at most 500 events or 1 MiB of body (whichever comes first; one event is always
//   sent even if it alone is larger). An event is a few hundred bytes (an inventory.changed of a
//   64-GPU host is ~100 KB), so 500 typical events are ~0.3 MiB: a backlog of 100,000 events after
//   a day's outage drains in 200 round trips, while a request stays far below the body limits
//   proxies and API servers set (1 MiB is nginx's default client_max_body_size) and the agent
//   holds at most one batch in memory (the rows and the body: ~2 MiB), however deep the outbox.
// - Backoff: full jitter (a wait drawn uniformly from [0, min(60 s, 0.5 s * 2^attempt)]), as in
//   "Exponential Backoff And Jitter" (AWS architecture blog): a fleet of agents that lost the
//   central API together does not come back in lockstep. 0.5 s first, so a blip costs under a
//   second; 60 s at most, so a recovered API is used within a minute.
// - Retry-After (seconds form) is honoured on any failed answer, capped at 5 minutes so that a
//   wrong header cannot park the agent for hours.
// - Any other 4xx (and a 3xx, which is not followed) means the request itself is refused: it is
//   held and tried again every 5 minutes (or after Retry-After), with an error in the log each
//   time, since only a person can fix it and the events must never be dropped.
struct Limits {
  static constexpr std::size_t kBatchEvents = 500;
  static constexpr std::size_t kBatchBytes = std::size_t{1} << 20;
  static constexpr milliseconds kBackoffBase{500};
  static constexpr milliseconds kBackoffCap{60'000};
  static constexpr milliseconds kRetryAfterCap{300'000};
  static constexpr milliseconds kHold{300'000};
  static constexpr std::size_t kAnswerBytes = 64 * 1024;  // an ack is a few bytes; more is refused
};

// Why an attempt failed; the label is gpunode_central_delivery_failures_total's `reason`.
enum class Failure { transport, server_error, rate_limited, rejected };
inline constexpr std::size_t kFailureKinds = 4;
std::string_view label(Failure f);  // "transport", "5xx", "429", "4xx"

// An HTTP status that is not 2xx -> its class (429, 5xx, anything else: 4xx).
Failure classify_status(unsigned status);

// "120" -> 120 s. Only the delay-seconds form (RFC 9110 §10.2.3); an HTTP-date, a negative or
// a malformed value gives nullopt (the caller then backs off on its own). Capped at kRetryAfterCap.
std::optional<milliseconds> parse_retry_after(std::string_view value);

// The upper bound of the full-jitter wait after `attempt` consecutive failures (1 for the first):
// min(kBackoffCap, kBackoffBase * 2^(attempt-1)).
milliseconds backoff_ceiling(unsigned attempt);
// A wait drawn from [0, backoff_ceiling(attempt)] by `random`, a uniformly random 64-bit number.
milliseconds full_jitter(unsigned attempt, std::uint64_t random);

// What to wait before the next attempt after a failure: Retry-After when the answer had one;
// else for a refused request (4xx) kHold; else the full-jitter backoff.
milliseconds retry_delay(Failure f, unsigned attempt, std::optional<milliseconds> retry_after,
                         std::uint64_t random);

// {"ackedSeq": N} -> N (unknown keys ignored). Never throws; an error says what is wrong.
error::Result<std::int64_t> parse_ack(std::string_view body);

// What an acknowledgement means for a batch of seqs (base, last]: `base` is the highest seq
// known acknowledged (every event up to it is gone from the outbox), `last` the last one sent.
struct AckVerdict {
  enum class Kind {
    progress,   // base < acked <= last: delete through `acked` (a partial ack resends the rest)
    nothing,    // acked == base: the central API stored none of it; try again after a backoff
    beyond,     // acked > last: it claims what was never sent (a reset state dir?): protocol error
    backwards,  // acked < base: it forgot what it acknowledged before: protocol error
  } kind;
  std::int64_t acked = 0;
};
AckVerdict judge_ack(std::int64_t base, std::int64_t last, std::int64_t acked);

// Builds the body {"nodeId": ..., "events": [...]} from outbox rows, each row's stored JSON sent
// as it is (byte for byte) once it has been checked to be an object whose "seq" is the row's.
// Limits: kBatchEvents events and kBatchBytes of body, the first row always taken.
class BatchBuilder {
 public:
  explicit BatchBuilder(std::string_view node_id, std::size_t max_events = Limits::kBatchEvents,
                        std::size_t max_bytes = Limits::kBatchBytes);
  enum class Add { taken, full };
  // `full`: the batch is complete without this row (send it; the row comes first next time).
  // An error (corrupt, the detail saying why) when the row is not a valid event; nothing was added.
  error::Result<Add> add(std::int64_t seq, std::string_view event);
  [[nodiscard]] std::size_t count() const { return count_; }
  [[nodiscard]] std::int64_t first() const { return first_; }
  [[nodiscard]] std::int64_t last() const { return last_; }
  // The body; the builder is spent afterwards.
  std::string finish();

 private:
  std::size_t max_events_, max_bytes_;
  std::string body_;
  std::size_t count_ = 0;
  std::int64_t first_ = 0, last_ = 0;
};

// The "at" of a stored event, or nullopt when it has none (or is not JSON).
std::optional<std::string> event_at(std::string_view event);

// The heartbeat's body (CONTRACT §6): every key always present.
struct Heartbeat {
  std::string node_id;
  std::string at;  // RFC 3339 UTC
  std::string version;
  std::int64_t revision = 0;
  std::int64_t outbox_depth = 0;
  std::optional<std::string> oldest_undelivered_at;  // null when the outbox is empty
  bool libvirt_connected = false;
  std::string audit_key;  // PEM (CONTRACT §12)
};
std::string heartbeat_body(const Heartbeat& h);

}  // namespace gpunode::report
