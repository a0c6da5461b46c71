// gpunode/report/outbox.hpp: the reporter's own connection to the outbox table of state.db
// (written by the NodeService, CONTRACT §6: `outbox (seq INTEGER PRIMARY KEY, event TEXT)`, seq
// dense from 1, each event stored in the transaction of its change).
//
// The table is the truth: the reporter keeps nothing of it in memory but one batch, and after a
// restart it reads where the table says. Rows are deleted only through an acknowledged seq, in
// one short write transaction. WAL lets these reads run beside the core thread's commits; the
// connection's busy timeout (5 s) covers a commit in progress. Not thread-safe: one thread.
#pragma once

#include <cstdint>
#include <expected>
#include <filesystem>
#include <optional>
#include <string>

#include "gpunode/error/error.hpp"
#include "gpunode/report/policy.hpp"
#include "gpunode/store/database.hpp"

namespace gpunode::report {

struct OutboxStats {
  std::int64_t depth = 0;                // undelivered events
  std::int64_t first_seq = 0;            // the oldest undelivered (0 when empty)
  std::int64_t last_seq = 0;             // the newest (0 when empty)
  std::optional<std::string> oldest_at;  // the oldest undelivered event's "at"
};

class Outbox {
 public:
  // Opens an existing state.db (its schema is the NodeService's; this never migrates it).
  static error::Result<Outbox> open(const std::filesystem::path& state_db);

  // The highest seq known to be acknowledged: every event up to it has left the outbox. That is
  // the oldest row's seq - 1, or, with the outbox empty, the last seq ever written (meta
  // `event_seq`), or 0.
  error::Result<std::int64_t> acknowledged();
  // Fills `batch` with the rows after `after`, in seq order, until it is full.
  // `bad` is the refusal of a row that is not a valid event (the batch then holds the rows before
  // it).
  struct Read {
    std::optional<error::Error> bad;
  };
  error::Result<Read> read_batch(std::int64_t after, BatchBuilder& batch);
  // Deletes every row with seq <= `seq` (one transaction). Returns the rows deleted.
  error::Result<std::int64_t> delete_through(std::int64_t seq);
  // Depth from min(seq) and max(seq) (each an O(log n) look-up: seq is the rowid and dense, and
  // only prefixes are deleted), so it costs the same for 10 or 10 million waiting events.
  error::Result<OutboxStats> stats();

  // One of these errors as the log tells it: the store's with SQLite's code (to_string()), open's
  // own "no such file" as its detail.
  static std::string describe(const error::Error& e);

 private:
  explicit Outbox(store::Database db) : db_(std::move(db)) {}
  error::Result<std::optional<std::int64_t>> single(std::string_view sql);
  store::Database db_;
};

}  // namespace gpunode::report
