// The SQLite base against real files in a temporary directory: open and its pragmas, bad files and
// directories, migrations, transactions, statements, integrity_check, and a writer SIGKILLed
// mid-stream.
#include "gpunode/store/database.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "database_helpers.hpp"
#include "temp_dir.hpp"

namespace fs = std::filesystem;
using namespace gpunode::store;
using gpunode::test::exec_ok;
using gpunode::test::open_ok;
using gpunode::test::query_int;
using gpunode::test::TempDir;

namespace {

bool has_table(Database& db, const std::string& name) {
  auto st = db.prepare("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1");
  REQUIRE(st.has_value());
  REQUIRE(st->bind(1, name).has_value());
  REQUIRE(st->step().value() == Statement::Step::row);
  return st->column_int64(0) == 1;
}

bool contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool write_all(int fd, const void* data, std::size_t size) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// Reads exactly `size` bytes; false at end of file (or a torn last write).
bool read_exact(int fd, void* data, std::size_t size) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// Runs `fn` in a forked child (as nobody when the tests run as root, where file modes would not
// bind) and returns the text it produced. The child never touches doctest.
std::string in_unprivileged_child(const std::function<std::string()>& fn) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    if (::geteuid() == 0 && (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      ::_exit(3);
    }
    const std::string out = fn();
    ::_exit(write_all(fds[1], out.data(), out.size()) ? 0 : 4);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  return out;
}

const std::vector<Migration> kV1 = {
    {1, "items", "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);"},
};
const std::vector<Migration> kV2 = {
    kV1[0],
    {2, "item_notes",
     "CREATE TABLE notes (id INTEGER PRIMARY KEY, item_id INTEGER NOT NULL REFERENCES items (id), body "
     "TEXT);\n"
     "CREATE INDEX notes_item ON notes (item_id);"},
};
const std::vector<Migration> kV3 = {
    kV2[0],
    kV2[1],
    {3, "items_seen", "ALTER TABLE items ADD COLUMN seen_at TEXT;"},
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// open

TEST_CASE("open creates the file 0600 with WAL, synchronous=FULL, foreign_keys=ON, busy_timeout=5000") {
  TempDir dir;
  const auto file = dir / "state.db";
  auto db = open_ok(file);
  REQUIRE(fs::exists(file));
  struct stat st {};
  REQUIRE(::stat(file.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  CHECK(db.pragma("journal_mode").value() == "wal");
  CHECK(db.pragma("synchronous").value() == "2");  // FULL
  CHECK(db.pragma("foreign_keys").value() == "1");
  CHECK(db.pragma("busy_timeout").value() == "5000");
  CHECK(db.schema_version() == 0);
  CHECK(db.path() == file);

  // SQLite gives the WAL file the database file's mode.
  exec_ok(db, "CREATE TABLE t (x); INSERT INTO t VALUES (1)");
  const auto wal = dir / "state.db-wal";
  REQUIRE(fs::exists(wal));
  REQUIRE(::stat(wal.c_str(), &st) == 0);
  CHECK((st.st_mode & 077) == 0);

  CHECK_FALSE(db.pragma("journal_mode; DROP TABLE t").has_value());
}

TEST_CASE("data and WAL mode survive closing and reopening") {
  TempDir dir;
  const auto file = dir / "state.db";
  {
    auto db = open_ok(file);
    exec_ok(db, "CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (41), (1)");
  }
  auto db = open_ok(file);
  CHECK(query_int(db, "SELECT sum(x) FROM t") == 42);
  CHECK(db.pragma("journal_mode").value() == "wal");
}

TEST_CASE(
    "preallocate_wal: zeros after the WAL's frames, which stay as they were and are read back after a "
    "crash") {
  TempDir dir;
  const auto file = dir / "state.db", wal = dir / "state.db-wal";
  auto db = open_ok(file);
  exec_ok(db, "CREATE TABLE t (x INTEGER PRIMARY KEY, y TEXT); INSERT INTO t (y) VALUES ('one'), ('two')");
  const std::string frames = read_file(wal);
  REQUIRE(frames.size() > 32);

  REQUIRE(db.preallocate_wal().has_value());
  // 32-byte header, then an auto-checkpoint's 1000 frames and 64 more of 24 + 4096 bytes.
  const auto want = static_cast<std::uintmax_t>(32 + (1000 + 64) * (24 + 4096));
  CHECK(fs::file_size(wal) == want);
  const std::string after = read_file(wal);
  CHECK(after.substr(0, frames.size()) == frames);
  CHECK(after.find_first_not_of('\0', frames.size()) == std::string::npos);
  REQUIRE(db.preallocate_wal().has_value());  // again: nothing to do
  CHECK(fs::file_size(wal) == want);

  // Commits write over the zeros; a copy of the files as they are now is what a crash leaves.
  for (int i = 0; i < 300; ++i) exec_ok(db, "INSERT INTO t (y) VALUES ('" + std::to_string(i) + "')");
  CHECK(fs::file_size(wal) == want);
  const auto crashed = dir / "crashed";
  fs::create_directory(crashed);
  fs::copy_file(file, crashed / "state.db");
  fs::copy_file(wal, crashed / "state.db-wal");
  auto copy = open_ok(crashed / "state.db");
  CHECK(copy.integrity_check().has_value());
  CHECK(query_int(copy, "SELECT count(*) FROM t") == 302);
}

TEST_CASE(
    "preallocate_wal: a frame a crash cut short is overwritten, never completed into a transaction recovery "
    "dropped") {
  // A commit whose last frame (a text's last overflow page, partly filled: its page ends in zeros)
  // was cut short by a crash inside those zeros. Recovery at the next open drops the transaction;
  // zeros appended at the file's end would complete the frame with a valid checksum, and the
  // transaction would be back at the open after that.
  TempDir dir;
  bool found = false;
  for (int size = 7600; size < 8400 && !found; size += 20) {
    CAPTURE(size);
    const auto live = dir.path() / ("live-" + std::to_string(size)),
               crash = dir.path() / ("crash-" + std::to_string(size)),
               after = dir.path() / ("after-" + std::to_string(size));
    for (const auto& d : {live, crash, after}) fs::create_directory(d);
    std::int64_t frame = 0;
    {
      auto db = open_ok(live / "state.db");
      frame = std::stoll(db.pragma("page_size").value()) + 24;
      exec_ok(db, "CREATE TABLE t (id INTEGER PRIMARY KEY, x TEXT); INSERT INTO t VALUES (1, 'one')");
      exec_ok(db, "INSERT INTO t VALUES (2, '" + std::string(static_cast<std::size_t>(size), 'x') + "')");
      fs::copy_file(live / "state.db", crash / "state.db");  // the files as a crash leaves them
      fs::copy_file(live / "state.db-wal", crash / "state.db-wal");
    }
    const std::string wal = read_file(crash / "state.db-wal");
    const auto frames = (static_cast<std::int64_t>(wal.size()) - 32) / frame;
    const auto last = static_cast<std::size_t>(32 + (frames - 1) * frame);
    const auto byte = [&](std::size_t i) {
      return static_cast<std::uint32_t>(static_cast<unsigned char>(wal[i]));
    };
    const std::uint32_t db_pages =
        byte(last + 4) << 24 | byte(last + 5) << 16 | byte(last + 6) << 8 | byte(last + 7);
    const std::string page = wal.substr(last + 24, static_cast<std::size_t>(frame - 24));
    const auto zero_tail = page.size() - (page.find_last_not_of('\0') + 1);
    if (db_pages == 0 || zero_tail < 64) continue;  // not a commit frame ending in zeros: try another size
    found = true;
    fs::resize_file(crash / "state.db-wal", last + static_cast<std::size_t>(frame) - zero_tail / 2);

    auto recovered = open_ok(crash / "state.db");
    REQUIRE(query_int(recovered, "SELECT count(*) FROM t") == 1);  // recovery dropped the torn commit
    REQUIRE(recovered.preallocate_wal().has_value());
    fs::copy_file(crash / "state.db", after / "state.db");  // and a crash before the next commit
    fs::copy_file(crash / "state.db-wal", after / "state.db-wal");
    auto again = open_ok(after / "state.db");
    CHECK(query_int(again, "SELECT count(*) FROM t") == 1);
    CHECK(again.integrity_check().has_value());
  }
  REQUIRE_MESSAGE(found, "no text size gave a commit frame that ends in zeros");
}

TEST_CASE("a file that is not a database: a clear error naming it, and the file untouched") {
  TempDir dir;
  const auto file = dir / "notes.txt";
  std::string text;
  for (int i = 0; i < 200; ++i) text += "this is not a database, just some text\n";
  std::ofstream(file, std::ios::binary) << text;

  auto db = Database::open(file);
  REQUIRE_FALSE(db.has_value());
  CHECK(db.error().primary_code() == SQLITE_NOTADB);
  CHECK(contains(db.error().detail, file.string()));
  CHECK(contains(db.error().detail, "file is not a database"));
  CHECK(read_file(file) == text);
}

TEST_CASE(
    "an error's kind and SQLite's code survive: a full disk, a busy and a corrupt database are told apart") {
  struct Case {
    int code;
    std::string_view kind, name;
  } cases[] = {
      {SQLITE_FULL, "disk full", "SQLITE_FULL"},
      {SQLITE_BUSY, "busy", "SQLITE_BUSY"},
      {SQLITE_LOCKED, "busy", "SQLITE_LOCKED"},
      {SQLITE_CORRUPT, "corrupt", "SQLITE_CORRUPT"},
      {SQLITE_NOTADB, "corrupt", "SQLITE_NOTADB"},
      {SQLITE_READONLY, "read-only", "SQLITE_READONLY"},
      {SQLITE_IOERR_WRITE, "I/O error", "SQLITE_IOERR"},
      {SQLITE_CANTOPEN, "cannot open", "SQLITE_CANTOPEN"},
      {SQLITE_PERM, "permission denied", "SQLITE_PERM"},
      {SQLITE_NOMEM, "out of memory", "SQLITE_NOMEM"},
      {SQLITE_CONSTRAINT_UNIQUE, "constraint", "SQLITE_CONSTRAINT"},
      {SQLITE_MISUSE, "error", "SQLITE_MISUSE"},
      {0, "internal", ""},
  };
  for (const auto& c : cases) {
    CAPTURE(c.code);
    const DbError e = gpunode::error::from_sqlite(c.code, "/var/lib/gpunode/state.db: what happened");
    CHECK(e.kind() == c.kind);
    CHECK(e.code_name() == c.name);
    CHECK(contains(e.to_string(), std::string(c.kind)));
    CHECK(contains(e.to_string(), "/var/lib/gpunode/state.db: what happened"));
    if (c.code != 0) CHECK(contains(e.to_string(), std::string(c.name)));
  }
  CHECK(gpunode::error::from_sqlite(SQLITE_FULL, "m").to_string() == "disk full (SQLITE_FULL): m");
  CHECK(gpunode::error::from_sqlite(SQLITE_IOERR_WRITE, "m").to_string() ==
        fmt::format("I/O error (SQLITE_IOERR, extended code {}): m", SQLITE_IOERR_WRITE));
  CHECK(gpunode::error::from_sqlite(0, "m").to_string() == "internal: m");
  CHECK(gpunode::store::corrupt("bad row").kind() == "corrupt");

  TempDir dir;
  // Corrupt: a file that is not a database.
  std::ofstream(dir / "junk.db", std::ios::binary) << std::string(8192, 'x');
  auto junk = Database::open(dir / "junk.db");
  REQUIRE_FALSE(junk.has_value());
  CHECK(junk.error().kind() == "corrupt");
  // Busy: another connection holds the write lock past this one's busy timeout.
  const auto file = dir / "state.db";
  auto a = open_ok(file);
  REQUIRE(a.migrate(kV1).has_value());
  auto b = open_ok(file);
  REQUIRE(b.exec("PRAGMA busy_timeout = 20").has_value());
  std::optional<DbError> seen;
  auto held = a.transaction([&](Tx& tx) -> std::expected<void, DbError> {
    REQUIRE(tx.exec("INSERT INTO items (name) VALUES ('held')").has_value());
    auto other = b.transaction([&](Tx& tx2) -> std::expected<void, DbError> {
      return tx2.exec("INSERT INTO items (name) VALUES ('waits')");
    });
    if (!other) seen = other.error();
    return {};
  });
  REQUIRE(held.has_value());
  REQUIRE(seen.has_value());
  CHECK(seen->kind() == "busy");
  CHECK(seen->code_name() == "SQLITE_BUSY");
  CHECK(contains(seen->to_string(), file.string()));
}

TEST_CASE("a missing directory or a directory in place of the file: errors naming the path") {
  TempDir dir;
  const auto missing = dir / "no-such-dir" / "state.db";
  auto a = Database::open(missing);
  REQUIRE_FALSE(a.has_value());
  CHECK(a.error().native == SQLITE_CANTOPEN);
  CHECK(a.error().detail ==
        missing.string() + ": cannot open or create the database file: No such file or directory");

  auto b = Database::open(dir.path());
  REQUIRE_FALSE(b.has_value());
  CHECK(contains(b.error().detail, dir.path().string()));
  CHECK(contains(b.error().detail, "Is a directory"));
}

TEST_CASE("a directory the agent cannot write: a clear error naming the file") {
  TempDir dir;
  fs::permissions(dir.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                  fs::perms::others_read | fs::perms::others_exec);
  const auto ro = dir / "ro";
  fs::create_directory(ro);

  // An existing database, readable and writable by anyone, in that directory: WAL needs to create
  // state.db-wal and -shm beside it.
  const auto existing = ro / "existing.db";
  {
    auto db = open_ok(existing);
    exec_ok(db, "CREATE TABLE t (x)");
  }
  fs::permissions(existing,
                  fs::perms::all & ~(fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec));
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                          fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  REQUIRE_FALSE(fs::exists(ro / "existing.db-wal"));

  const auto fresh = ro / "state.db";
  const std::string fresh_msg = in_unprivileged_child([&] {
    auto db = Database::open(fresh);
    return db ? std::string("opened") : db.error().detail;
  });
  CHECK(fresh_msg == fresh.string() + ": cannot open or create the database file: Permission denied");

  const std::string existing_msg = in_unprivileged_child([&] {
    auto db = Database::open(existing);
    return db ? std::string("opened") : db.error().detail;
  });
  CHECK(existing_msg != "opened");
  CHECK(contains(existing_msg, existing.string()));
  CHECK(contains(existing_msg, "WAL needs to create existing.db-wal and existing.db-shm"));
  MESSAGE("existing database in a read-only directory: " << existing_msg);
}

TEST_CASE("a Database moves with its connection") {
  TempDir dir;
  auto a = open_ok(dir / "state.db");
  REQUIRE(a.migrate(kV1).has_value());
  Database b = std::move(a);
  CHECK(b.schema_version() == 1);
  exec_ok(b, "INSERT INTO items (name) VALUES ('x')");
  CHECK(query_int(b, "SELECT count(*) FROM items") == 1);
  Database c = open_ok(dir / "other.db");
  c = std::move(b);
  CHECK(query_int(c, "SELECT count(*) FROM items") == 1);
}

// ---------------------------------------------------------------------------------------------
// migrations

TEST_CASE("migrations apply once, are recorded, and are idempotent across reopen") {
  TempDir dir;
  const auto file = dir / "state.db";
  {
    auto db = open_ok(file);
    REQUIRE(db.migrate(kV2).has_value());
    CHECK(db.schema_version() == 2);
    CHECK(has_table(db, "items"));
    CHECK(has_table(db, "notes"));
    CHECK(query_int(db, "SELECT count(*) FROM schema_version") == 2);

    auto st = db.prepare("SELECT version, name, applied_at FROM schema_version ORDER BY version");
    REQUIRE(st.has_value());
    REQUIRE(st->step().value() == Statement::Step::row);
    CHECK(st->column_int64(0) == 1);
    CHECK(st->column_text(1) == "items");
    const auto at = st->column_text(2);
    CHECK(at.size() == 20);  // 2027-01-31T00:00:00Z
    CHECK(at[10] == 'T');
    CHECK(at.back() == 'Z');
    REQUIRE(st->step().value() == Statement::Step::row);
    CHECK(st->column_text(1) == "item_notes");

    exec_ok(db, "INSERT INTO items (name) VALUES ('kept')");
    REQUIRE(db.migrate(kV2).has_value());  // again: nothing to do, nothing lost
    CHECK(query_int(db, "SELECT count(*) FROM schema_version") == 2);
    CHECK(query_int(db, "SELECT count(*) FROM items") == 1);
  }
  auto db = open_ok(file);
  CHECK(db.schema_version() == 2);  // read on open
  REQUIRE(db.migrate(kV2).has_value());
  CHECK(query_int(db, "SELECT count(*) FROM items") == 1);
  REQUIRE(db.migrate(kV3).has_value());
  CHECK(db.schema_version() == 3);
  CHECK(query_int(db, "SELECT count(*) FROM schema_version") == 3);
  exec_ok(db, "UPDATE items SET seen_at = 'now'");
}

TEST_CASE("a database newer than the agent is refused") {
  TempDir dir;
  const auto file = dir / "state.db";
  {
    auto db = open_ok(file);
    REQUIRE(db.migrate(kV3).has_value());
  }
  auto db = open_ok(file);
  CHECK(db.schema_version() == 3);
  auto r = db.migrate(kV2);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail ==
        file.string() + ": database schema version 3 is newer than this agent (2): refusing to run");
  CHECK(db.schema_version() == 3);
  CHECK(query_int(db, "SELECT count(*) FROM schema_version") == 3);
}

TEST_CASE("a migration list with gaps, duplicates or disorder is refused before touching the file") {
  TempDir dir;
  auto db = open_ok(dir / "state.db");
  const Migration m1{1, "a", "CREATE TABLE a (x)"};
  const Migration m2{2, "b", "CREATE TABLE b (x)"};
  const Migration m3{3, "c", "CREATE TABLE c (x)"};
  struct Bad {
    const char* what;
    std::vector<Migration> list;
    const char* says;
  };
  const Bad bad[] = {
      {"gap", {m1, m3}, "entry 2 has version 3, expected 2"},
      {"duplicate", {m1, m1}, "version 1 appears twice"},
      {"not from 1", {m2, m3}, "entry 1 has version 2, expected 1"},
      {"out of order", {m2, m1}, "entry 1 has version 2, expected 1"},
  };
  for (const auto& b : bad) {
    CAPTURE(b.what);
    auto r = db.migrate(b.list);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().native == SQLITE_MISUSE);
    CHECK(contains(r.error().detail, "migration list is not 1, 2, 3, ... in order"));
    CHECK(contains(r.error().detail, b.says));
  }
  CHECK_FALSE(has_table(db, "schema_version"));
  CHECK_FALSE(has_table(db, "a"));
  CHECK(db.migrate({}).has_value());  // an empty list is fine
  CHECK(db.schema_version() == 0);
}

TEST_CASE("a database whose recorded migrations differ from the agent's is refused") {
  TempDir dir;
  auto db = open_ok(dir / "state.db");
  REQUIRE(db.migrate(kV2).has_value());
  auto renamed = kV3;
  renamed[1].name = "something_else";
  auto r = db.migrate(renamed);
  REQUIRE_FALSE(r.has_value());
  CHECK(contains(r.error().detail,
                 "migration 2 is \"item_notes\" in the database but \"something_else\" in this agent"));
  CHECK(db.schema_version() == 2);
  CHECK_FALSE(has_table(db, "items_seen"));
}

TEST_CASE("a failing migration leaves nothing of itself applied") {
  TempDir dir;
  const auto file = dir / "state.db";
  auto db = open_ok(file);
  std::vector<Migration> list = kV1;
  list.push_back({2, "half_done",
                  "CREATE TABLE b (x);\n"
                  "INSERT INTO b VALUES (1);\n"
                  "CREATE TABLE items (again);\n"  // already exists: fails here
                  "CREATE TABLE c (x);"});
  list.push_back({3, "never", "CREATE TABLE d (x);"});
  auto r = db.migrate(list);
  REQUIRE_FALSE(r.has_value());
  CHECK(contains(r.error().detail,
                 file.string() + ": migration 2 (half_done) failed: table items already exists"));
  CHECK(r.error().primary_code() == SQLITE_ERROR);
  CHECK(db.schema_version() == 1);  // the one before it stays
  CHECK(has_table(db, "items"));
  CHECK_FALSE(has_table(db, "b"));
  CHECK_FALSE(has_table(db, "c"));
  CHECK_FALSE(has_table(db, "d"));
  CHECK(query_int(db, "SELECT max(version) FROM schema_version") == 1);
  CHECK_FALSE(db.in_transaction());

  auto reopened = open_ok(file);
  CHECK(reopened.schema_version() == 1);
}

TEST_CASE("a migration that tries to end its own transaction is refused whole") {
  TempDir dir;
  auto db = open_ok(dir / "state.db");
  auto r = db.migrate({{1, "sneaky", "CREATE TABLE a (x); COMMIT; CREATE TABLE b (x);"}});
  REQUIRE_FALSE(r.has_value());
  CHECK(contains(r.error().detail, "migration 1 (sneaky) failed: not authorized"));
  CHECK_FALSE(has_table(db, "a"));
  CHECK_FALSE(has_table(db, "b"));
  CHECK(db.schema_version() == 0);
  CHECK_FALSE(db.in_transaction());
  // The authorizer is gone afterwards.
  exec_ok(db, "BEGIN; COMMIT");
}

// ---------------------------------------------------------------------------------------------
// transactions

TEST_CASE("a transaction commits the body's work and passes its value through") {
  TempDir dir;
  auto db = open_ok(dir / "state.db");
  REQUIRE(db.migrate(kV1).has_value());
  auto r = db.transaction([&](Tx& tx) -> std::expected<std::int64_t, DbError> {
    CHECK(db.in_transaction());
    if (auto ok = tx.exec("INSERT INTO items (name) VALUES ('a')"); !ok) return std::unexpected(ok.error());
    return tx.database().last_insert_rowid();
  });
  REQUIRE(r.has_value());
  CHECK(*r == 1);
  CHECK_FALSE(db.in_transaction());
  CHECK(query_int(db, "SELECT count(*) FROM items") == 1);
}

TEST_CASE("a transaction whose body fails rolls back") {
  TempDir dir;
  auto db = open_ok(dir / "state.db");
  REQUIRE(db.migrate(kV1).has_value());
  exec_ok(db, "INSERT INTO items (name) VALUES ('before')");

  SUBCASE("the body returns an error") {
    auto r = db.transaction([&](Tx& tx) -> std::expected<void, DbError> {
      REQUIRE(tx.exec("INSERT INTO items (name) VALUES ('x')").has_value());
      REQUIRE(tx.exec("DELETE FROM items WHERE name = 'before'").has_value());
      return std::unexpected(gpunode::error::from_sqlite(0, "the body changed its mind"));
    });
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().detail == "the body changed its mind");
  }
  SUBCASE("a statement in the body fails") {
    auto r = db.transaction([&](Tx& tx) -> std::expected<void, DbError> {
      REQUIRE(tx.exec("INSERT INTO items (name) VALUES ('x')").has_value());
      return tx.exec("INSERT INTO items (name) VALUES ('before')");  // UNIQUE
    });
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().primary_code() == SQLITE_CONSTRAINT);
    CHECK(contains(r.error().detail, "UNIQUE constraint failed: items.name"));
    CHECK(contains(r.error().detail, "statement \"INSERT INTO items (name) VALUES ('before')\""));
  }
  SUBCASE("the body throws: rolled back, then rethrown") {
    CHECK_THROWS_AS(db.transaction([&](Tx& tx) -> std::expected<void, DbError> {
      REQUIRE(tx.exec("INSERT INTO items (name) VALUES ('x')").has_value());
      throw std::runtime_error("bug");
    }),
                    std::runtime_error);
  }
  SUBCASE("the body's own error type") {
    struct AppError {
      explicit AppError(std::string c) : code(std::move(c)) {}
      explicit AppError(DbError e) : code("db"), db(std::move(e)) {}
      std::string code;
      std::optional<DbError> db;
    };
    auto r = db.transaction([&](Tx& tx) -> std::expected<int, AppError> {
      REQUIRE(tx.exec("INSERT INTO items (name) VALUES ('x')").has_value());
      return std::unexpected(AppError("reservation-overlap"));
    });
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == "reservation-overlap");
  }
  CHECK_FALSE(db.in_transaction());
  CHECK(query_int(db, "SELECT count(*) FROM items") == 1);
  CHECK(query_int(db, "SELECT count(*) FROM items WHERE name = 'before'") == 1);
  // And the connection is fine for the next one.
  REQUIRE(db.transaction([&](Tx& tx) {
              return tx.exec("INSERT INTO items (name) VALUES ('after')");
            }).has_value());
  CHECK(query_int(db, "SELECT count(*) FROM items") == 2);
}

