// StateStore's signed audit checkpoints (CONTRACT §12): the table `checkpoints` (migration 4) and
// the audit.checkpoint event, written together.
#include <fmt/format.h>

#include "state_store.hpp"

namespace gpunode::service::detail {
namespace json = boost::json;
using store::DbError;

std::expected<std::int64_t, DbError> StateStore::last_checkpoint_seq() {
  auto st = cached("SELECT coalesce(max(seq), 0) FROM checkpoints");
  if (!st) return std::unexpected(st.error());
  auto step = (*st)->step();
  if (!step) return std::unexpected(step.error());
  const std::int64_t seq = *step == store::Statement::Step::row ? (*st)->column_int64(0) : 0;
  (*st)->reset();
  return seq;
}

std::expected<std::optional<std::pair<std::int64_t, std::string>>, DbError> StateStore::last_checkpoint() {
  auto st = cached("SELECT seq, checkpoint FROM checkpoints ORDER BY seq DESC LIMIT 1");
  if (!st) return std::unexpected(st.error());
  auto step = (*st)->step();
  if (!step) return std::unexpected(step.error());
  std::optional<std::pair<std::int64_t, std::string>> out;
  if (*step == store::Statement::Step::row) out.emplace((*st)->column_int64(0), (*st)->column_text(1));
  (*st)->reset();
  return out;
}

std::expected<void, DbError> StateStore::commit_checkpoint(const json::object& checkpoint,
                                                           std::string_view at,
                                                           std::chrono::system_clock::time_point wall) {
  const auto* seq = checkpoint.if_contains("seq");
  if (seq == nullptr || !seq->is_int64())
    return std::unexpected(DbError{error::Errc::internal, "a checkpoint without an integer seq"});
  const std::int64_t ev = event_seq_ + 1;
  const json::object event{{"seq", ev},
                           {"id", new_id("evt_", wall)},
                           {"type", "audit.checkpoint"},
                           {"at", at},
                           {"data", checkpoint}};
  auto done = db_.transaction([&](store::Tx&) -> std::expected<void, DbError> {
    const auto run = [&](std::string_view sql, const auto&... args) -> std::expected<void, DbError> {
      auto st = cached(sql);
      if (!st) return std::unexpected(st.error());
      if (auto b = (*st)->bind_all(args...); !b) return std::unexpected(b.error());
      return (*st)->run();
    };
    if (auto w = run("INSERT INTO checkpoints (seq, checkpoint) VALUES (?1, ?2)", seq->get_int64(),
                     json::serialize(checkpoint));
        !w)
      return w;
    if (auto w = run("INSERT INTO outbox (seq, event) VALUES (?1, ?2)", ev, json::serialize(event)); !w)
      return w;
    return run("UPDATE meta SET value = ?2 WHERE key = ?1", "event_seq", std::to_string(ev));
  });
  if (!done) return std::unexpected(done.error());
  event_seq_ = ev;
  return {};
}

std::expected<std::vector<std::pair<std::int64_t, std::string>>, DbError> StateStore::checkpoints_after(
    std::int64_t after_seq, std::size_t limit) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  auto st = cached("SELECT seq, checkpoint FROM checkpoints WHERE seq > ?1 ORDER BY seq LIMIT ?2");
  if (!st) return std::unexpected(st.error());
  if (auto b = (*st)->bind_all(after_seq, static_cast<std::int64_t>(limit)); !b)
    return std::unexpected(b.error());
  while (true) {
    auto step = (*st)->step();
    if (!step) return std::unexpected(step.error());
    if (*step == store::Statement::Step::done) break;
    out.emplace_back((*st)->column_int64(0), (*st)->column_text(1));
  }
  (*st)->reset();
  return out;
}

}  // namespace gpunode::service::detail
