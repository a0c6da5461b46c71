// gpunode/store/database.hpp: the agent's SQLite state file, its base layer.
//
// One Database is one connection. It is not thread-safe: the daemon runs it on one worker strand,
// never on the I/O threads (a write can wait up to busy_timeout for the lock).
//
// Every call that can fail returns std::expected<..., DbError>; nothing here throws for bad input
// or a bad file. A DbError's detail says what failed and where: the database file and, for a
// statement, its SQL (shortened), e.g.
//   /var/lib/gpunode/state.db: UNIQUE constraint failed: items.id (statement "INSERT INTO items ...")
#pragma once

#include <concepts>
#include <cstdint>
#include <exception>
#include <expected>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpunode/error/error.hpp"

struct sqlite3;
struct sqlite3_stmt;

namespace gpunode::store {

// The store's errors are the agent's one error type (gpunode/error/error.hpp), made here from
// SQLite's result code and only here: native keeps SQLite's extended code (origin Native::sqlite),
// code is its Errc (a full disk, a busy database and a corrupt one are told apart), detail says
// what failed and where. kind() ("disk full", "busy", "corrupt", "read-only", "I/O error", "cannot
// open", ...) names no file or statement; to_string() is "disk full (SQLITE_FULL): DETAIL".
using DbError = error::Error;

// A stored value that cannot be what the agent wrote: SQLITE_CORRUPT, as SQLite's own.
DbError corrupt(std::string detail);

struct Migration {
  int version = 0;   // 1, 2, 3, ... in order, no gaps
  std::string name;  // recorded beside the version; must match on later runs
  std::string sql;   // one or more statements, run in one transaction with the version's record
};

// A prepared statement (RAII: finalized on destruction). Must not outlive its Database.
class Statement {
 public:
  enum class Step { row, done };

  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&& other) noexcept;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement();

  // Parameters are 1-based, as in SQLite. An index out of range is an error (SQLITE_RANGE).
  // Any integer type (bool as 0/1); an unsigned value past INT64_MAX is an error (SQLITE_TOOBIG).
  template <std::integral T>
  std::expected<void, DbError> bind(int index, T value) {
    if constexpr (std::is_unsigned_v<T> && sizeof(T) >= sizeof(std::int64_t)) {
      if (value > static_cast<T>(std::numeric_limits<std::int64_t>::max())) return bind_too_big(index);
    }
    return bind_int64(index, static_cast<std::int64_t>(value));
  }
  std::expected<void, DbError> bind(int index, std::string_view value);  // copied (SQLITE_TRANSIENT)
  std::expected<void, DbError> bind(int index, const char* value) {      // a null pointer binds NULL
    if (value == nullptr) return bind(index, nullptr);
    return bind(index, std::string_view(value));
  }
  std::expected<void, DbError> bind(int index, const std::string& value) {
    return bind(index, std::string_view(value));
  }
  std::expected<void, DbError> bind(int index, std::nullptr_t);
  std::expected<void, DbError> bind(int index, std::nullopt_t) { return bind(index, nullptr); }
  template <class T>
  std::expected<void, DbError> bind(int index, const std::optional<T>& value) {
    if (!value) return bind(index, nullptr);
    return bind(index, *value);
  }
  // bind_all(a, b, c) binds ?1 = a, ?2 = b, ?3 = c; stops at the first error.
  template <class... Args>
  std::expected<void, DbError> bind_all(const Args&... args) {
    std::expected<void, DbError> result;
    int index = 0;
    (void)((result = bind(++index, args), result.has_value()) && ...);
    return result;
  }

  // Step::row: a row is ready for the column getters; Step::done: finished. Any other SQLite
  // answer is a DbError (a constraint, SQLITE_BUSY, a corrupt file, ...).
  std::expected<Step, DbError> step();
  // Runs the statement to the end, ignoring rows (for INSERT/UPDATE/DELETE).
  std::expected<void, DbError> run();
  // Back to before the first step, with bindings kept (clear_bindings() drops them).
  void reset();
  void clear_bindings();

  // Column getters are 0-based and read the current row. Out of range or NULL gives 0 / "" / nullopt.
  int column_count() const;
  bool column_is_null(int column) const;
  std::int64_t column_int64(int column) const;
  std::string column_text(int column) const;
  std::optional<std::int64_t> column_optional_int64(int column) const;
  std::optional<std::string> column_optional_text(int column) const;

  std::string_view sql() const;

 private:
  friend class Database;
  Statement(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  DbError error(int rc, std::string_view what) const;
  bool column_in_range(int column) const;
  std::expected<void, DbError> bind_int64(int index, std::int64_t value);
  std::expected<void, DbError> bind_too_big(int index) const;

  sqlite3* db_ = nullptr;
  sqlite3_stmt* stmt_ = nullptr;
};

class Database;

// What a transaction body works with. Only Database::transaction makes one.
class Tx {
 public:
  std::expected<void, DbError> exec(std::string_view sql);
  std::expected<Statement, DbError> prepare(std::string_view sql);
  Database& database() { return db_; }