TEST_CASE("a COMMIT that fails (deferred foreign key) rolls back and says why") {
  TempDir dir;
  auto db = open_ok(dir / "state.db");
  exec_ok(db,
          "CREATE TABLE parent (id INTEGER PRIMARY KEY);"
          "CREATE TABLE child (id INTEGER PRIMARY KEY,"
          " parent_id INTEGER NOT NULL REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)");
  auto r = db.transaction([&](Tx& tx) { return tx.exec("INSERT INTO child VALUES (1, 99)"); });
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().primary_code() == SQLITE_CONSTRAINT);
  CHECK(contains(r.error().detail, "FOREIGN KEY constraint failed"));
  CHECK(contains(r.error().detail, "COMMIT"));
  CHECK_FALSE(db.in_transaction());
  CHECK(query_int(db, "SELECT count(*) FROM child") == 0);
}

TEST_CASE("foreign keys are enforced") {
  TempDir dir;
  auto db = open_ok(dir / "state.db");
  REQUIRE(db.migrate(kV2).has_value());
  auto r = db.exec("INSERT INTO notes (item_id, body) VALUES (12345, 'orphan')");
  REQUIRE_FALSE(r.has_value());
  CHECK(contains(r.error().detail, "FOREIGN KEY constraint failed"));
}

