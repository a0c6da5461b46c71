// Database::migrate (see the header): the versions in schema_version against the agent's list
// of migrations, and each missing one applied in its own transaction with its record.
#include <fmt/format.h>
#include <sqlite3.h>

#include <climits>
#include <string>
#include <vector>

#include "gpunode/store/database.hpp"

namespace gpunode::store {
namespace {

// Authorizer used while a migration's SQL runs: BEGIN/COMMIT/ROLLBACK inside it would end the
// migration's transaction early, so it is refused when prepared (nothing of it runs).
int deny_transaction_statements(void*, int action, const char*, const char*, const char*, const char*) {
  return action == SQLITE_TRANSACTION ? SQLITE_DENY : SQLITE_OK;
}

// A migration list must be numbered 1, 2, 3, ... in order.
std::expected<void, DbError> check_numbering(const std::vector<Migration>& migrations,
                                             const std::string& where) {
  for (std::size_t i = 0; i < migrations.size(); ++i) {
    const int want = static_cast<int>(i) + 1;
    const int got = migrations[i].version;
    if (got == want) continue;
    std::string why = i > 0 && got == migrations[i - 1].version
                          ? fmt::format("version {} appears twice", got)
                          : fmt::format("entry {} has version {}, expected {}", i + 1, got, want);
    return std::unexpected(error::from_sqlite(
        SQLITE_MISUSE, fmt::format("{}: migration list is not 1, 2, 3, ... in order: {}", where, why)));
  }
  return {};
}

// The names of the migrations schema_version records, version 1 first (a gap is an error).
std::expected<std::vector<std::string>, DbError> recorded_migrations(Tx& tx, const std::string& where) {
  if (auto ok = tx.exec("CREATE TABLE IF NOT EXISTS schema_version ("
                        " version INTEGER PRIMARY KEY,"
                        " name TEXT NOT NULL,"
                        " applied_at TEXT NOT NULL)");
      !ok) {
    return std::unexpected(std::move(ok.error()));
  }
  auto st = tx.prepare("SELECT version, name FROM schema_version ORDER BY version");
  if (!st) return std::unexpected(std::move(st.error()));
  int on_disk = 0;
  std::vector<std::string> names;
  for (;;) {
    auto row = st->step();
    if (!row) return std::unexpected(std::move(row.error()));
    if (*row == Statement::Step::done) break;
    const auto v = st->column_int64(0);
    if (v != on_disk + 1) {
      return std::unexpected(
          error::from_sqlite(SQLITE_ERROR, fmt::format("{}: schema_version records version {} after {} "
                                                       "(a gap): refusing to run",
                                                       where, v, on_disk)));
    }
    on_disk = static_cast<int>(v);
    names.push_back(st->column_text(1));
  }
  return names;
}

// The version the file holds, once its records are known to be a prefix of `migrations`.
std::expected<int, DbError> check_recorded(Tx& tx, const std::vector<Migration>& migrations,
                                           const std::string& where) {
  const int known = static_cast<int>(migrations.size());
  auto names = recorded_migrations(tx, where);
  if (!names) return std::unexpected(std::move(names.error()));
  const int on_disk = static_cast<int>(names->size());
  if (on_disk > known) {
    return std::unexpected(
        error::from_sqlite(SQLITE_ERROR, fmt::format("{}: database schema version {} is newer than this "
                                                     "agent ({}): refusing to run",
                                                     where, on_disk, known)));
  }
  for (int v = 1; v <= on_disk; ++v) {
    const auto& code_name = migrations[static_cast<std::size_t>(v - 1)].name;
    const auto& disk_name = (*names)[static_cast<std::size_t>(v - 1)];
    if (code_name != disk_name) {
      return std::unexpected(
          error::from_sqlite(SQLITE_ERROR, fmt::format("{}: migration {} is \"{}\" in the database but "
                                                       "\"{}\" in this agent: refusing to run",
                                                       where, v, disk_name, code_name)));
    }
  }
  return on_disk;
}

// Runs one migration's SQL (no BEGIN, COMMIT or ROLLBACK of its own) and records it.
std::expected<void, DbError> apply_migration(sqlite3* db, Tx& tx, const Migration& m,
                                             const std::string& where) {
  sqlite3_set_authorizer(db, deny_transaction_statements, nullptr);
  auto ran = tx.exec(m.sql);
  sqlite3_set_authorizer(db, nullptr, nullptr);
  if (!ran) {
    std::string_view why = ran.error().detail;
    if (why.starts_with(where + ": ")) why.remove_prefix(where.size() + 2);
    std::string detail = fmt::format("{}: migration {} ({}) failed: {}", where, m.version, m.name, why);
    ran.error().detail = std::move(detail);  // SQLite's code and its Errc kept
    return std::unexpected(std::move(ran.error()));
  }
  auto ins = tx.prepare(
      "INSERT INTO schema_version (version, name, applied_at) "
      "VALUES (?1, ?2, strftime('%Y-%m-%dT%H:%M:%SZ', 'now'))");
  if (!ins) return std::unexpected(std::move(ins.error()));
  if (auto ok = ins->bind_all(m.version, m.name); !ok) return std::unexpected(std::move(ok.error()));
  return ins->run();
}

}  // namespace

std::expected<int, DbError> Database::read_schema_version() {
  auto exists = prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'");
  if (!exists) return std::unexpected(std::move(exists.error()));
  auto row = exists->step();
  if (!row) return std::unexpected(std::move(row.error()));
  if (*row == Statement::Step::done) return 0;
  auto st = prepare("SELECT coalesce(max(version), 0) FROM schema_version");
  if (!st) return std::unexpected(std::move(st.error()));
  row = st->step();
  if (!row) return std::unexpected(std::move(row.error()));
  const auto v = st->column_int64(0);
  if (v < 0 || v > INT_MAX) {
    return std::unexpected(error::from_sqlite(
        SQLITE_CORRUPT, fmt::format("{}: schema_version holds version {}", path_.string(), v)));
  }
  return static_cast<int>(v);
}

std::expected<void, DbError> Database::migrate(const std::vector<Migration>& migrations) {
  const auto where = path_.string();
  if (auto ok = check_numbering(migrations, where); !ok) return std::unexpected(std::move(ok.error()));

  // Check what the file holds against the list, under the write lock.
  auto checked = transaction([&](Tx& tx) { return check_recorded(tx, migrations, where); });
  if (!checked) return std::unexpected(std::move(checked.error()));
  schema_version_ = *checked;

  for (const auto& m : migrations) {
    if (m.version <= schema_version_) continue;
    auto applied = transaction([&](Tx& tx) -> std::expected<bool, DbError> {
      // Another process may have applied it since the check.
      auto current = read_schema_version();
      if (!current) return std::unexpected(std::move(current.error()));
      if (*current >= m.version) return false;
      if (auto ok = apply_migration(db_, tx, m, where); !ok) return std::unexpected(std::move(ok.error()));
      return true;
    });
    if (!applied) return std::unexpected(std::move(applied.error()));
    schema_version_ = m.version;
  }
  return {};
}

}  // namespace gpunode::store
