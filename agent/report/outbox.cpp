// The reporter's reads and deletes of the outbox (see outbox.hpp).
#include "gpunode/report/outbox.hpp"

#include <charconv>
#include <system_error>

namespace gpunode::report {

error::Result<Outbox> Outbox::open(const std::filesystem::path& state_db) {
  std::error_code ec;
  if (!std::filesystem::exists(state_db, ec))
    return error::fail(error::Errc::not_found, state_db.string() + ": no such file");
  auto db = store::Database::open(state_db);
  if (!db) return std::unexpected(db.error());
  return Outbox(std::move(*db));
}

std::string Outbox::describe(const error::Error& e) {
  return e.origin == error::Native::sqlite ? e.to_string() : e.detail;
}

error::Result<std::optional<std::int64_t>> Outbox::single(std::string_view sql) {
  auto st = db_.prepare(sql);
  if (!st) return std::unexpected(st.error());
  auto step = st->step();
  if (!step) return std::unexpected(step.error());
  if (*step == store::Statement::Step::done) return std::optional<std::int64_t>{};
  return st->column_optional_int64(0);
}

error::Result<std::int64_t> Outbox::acknowledged() {
  auto first = single("SELECT min(seq) FROM outbox");
  if (!first) return std::unexpected(first.error());
  if (*first) return **first - 1;
  // The service's counter of events written; the outbox being empty, each was acknowledged.
  auto st = db_.prepare("SELECT value FROM meta WHERE key = 'event_seq'");
  if (!st) return std::unexpected(st.error());
  auto step = st->step();
  if (!step) return std::unexpected(step.error());
  if (*step == store::Statement::Step::done) return 0;
  const std::string text = st->column_text(0);
  std::int64_t n = 0;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (err != std::errc() || end != text.data() + text.size() || n < 0) return 0;
  return n;
}

error::Result<Outbox::Read> Outbox::read_batch(std::int64_t after, BatchBuilder& batch) {
  // LIMIT bounds what SQLite hands over; the builder stops earlier on bytes.
  auto st = db_.prepare("SELECT seq, event FROM outbox WHERE seq > ?1 ORDER BY seq LIMIT ?2");
  if (!st) return std::unexpected(st.error());
  if (auto b = st->bind_all(after, static_cast<std::int64_t>(Limits::kBatchEvents)); !b)
    return std::unexpected(b.error());
  for (;;) {
    auto step = st->step();
    if (!step) return std::unexpected(step.error());
    if (*step == store::Statement::Step::done) return Read{};
    const auto added = batch.add(st->column_int64(0), st->column_text(1));
    if (!added) return Read{added.error()};
    if (*added == BatchBuilder::Add::full) return Read{};
  }
}

error::Result<std::int64_t> Outbox::delete_through(std::int64_t seq) {
  auto done = db_.transaction([&](store::Tx& tx) -> std::expected<std::int64_t, store::DbError> {
    auto st = tx.prepare("DELETE FROM outbox WHERE seq <= ?1");
    if (!st) return std::unexpected(st.error());
    if (auto b = st->bind(1, seq); !b) return std::unexpected(b.error());
    if (auto r = st->run(); !r) return std::unexpected(r.error());
    return tx.database().changes();
  });
  if (!done) return std::unexpected(done.error());
  return *done;
}

error::Result<OutboxStats> Outbox::stats() {
  // Two statements: SQLite answers min() and max() of the rowid from the b-tree's ends only when
  // each stands alone in its query.
  auto first = single("SELECT min(seq) FROM outbox");
  if (!first) return std::unexpected(first.error());
  auto last = single("SELECT max(seq) FROM outbox");
  if (!last) return std::unexpected(last.error());
  OutboxStats s;
  if (!*first || !*last) return s;
  s.first_seq = **first;
  s.last_seq = **last;
  s.depth = s.last_seq - s.first_seq + 1;
  auto st = db_.prepare("SELECT event FROM outbox WHERE seq = ?1");
  if (!st) return std::unexpected(st.error());
  if (auto b = st->bind(1, s.first_seq); !b) return std::unexpected(b.error());
  auto step = st->step();
  if (!step) return std::unexpected(step.error());
  if (*step == store::Statement::Step::row) s.oldest_at = event_at(st->column_text(0));
  return s;
}

}  // namespace gpunode::report