TEST_CASE("transactions do not nest") {
  TempDir dir;
  auto db = open_ok(dir / "state.db");
  auto outer = db.transaction([&](Tx&) -> std::expected<void, DbError> {
    auto inner = db.transaction([](Tx&) -> std::expected<void, DbError> { return {}; });
    REQUIRE_FALSE(inner.has_value());
    CHECK(inner.error().native == SQLITE_MISUSE);
    CHECK(contains(inner.error().detail, "transactions do not nest"));
    CHECK(db.in_transaction());  // the outer one is untouched
    return {};
  });
  CHECK(outer.has_value());
  CHECK_FALSE(db.in_transaction());
}

TEST_CASE("a second connection sees only committed data") {
  TempDir dir;
  const auto file = dir / "state.db";
  auto a = open_ok(file);
  REQUIRE(a.migrate(kV1).has_value());
  auto b = open_ok(file);
  CHECK(b.schema_version() == 1);

  auto r = a.transaction([&](Tx& tx) -> std::expected<void, DbError> {
    REQUIRE(tx.exec("INSERT INTO items (name) VALUES ('one')").has_value());
    CHECK(query_int(a, "SELECT count(*) FROM items") == 1);  // the writer sees its own work
    CHECK(query_int(b, "SELECT count(*) FROM items") == 0);  // nobody else does yet
    return {};
  });
  REQUIRE(r.has_value());
  CHECK(query_int(b, "SELECT count(*) FROM items") == 1);

  auto rolled = a.transaction([&](Tx& tx) -> std::expected<void, DbError> {
    REQUIRE(tx.exec("INSERT INTO items (name) VALUES ('two')").has_value());
    return std::unexpected(gpunode::error::from_sqlite(0, "no"));
  });
  REQUIRE_FALSE(rolled.has_value());
  CHECK(query_int(b, "SELECT count(*) FROM items") == 1);
}

