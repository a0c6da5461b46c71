// The VFS every Database opens through (agent/store/gathered_wal.hpp): a commit's WAL frames reach
// the file in one write, and what is on disk after each commit is that commit, whole: a copy of the
// files taken right after it (what a crash leaves) opens with it; another connection, through
// SQLite's default VFS, reads it; a transaction that spills its pages into the WAL reads them back,
// and its rollback leaves nothing behind.
#include "gathered_wal.hpp"

#include <doctest/doctest.h>
#include <sqlite3.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "database_helpers.hpp"
#include "gpunode/store/database.hpp"
#include "temp_dir.hpp"

namespace fs = std::filesystem;
using namespace gpunode::store;
using namespace gpunode::test;  // TempDir, open_ok, exec_ok, query_int

namespace {

// The database as a crash right now leaves it: the files' bytes, copied into `to`, then opened.
std::int64_t rows_after_crash(const fs::path& file, const fs::path& to, std::string_view count_sql) {
  fs::remove_all(to);
  fs::create_directory(to);
  fs::copy_file(file, to / file.filename());
  fs::path wal = file;
  wal += "-wal";
  if (fs::exists(wal)) fs::copy_file(wal, to / wal.filename());
  auto copy = open_ok(to / file.filename());
  CHECK(copy.integrity_check().has_value());
  return query_int(copy, count_sql);
}

// A count through SQLite's default VFS, as another process would read it.
std::int64_t count_by_default_vfs(const fs::path& file, const char* sql) {
  sqlite3* raw = nullptr;
  REQUIRE(sqlite3_open_v2(file.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  REQUIRE(sqlite3_prepare_v2(raw, sql, -1, &st, nullptr) == SQLITE_OK);
  REQUIRE(sqlite3_step(st) == SQLITE_ROW);
  const std::int64_t n = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(raw);
  return n;
}

constexpr const char* kFiveTables =
    "CREATE TABLE a (id INTEGER PRIMARY KEY, x TEXT); CREATE TABLE b (id INTEGER PRIMARY KEY, x TEXT); "
    "CREATE TABLE c (id INTEGER PRIMARY KEY, x TEXT); CREATE TABLE d (id INTEGER PRIMARY KEY, x TEXT); "
    "CREATE TABLE e (id INTEGER PRIMARY KEY, x TEXT)";

std::string one_row_each(int i) {
  const std::string text = "'" + std::string(700, static_cast<char>('a' + i % 26)) + "'";
  std::string sql = "BEGIN;";
  for (const char* t : {"a", "b", "c", "d", "e"})
    sql += std::string("INSERT INTO ") + t + " (x) VALUES (" + text + ");";
  return sql + "COMMIT";
}

}  // namespace

TEST_CASE("gathered WAL: Database opens through it, and a commit's frames are one write") {
  REQUIRE(detail::gathering_vfs() != nullptr);
  TempDir dir;
  auto db = open_ok(dir / "state.db");
  exec_ok(db, kFiveTables);
  REQUIRE(db.preallocate_wal().has_value());
  const auto before = detail::gathered_writes();
  exec_ok(db, one_row_each(0));
  const auto after = detail::gathered_writes();
  // Five tables' pages at least, each a frame header and a page: ten writes asked, one made.
  CHECK(after.asked - before.asked >= 10);
  CHECK(after.written - before.written == 1);
}

TEST_CASE("gathered WAL: every commit is on disk once it returns, across the WAL's restarts") {
  TempDir dir;
  const auto file = dir / "state.db";
  auto db = open_ok(file);
  exec_ok(db, kFiveTables);
  REQUIRE(db.preallocate_wal().has_value());
  // 400 commits of 5 pages or more: past the auto-checkpoint's 1000 frames, so the WAL restarts
  // from its start (and is read back by the checkpoint) more than once.
  for (int i = 1; i <= 400; ++i) {
    exec_ok(db, one_row_each(i));
    if (i % 37 == 0 || i == 400) {
      CAPTURE(i);
      CHECK(rows_after_crash(file, dir / "crash", "SELECT count(*) FROM e") == i);
      CHECK(count_by_default_vfs(file, "SELECT count(*) FROM a") == i);
    }
  }
  CHECK(db.integrity_check().has_value());
}

TEST_CASE("gathered WAL: a transaction that spills reads its pages back; its rollback leaves nothing") {
  TempDir dir;
  const auto file = dir / "state.db";
  auto db = open_ok(file);
  exec_ok(db, "PRAGMA cache_size = 8; CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT)");
  exec_ok(db, "INSERT INTO t (x) VALUES ('kept')");
  const auto before = detail::gathered_writes();
  exec_ok(db,
          "BEGIN; WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400) "
          "INSERT INTO t (x) SELECT hex(randomblob(1500)) FROM n");
  // 400 rows of 3000 bytes do not fit 8 pages of cache: SQLite wrote pages into the WAL, and reads
  // them back here.
  CHECK(detail::gathered_writes().written > before.written);
  CHECK(query_int(db, "SELECT count(*) FROM t") == 401);
  CHECK(query_int(db, "SELECT sum(length(x)) FROM t") == 400 * 3000 + 4);
  exec_ok(db, "ROLLBACK");
  CHECK(query_int(db, "SELECT count(*) FROM t") == 1);
  CHECK(rows_after_crash(file, dir / "crash", "SELECT count(*) FROM t") == 1);

  // The next commit's frames go where the rolled-back ones were.
  exec_ok(db, "INSERT INTO t (x) VALUES ('after')");
  CHECK(rows_after_crash(file, dir / "crash", "SELECT count(*) FROM t") == 2);
  CHECK(count_by_default_vfs(file, "SELECT count(*) FROM t") == 2);
  CHECK(db.integrity_check().has_value());
}

TEST_CASE(
    "gathered WAL: what a rolled-back transaction spilled is written before another connection writes") {
  TempDir dir;
  const auto file = dir / "state.db";
  auto a = open_ok(file);
  exec_ok(a,
          "CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT); CREATE TABLE u (id INTEGER PRIMARY KEY, x TEXT); "
          "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400) "
          "INSERT INTO t (x) SELECT hex(randomblob(1500)) FROM n");
  // t's pages into the database file, the WAL emptied: the update below reads t from the file, not
  // the WAL. It keeps every size, so SQLite spills pages into the WAL, page 1 stays clean, and
  // nothing reads the WAL back after the rollback. The spilled frames lie where another
  // connection's next commit goes.
  exec_ok(a, "PRAGMA wal_checkpoint(TRUNCATE)");
  SUBCASE("normal locking: the WAL's write lock ends the transaction") {
    exec_ok(a, "PRAGMA cache_size = 8; BEGIN; UPDATE t SET x = lower(x) WHERE id <= 12");
    exec_ok(a, "ROLLBACK");
  }
  SUBCASE("exclusive locking left during the transaction: the file's own lock ends it") {
    exec_ok(a,
            "PRAGMA locking_mode = EXCLUSIVE; PRAGMA cache_size = 8; BEGIN; "
            "UPDATE t SET x = lower(x) WHERE id <= 12; PRAGMA locking_mode = NORMAL");
    exec_ok(a, "ROLLBACK");
  }
  // b opens now: a connection in exclusive locking mode keeps every other one out.
  auto b = open_ok(file);
  for (int i = 1; i <= 5; ++i) exec_ok(b, "INSERT INTO u (x) VALUES ('" + std::to_string(i) + "')");
  // a reads again: had its spilled frames waited for this read, they would now be written over b's.
  CHECK(query_int(a, "SELECT count(*) FROM u") == 5);
  CHECK(query_int(a, "SELECT count(*) FROM t WHERE x <> upper(x)") == 0);
  CHECK(a.integrity_check().has_value());
  CHECK(b.integrity_check().has_value());
  CHECK(count_by_default_vfs(file, "SELECT count(*) FROM u") == 5);
  CHECK(rows_after_crash(file, dir / "crash", "SELECT count(*) FROM u") == 5);
}

TEST_CASE("gathered WAL: a commit larger than one gathered write is whole") {
  TempDir dir;
  const auto file = dir / "state.db";
  auto db = open_ok(file);
  exec_ok(db, "CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT)");
  const auto before = detail::gathered_writes();
  // 400 KiB in one commit: about 100 frames, several gathered writes of at most 64 KiB.
  exec_ok(db, "INSERT INTO t (x) VALUES (hex(zeroblob(204800)))");
  const auto after = detail::gathered_writes();
  CHECK(after.written - before.written >= 4);
  CHECK(after.written - before.written < (after.asked - before.asked) / 10);
  CHECK(rows_after_crash(file, dir / "crash", "SELECT sum(length(x)) FROM t") == 409600);
  CHECK(count_by_default_vfs(file, "SELECT length(x) FROM t") == 409600);
}