 private:
  friend class Database;
  explicit Tx(Database& db) : db_(db) {}
  Database& db_;
};

namespace detail {
template <class R>
struct IsExpected : std::false_type {};
template <class T, class E>
struct IsExpected<std::expected<T, E>> : std::true_type {};
}  // namespace detail

class Database {
 public:
  // Opens or creates `file` (the directory must exist; a new file is created mode 0600, an
  // existing file keeps its mode), then sets and reads back journal_mode=WAL, synchronous=FULL,
  // foreign_keys=ON, busy_timeout=5000 ms, and reads the schema version. A file that is not a
  // database, an unreadable file or an unwritable directory are errors naming the file.
  static std::expected<Database, DbError> open(const std::filesystem::path& file);

  Database(Database&& other) noexcept;
  Database& operator=(Database&& other) noexcept;
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;
  ~Database();

  // Applies the migrations the file does not have yet, each in its own BEGIN IMMEDIATE
  // transaction together with its row in schema_version(version, name, applied_at). Refuses a list
  // that is not 1, 2, 3, ... in order; a file whose version is newer than the list's last ("database
  // schema version 7 is newer than this agent (5): refusing to run"); a file whose recorded
  // migrations do not match the list's (other names, gaps). A failing migration leaves the file at
  // the version before it. Applying the same list again does nothing.
  std::expected<void, DbError> migrate(const std::vector<Migration>& migrations);
  int schema_version() const { return schema_version_; }  // 0 before any migration

  // Runs `body(Tx&)` inside BEGIN IMMEDIATE ... COMMIT. The body returns std::expected<T, E>
  // (E constructible from DbError, e.g. DbError itself): an error, or an exception, rolls the
  // transaction back (the exception is rethrown); a value commits, and a failing COMMIT rolls back
  // and returns its error. Transactions do not nest (an error, not a savepoint).
  template <class F>
  auto transaction(F&& body) -> std::invoke_result_t<F&, Tx&>;

  // Outside a transaction each runs in its own (autocommit).
  std::expected<void, DbError> exec(std::string_view sql);  // one or more statements, no rows
  std::expected<Statement, DbError> prepare(std::string_view sql);

  // PRAGMA integrity_check: ok, or a DbError (SQLITE_CORRUPT) whose detail lists what it found.
  std::expected<void, DbError> integrity_check();

  // Writes zeros after the WAL's last whole frame (a frame a crash cut short is overwritten, never
  // completed) until the file can hold an auto-checkpoint's worth of frames, and syncs them, under
  // SQLite's write lock; the whole frames are not touched (zeros are not frames).
  // Commits then overwrite blocks the file system has already allocated, and their fdatasync only
  // flushes data, where one that grows the file must also commit its new size in the file
  // system's journal (PostgreSQL zero-fills its WAL segments for the same reason). Measured on
  // ext4: a 3-page commit 210-280 µs while the WAL grows, 150-165 µs once it is written again from
  // its start. A disk too full for it is an error, with the file as it was; a missing WAL is none.
  std::expected<void, DbError> preallocate_wal();

  // Reads a PRAGMA's single value as text ("wal", "2", "1", ...).
  std::expected<std::string, DbError> pragma(std::string_view name);

  std::int64_t last_insert_rowid() const;
  int changes() const;  // rows changed by the last INSERT/UPDATE/DELETE
  bool in_transaction() const;
  const std::filesystem::path& path() const { return path_; }

 private:
  Database(sqlite3* db, std::filesystem::path path) : db_(db), path_(std::move(path)) {}
  DbError error(int rc, std::string_view what) const;
  std::expected<void, DbError> begin_immediate();
  std::expected<void, DbError> commit();
  // Runs a statement prepared at its first use and kept: BEGIN IMMEDIATE and COMMIT, which every
  // transaction runs, are not parsed again each time.
  std::expected<void, DbError> run_kept(std::optional<Statement>& kept, std::string_view sql);
  void rollback() noexcept;
  std::expected<int, DbError> read_schema_version();
  std::expected<void, DbError> configure();

  sqlite3* db_ = nullptr;
  std::filesystem::path path_;
  int schema_version_ = 0;
  std::optional<Statement> begin_, commit_;  // finalized before the connection closes
};

template <class F>
auto Database::transaction(F&& body) -> std::invoke_result_t<F&, Tx&> {
  using R = std::invoke_result_t<F&, Tx&>;
  static_assert(detail::IsExpected<R>::value, "a transaction body returns std::expected<T, E>");
  using E = typename R::error_type;
  static_assert(std::is_constructible_v<E, DbError>,
                "the body's error type must be constructible from DbError");

  if (auto begun = begin_immediate(); !begun) return std::unexpected(E(std::move(begun.error())));
  Tx tx(*this);
  R result = [&]() -> R {
    try {
      return body(tx);
    } catch (...) {
      rollback();
      throw;
    }
  }();
  if (!result) {
    rollback();
    return result;
  }
  if (auto committed = commit(); !committed) {
    rollback();
    return std::unexpected(E(std::move(committed.error())));
  }
  return result;
}

}  // namespace gpunode::store