// ---------------------------------------------------------------------------------------------
// statements

TEST_CASE("statements bind every type, step, and read columns") {
  TempDir dir;
  auto db = open_ok(dir / "state.db");
  exec_ok(db, "CREATE TABLE s (i INTEGER, t TEXT, n INTEGER, o TEXT)");
  auto ins = db.prepare("INSERT INTO s VALUES (?1, ?2, ?3, ?4)");
  REQUIRE(ins.has_value());
  const std::string with_nul("caf\xc3\xa9 \0 after nul", 18);
  REQUIRE(
      ins->bind_all(std::int64_t{INT64_MAX}, with_nul, nullptr, std::optional<std::string>{}).has_value());
  REQUIRE(ins->run().has_value());
  CHECK(db.changes() == 1);
  ins->reset();
  REQUIRE(ins->bind_all(-7, "plain", std::optional<std::int64_t>{5}, std::optional<std::string>{"x"})
              .has_value());
  REQUIRE(ins->run().has_value());
  ins->reset();
  ins->clear_bindings();
  REQUIRE(ins->bind(1, 3).has_value());
  REQUIRE(ins->bind(2, static_cast<const char*>(nullptr)).has_value());
  REQUIRE(ins->run().has_value());  // the others are NULL again
  ins->reset();
  auto too_big = ins->bind(1, std::uint64_t{1} << 63);
  REQUIRE_FALSE(too_big.has_value());
  CHECK(too_big.error().native == SQLITE_TOOBIG);
  CHECK(contains(too_big.error().detail, "binding parameter 1"));
  REQUIRE(ins->bind_all(std::uint64_t{INT64_MAX}, true, 'A', 2654435761LL).has_value());
  REQUIRE(ins->run().has_value());

  auto sel = db.prepare("SELECT i, t, n, o FROM s ORDER BY rowid");
  REQUIRE(sel.has_value());
  CHECK(sel->column_count() == 4);
  CHECK(sel->column_int64(0) == 0);  // no row yet: defaults, not undefined behaviour
  REQUIRE(sel->step().value() == Statement::Step::row);
  CHECK(sel->column_int64(0) == INT64_MAX);
  CHECK(sel->column_text(1) == with_nul);
  CHECK(sel->column_is_null(2));
  CHECK(sel->column_optional_int64(2) == std::nullopt);
  CHECK(sel->column_optional_text(3) == std::nullopt);
  CHECK(sel->column_int64(9) == 0);
  CHECK(sel->column_text(-1).empty());
  CHECK(sel->column_is_null(9));
  REQUIRE(sel->step().value() == Statement::Step::row);
  CHECK(sel->column_int64(0) == -7);
  CHECK(sel->column_text(1) == "plain");
  CHECK(sel->column_optional_int64(2) == 5);
  CHECK(sel->column_optional_text(3) == "x");
  REQUIRE(sel->step().value() == Statement::Step::row);
  CHECK(sel->column_int64(0) == 3);
  CHECK(sel->column_is_null(1));
  REQUIRE(sel->step().value() == Statement::Step::row);
  CHECK(sel->column_int64(0) == INT64_MAX);
  CHECK(sel->column_int64(1) == 1);  // true; TEXT affinity stores "1", read back as 1
  CHECK(sel->column_int64(2) == 65);
  CHECK(sel->column_int64(3) == 2654435761LL);
  REQUIRE(sel->step().value() == Statement::Step::done);
  CHECK(sel->column_text(1).empty());
  CHECK(sel->sql() == "SELECT i, t, n, o FROM s ORDER BY rowid");
}

TEST_CASE("statement errors say what and where") {
  TempDir dir;
  const auto file = dir / "state.db";
  auto db = open_ok(file);
  exec_ok(db, "CREATE TABLE s (id INTEGER PRIMARY KEY)");

  auto syntax = db.prepare("SELEC 1");
  REQUIRE_FALSE(syntax.has_value());
  CHECK(syntax.error().primary_code() == SQLITE_ERROR);
  CHECK(syntax.error().detail == file.string() + ": near \"SELEC\": syntax error (statement \"SELEC 1\")");

  auto no_table = db.prepare("SELECT * FROM nowhere");
  REQUIRE_FALSE(no_table.has_value());
  CHECK(contains(no_table.error().detail, "no such table: nowhere"));

  auto two = db.prepare("SELECT 1; SELECT 2");
  REQUIRE_FALSE(two.has_value());
  CHECK(contains(two.error().detail, "prepare takes one statement"));
  CHECK(db.prepare("SELECT 1; -- a comment after it is fine\n").has_value());
  CHECK_FALSE(db.prepare("   ").has_value());

  auto st = db.prepare("INSERT INTO s (id) VALUES (?1)");
  REQUIRE(st.has_value());
  auto range = st->bind(2, 1);
  REQUIRE_FALSE(range.has_value());
  CHECK(range.error().primary_code() == SQLITE_RANGE);
  CHECK(contains(range.error().detail, "binding parameter 2"));
  CHECK(contains(range.error().detail, "statement \"INSERT INTO s (id) VALUES (?1)\""));

  REQUIRE(st->bind(1, 1).has_value());
  REQUIRE(st->run().has_value());
  st->reset();
  auto dup = st->run();
  REQUIRE_FALSE(dup.has_value());
  CHECK(dup.error().native == SQLITE_CONSTRAINT_PRIMARYKEY);
  CHECK(contains(dup.error().detail, file.string() + ": UNIQUE constraint failed: s.id"));

  std::string long_sql = "SELECT 1 AS a";
  for (int i = 0; i < 50; ++i) long_sql += ",\n       " + std::to_string(i) + " AS c" + std::to_string(i);
  long_sql += " FROM nowhere";
  auto long_err = db.prepare(long_sql);
  REQUIRE_FALSE(long_err.has_value());
  CHECK(contains(long_err.error().detail, "statement \"SELECT 1 AS a, 0 AS c0, 1 AS c1"));  // folded
  CHECK(contains(long_err.error().detail, "...\")"));                                       // shortened
}

// ---------------------------------------------------------------------------------------------
// integrity

TEST_CASE("integrity_check: ok on a sound file, the findings on a damaged one") {
  TempDir dir;
  const auto file = dir / "state.db";
  {
    auto db = open_ok(file);
    CHECK(db.integrity_check().has_value());
    REQUIRE(db.migrate(kV1).has_value());
    REQUIRE(db.transaction([&](Tx& tx) -> std::expected<void, DbError> {
                auto st = tx.prepare("INSERT INTO items (name) VALUES (?1)");
                if (!st) return std::unexpected(st.error());
                for (int i = 0; i < 2000; ++i) {
                  st->reset();
                  if (auto ok = st->bind(1, "item number " + std::to_string(i)); !ok) return ok;
                  if (auto ok = st->run(); !ok) return ok;
                }
                return {};
              }).has_value());
    CHECK(db.integrity_check().has_value());
  }  // the last connection checkpoints the WAL into the file
  const auto page_size = 4096;
  REQUIRE(fs::file_size(file) > 8 * page_size);
  {
    // Scribble over the third and fourth pages (the table's b-tree, past the schema page).
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(2 * page_size);
    const std::string junk(2 * page_size, '\xa5');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  auto db = Database::open(file);
  REQUIRE_MESSAGE(db.has_value(), (db ? std::string() : db.error().detail));  // the schema page is intact
  auto check = db->integrity_check();
  REQUIRE_FALSE(check.has_value());
  CHECK(check.error().primary_code() == SQLITE_CORRUPT);
  CHECK(contains(check.error().detail, file.string()));
  MESSAGE("integrity_check on a damaged file: " << check.error().detail.substr(0, 300));
}

// ---------------------------------------------------------------------------------------------
// crash

namespace {

std::string payload_for(std::int64_t id) {
  std::string p = "row " + std::to_string(id) + " ";
  while (p.size() < 3000) p += std::to_string(id * 2654435761LL % 1000003) + ";";
  return p;
}

// The child: a stream of transactions, each inserting one row and bumping a counter, writing the
// row's id to `out_fd` only after its COMMIT returned. Never returns; touches no doctest state.
[[noreturn]] void crash_writer(const fs::path& file, int out_fd) {
  auto db = Database::open(file);
  if (!db || !db->preallocate_wal()) ::_exit(2);  // as the agent opens it: the WAL ends in zeros
  std::int64_t next = 0;
  {
    auto st = db->prepare("SELECT coalesce(max(id), 0) + 1 FROM items");
    if (!st || !st->step()) ::_exit(2);
    next = st->column_int64(0);
  }
  for (std::int64_t id = next; id < next + 1000000; ++id) {
    auto r = db->transaction([&](Tx& tx) -> std::expected<void, DbError> {
      auto ins = tx.prepare("INSERT INTO items (id, payload) VALUES (?1, ?2)");
      if (!ins) return std::unexpected(ins.error());
      if (auto ok = ins->bind_all(id, payload_for(id)); !ok) return ok;
      if (auto ok = ins->run(); !ok) return ok;
      return tx.exec("UPDATE counter SET n = n + 1");
    });
    if (!r) ::_exit(3);
    if (!write_all(out_fd, &id, sizeof id)) ::_exit(4);
  }
  ::_exit(0);
}

}  // namespace

TEST_CASE("a writer SIGKILLed mid-stream leaves a consistent database with every acknowledged commit") {
  TempDir dir;
  const auto file = dir / "crash.db";
  {
    auto db = open_ok(file);
    REQUIRE(db.migrate({{1, "crash",
                         "CREATE TABLE items (id INTEGER PRIMARY KEY, payload TEXT NOT NULL);"
                         "CREATE TABLE counter (n INTEGER NOT NULL);"
                         "INSERT INTO counter VALUES (0);"}})
                .has_value());
  }  // no connection is open across fork()

  std::set<std::int64_t> acked;
  for (int round = 0; round < 4; ++round) {
    CAPTURE(round);
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      crash_writer(file, fds[1]);
    }
    ::close(fds[1]);
    const int kill_after = 25 + 20 * round;
    int seen = 0;
    bool killed = false;
    std::int64_t id = 0;
    while (read_exact(fds[0], &id, sizeof id)) {
      acked.insert(id);
      if (++seen == kill_after && !killed) {
        // Vary where the kill lands: in the next transaction, its COMMIT's fsync, or after it.
        ::usleep(static_cast<useconds_t>(round) * 400);
        REQUIRE(::kill(pid, SIGKILL) == 0);
        killed = true;
      }
    }
    ::close(fds[0]);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE_MESSAGE(
        killed, "the writer stopped early, exit status " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1));
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);

    auto db = open_ok(file);
    auto ok = db.integrity_check();
    CHECK_MESSAGE(ok.has_value(), (ok ? std::string() : ok.error().detail));
    const auto rows = query_int(db, "SELECT count(*) FROM items");
    CHECK(query_int(db, "SELECT coalesce(min(id), 0) FROM items") == 1);
    CHECK(query_int(db, "SELECT coalesce(max(id), 0) FROM items") == rows);  // no holes
    CHECK(query_int(db, "SELECT n FROM counter") == rows);                   // each commit whole
    // Every commit the writer saw return is there. A commit the kill cut off between its COMMIT
    // and writing its id may be there too: then the ids acknowledged have a hole that the table
    // does not.
    CHECK(static_cast<std::int64_t>(acked.size()) <= rows);
    CHECK(*acked.rbegin() <= rows);
    auto present = db.prepare("SELECT count(*) FROM items WHERE id = ?1");
    REQUIRE(present.has_value());
    for (auto acked_id : acked) {
      present->reset();
      REQUIRE(present->bind(1, acked_id).has_value());
      REQUIRE(present->step().value() == Statement::Step::row);
      if (present->column_int64(0) != 1)
        FAIL_CHECK("acknowledged id " << acked_id << " is missing after the kill");
    }
  }

  auto db = open_ok(file);
  auto st = db.prepare("SELECT id, payload FROM items ORDER BY id");
  REQUIRE(st.has_value());
  std::set<std::int64_t> stored;
  int bad_payloads = 0;
  for (;;) {
    auto row = st->step();
    REQUIRE(row.has_value());
    if (*row == Statement::Step::done) break;
    const auto id = st->column_int64(0);
    stored.insert(id);
    if (st->column_text(1) != payload_for(id)) ++bad_payloads;
  }
  CHECK(bad_payloads == 0);
  for (auto id : acked) {
    if (stored.count(id) == 0) FAIL_CHECK("acknowledged id " << id << " is missing after the crash");
  }
  MESSAGE(acked.size() << " acknowledged commits over 4 kills, " << stored.size() << " rows stored");
}
