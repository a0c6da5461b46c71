// The SQLite base (see the header). SQLite result codes become DbError here and only here; the
// one errno this file meets (creating the file) is mapped in os_error(). Database::migrate is in
// migrations.cpp.
#include "gpunode/store/database.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <system_error>
#include <vector>

#include "gathered_wal.hpp"
#include "gpunode/text/ascii.hpp"

namespace gpunode::store {

DbError corrupt(std::string detail) {
  return error::from_sqlite(SQLITE_CORRUPT, std::move(detail));
}

namespace {

constexpr int kBusyTimeoutMs = 5000;

// SQL as it appears in messages: whitespace runs folded to one space, at most ~100 characters.
std::string shorten_sql(std::string_view sql) {
  std::string out;
  bool space = false;
  for (char c : sql) {
    if (std::isspace(static_cast<unsigned char>(c)) != 0) {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
    if (out.size() >= 100) {
      out += "...";
      break;
    }
  }
  return out;
}

std::string statement_context(std::string_view sql) {
  return fmt::format("statement \"{}\"", shorten_sql(sql));
}

// The one place an errno becomes a DbError: SQLite's code for it, as SQLite would have answered
// (the store's kind and to_string() read it), and errno's finer Errc (permission, not_found, ...).
DbError os_error(int err, const std::filesystem::path& file, std::string_view what) {
  int code = SQLITE_CANTOPEN;
  if (err == ENOSPC || err == EDQUOT) code = SQLITE_FULL;
  if (err == ENOMEM) code = SQLITE_NOMEM;
  DbError e = error::from_sqlite(
      code, fmt::format("{}: cannot {}: {}", file.string(), what, std::generic_category().message(err)));
  e.code = error::errno_code(err);
  return e;
}

std::string db_file(sqlite3* db) {
  const char* name = db != nullptr ? sqlite3_db_filename(db, "main") : nullptr;
  return name != nullptr && *name != '\0' ? std::string(name) : std::string("(database)");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Statement

Statement::Statement(Statement&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)), stmt_(std::exchange(other.stmt_, nullptr)) {}

Statement& Statement::operator=(Statement&& other) noexcept {
  if (this != &other) {
    sqlite3_finalize(stmt_);
    db_ = std::exchange(other.db_, nullptr);
    stmt_ = std::exchange(other.stmt_, nullptr);
  }
  return *this;
}

Statement::~Statement() {
  sqlite3_finalize(stmt_);
}

DbError Statement::error(int rc, std::string_view what) const {
  const char* msg = db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
  return error::from_sqlite(
      rc, fmt::format("{}: {} ({}, {})", db_file(db_), msg, what, statement_context(sql())));
}

std::expected<void, DbError> Statement::bind_too_big(int index) const {
  return std::unexpected(error::from_sqlite(
      SQLITE_TOOBIG, fmt::format("{}: integer too big for SQLite (binding parameter {}, {})", db_file(db_),
                                 index, statement_context(sql()))));
}

std::expected<void, DbError> Statement::bind_int64(int index, std::int64_t value) {
  const int rc = sqlite3_bind_int64(stmt_, index, value);
  if (rc != SQLITE_OK) return std::unexpected(error(rc, fmt::format("binding parameter {}", index)));
  return {};
}

std::expected<void, DbError> Statement::bind(int index, std::string_view value) {
  const int rc = sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  if (rc != SQLITE_OK) return std::unexpected(error(rc, fmt::format("binding parameter {}", index)));
  return {};
}

std::expected<void, DbError> Statement::bind(int index, std::nullptr_t) {
  const int rc = sqlite3_bind_null(stmt_, index);
  if (rc != SQLITE_OK) return std::unexpected(error(rc, fmt::format("binding parameter {}", index)));
  return {};
}

std::expected<Statement::Step, DbError> Statement::step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return Step::row;
  if (rc == SQLITE_DONE) return Step::done;
  return std::unexpected(error(rc, "step"));
}

std::expected<void, DbError> Statement::run() {
  for (;;) {
    auto s = step();
    if (!s) return std::unexpected(std::move(s.error()));
    if (*s == Step::done) return {};
  }
}

void Statement::reset() {
  sqlite3_reset(stmt_);
}  // its code repeats the last step's, already reported
void Statement::clear_bindings() {
  sqlite3_clear_bindings(stmt_);
}

int Statement::column_count() const {
  return sqlite3_column_count(stmt_);
}

bool Statement::column_in_range(int column) const {
  // data_count is 0 unless a row is current: reading then is undefined in SQLite, so refused here.
  return column >= 0 && column < sqlite3_data_count(stmt_);
}

bool Statement::column_is_null(int column) const {
  return !column_in_range(column) || sqlite3_column_type(stmt_, column) == SQLITE_NULL;
}

std::int64_t Statement::column_int64(int column) const {
  return column_in_range(column) ? sqlite3_column_int64(stmt_, column) : 0;
}

std::string Statement::column_text(int column) const {
  if (!column_in_range(column)) return {};
  const auto* text = sqlite3_column_text(stmt_, column);  // before _bytes, as SQLite asks
  const int size = sqlite3_column_bytes(stmt_, column);
  if (text == nullptr || size <= 0) return {};
  return std::string(reinterpret_cast<const char*>(text), static_cast<std::size_t>(size));
}

std::optional<std::int64_t> Statement::column_optional_int64(int column) const {
  if (column_is_null(column)) return std::nullopt;
  return column_int64(column);
}

std::optional<std::string> Statement::column_optional_text(int column) const {
  if (column_is_null(column)) return std::nullopt;
  return column_text(column);
}

std::string_view Statement::sql() const {
  const char* s = stmt_ != nullptr ? sqlite3_sql(stmt_) : nullptr;
  return s != nullptr ? std::string_view(s) : std::string_view();
}

// ---------------------------------------------------------------------------------------------
// Tx

std::expected<void, DbError> Tx::exec(std::string_view sql) {
  return db_.exec(sql);
}
std::expected<Statement, DbError> Tx::prepare(std::string_view sql) {
  return db_.prepare(sql);
}

// ---------------------------------------------------------------------------------------------
// Database

Database::Database(Database&& other) noexcept
    : db_(std::exchange(other.db_, nullptr)),
      path_(std::move(other.path_)),
      schema_version_(std::exchange(other.schema_version_, 0)),
      begin_(std::exchange(other.begin_, std::nullopt)),
      commit_(std::exchange(other.commit_, std::nullopt)) {}

Database& Database::operator=(Database&& other) noexcept {
  if (this != &other) {
    begin_.reset();
    commit_.reset();
    sqlite3_close_v2(db_);
    db_ = std::exchange(other.db_, nullptr);
    path_ = std::move(other.path_);
    schema_version_ = std::exchange(other.schema_version_, 0);
    begin_ = std::exchange(other.begin_, std::nullopt);
    commit_ = std::exchange(other.commit_, std::nullopt);
  }
  return *this;
}

// close_v2: a Statement that (wrongly) outlives us keeps the connection alive instead of dangling.
Database::~Database() {
  begin_.reset();
  commit_.reset();
  sqlite3_close_v2(db_);
}

DbError Database::error(int rc, std::string_view what) const {
  const char* msg = db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
  return error::from_sqlite(rc, fmt::format("{}: {} ({})", path_.string(), msg, what));
}

std::expected<Database, DbError> Database::open(const std::filesystem::path& file) {
  // SQLite would create the file 0644 (less umask); create it ourselves so it is 0600 from the
  // first byte. Opening an existing file read-write also tells us early if we cannot write it.
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return std::unexpected(os_error(errno, file, "open or create the database file"));
  ::close(fd);

  sqlite3* raw = nullptr;
  const int rc =
      sqlite3_open_v2(file.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE,
                      detail::gathering_vfs());
  if (rc != SQLITE_OK) {
    DbError e =
        error::from_sqlite(rc, fmt::format("{}: cannot open the database: {}", file.string(),
                                           raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
    sqlite3_close_v2(raw);
    return std::unexpected(std::move(e));
  }
  Database db(raw, file);
  if (auto ok = db.configure(); !ok) return std::unexpected(std::move(ok.error()));
  auto version = db.read_schema_version();
  if (!version) return std::unexpected(std::move(version.error()));
  db.schema_version_ = *version;
  return db;
}

std::expected<void, DbError> Database::configure() {
  sqlite3_extended_result_codes(db_, 1);
  sqlite3_db_config(db_, SQLITE_DBCONFIG_DEFENSIVE, 1, nullptr);
  sqlite3_busy_timeout(db_, kBusyTimeoutMs);

  // The first statement reads the file: a file that is not a database fails here, and so does a
  // WAL file that cannot be created.
  const auto wal_hint = [&](DbError e) {
    const int code = e.primary_code();
    if (code == SQLITE_READONLY || code == SQLITE_CANTOPEN) {
      e.detail += fmt::format("; WAL needs to create {0}-wal and {0}-shm in a directory it can write",
                              path_.filename().string());
    }
    return std::unexpected(std::move(e));
  };
  std::string mode;
  {
    auto st = prepare("PRAGMA journal_mode=WAL");
    if (!st) return wal_hint(std::move(st.error()));
    auto stepped = st->step();
    if (!stepped) return wal_hint(std::move(stepped.error()));
    if (*stepped == Statement::Step::row) mode = st->column_text(0);
  }
  mode = text::ascii_lower(mode);
  if (mode != "wal") {
    return std::unexpected(
        error::from_sqlite(SQLITE_CANTOPEN, fmt::format("{}: journal_mode is \"{}\" after asking for WAL "
                                                        "(can the directory be written?)",
                                                        path_.string(), mode)));
  }
  if (auto ok = exec("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON"); !ok) return ok;

  struct Expect {
    const char* pragma;
    const char* value;
  };
  for (const auto& [name, want] :
       {Expect{"synchronous", "2"}, Expect{"foreign_keys", "1"}, Expect{"busy_timeout", "5000"}}) {
    auto got = pragma(name);
    if (!got) return std::unexpected(std::move(got.error()));
    if (*got != want) {
      return std::unexpected(error::from_sqlite(
          SQLITE_MISUSE,
          fmt::format("{}: PRAGMA {} is {} after setting it to {}", path_.string(), name, *got, want)));
    }
  }
  return {};
}

std::expected<void, DbError> Database::preallocate_wal() {
  auto number = [&](std::string_view name) -> std::expected<std::int64_t, DbError> {
    auto v = pragma(name);
    if (!v) return std::unexpected(std::move(v.error()));
    std::int64_t n = 0;
    auto [end, ec] = std::from_chars(v->data(), v->data() + v->size(), n);
    if (ec != std::errc{} || end != v->data() + v->size() || n < 0) {
      return std::unexpected(error::from_sqlite(
          SQLITE_MISUSE, fmt::format("{}: PRAGMA {} is \"{}\"", path_.string(), name, *v)));
    }
    return n;
  };
  const auto page = number("page_size");
  if (!page) return std::unexpected(std::move(page.error()));
  const auto pages = number("wal_autocheckpoint");
  if (!pages) return std::unexpected(std::move(pages.error()));
  // The WAL's header, then (frame header + page) per frame; a commit may end a few frames past
  // the auto-checkpoint's mark, and the checkpoint runs after it.
  constexpr std::int64_t kWalHeader = 32, kFrameHeader = 24, kSlack = 64;
  const std::int64_t frame = *page + kFrameHeader;
  const std::int64_t want = kWalHeader + (*pages + kSlack) * frame;
  // Where SQLite keeps it (beside the file a symbolic link names, not beside the link).
  const char* name = sqlite3_filename_wal(sqlite3_db_filename(db_, "main"));
  if (name == nullptr || *name == '\0') return {};
  const std::filesystem::path wal = name;

  // Under SQLite's write lock: no connection appends a frame while the file is written.
  return transaction([&](Tx&) -> std::expected<void, DbError> {
    const int fd = ::open(wal.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return {};  // SQLite makes it at the first write
      return std::unexpected(os_error(errno, wal, "open the WAL to preallocate it"));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      return std::unexpected(os_error(err, wal, "stat the WAL"));
    }
    const std::int64_t had = st.st_size;
    if (had >= want) {
      ::close(fd);
      return {};
    }
    // From the end of the last whole frame: a frame a crash cut short is overwritten, never
    // completed. Its missing end could have been zeros, and zeros appended after it would make it
    // whole again: a transaction that this open's recovery dropped would be back after the next.
    const std::int64_t from = had < kWalHeader ? 0 : kWalHeader + (had - kWalHeader) / frame * frame;
    static constexpr std::size_t kChunk = 256 * 1024;
    const std::vector<char> zeros(kChunk, '\0');
    int err = 0;
    for (std::int64_t at = from; at < want && err == 0;) {
      const auto n =
          static_cast<std::size_t>(std::min<std::int64_t>(static_cast<std::int64_t>(kChunk), want - at));
      const ssize_t wrote = ::pwrite(fd, zeros.data(), n, static_cast<off_t>(at));
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0)
        err = wrote < 0 ? errno : ENOSPC;
      else
        at += wrote;
    }
    if (err == 0 && ::fdatasync(fd) != 0) err = errno;
    if (err != 0) {
      // Back to its size: zeros past the frames are harmless, but the space is what the disk
      // lacks. A failing truncate leaves nothing the error below does not already say.
      [[maybe_unused]] const int ignored = ::ftruncate(fd, static_cast<off_t>(had));
    }
    ::close(fd);
    if (err != 0)
      return std::unexpected(os_error(err, wal, fmt::format("preallocate the WAL to {} bytes", want)));
    return {};
  });
}

std::expected<std::string, DbError> Database::pragma(std::string_view name) {
  for (char c : name) {
    if (!(std::islower(static_cast<unsigned char>(c)) != 0 || c == '_')) {
      return std::unexpected(error::from_sqlite(
          SQLITE_MISUSE, fmt::format("{}: \"{}\" is not a pragma name", path_.string(), name)));
    }
  }
  auto st = prepare(fmt::format("PRAGMA {}", name));
  if (!st) return std::unexpected(std::move(st.error()));
  auto stepped = st->step();
  if (!stepped) return std::unexpected(std::move(stepped.error()));
  if (*stepped != Statement::Step::row) return std::string();
  return st->column_text(0);
}

std::expected<void, DbError> Database::exec(std::string_view sql) {
  const std::string text(sql);
  char* errmsg = nullptr;
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &errmsg);
  if (rc != SQLITE_OK) {
    const int code = sqlite3_extended_errcode(db_);
    DbError e = error::from_sqlite(
        code != SQLITE_OK ? code : rc,
        fmt::format("{}: {} ({})", path_.string(), errmsg != nullptr ? errmsg : sqlite3_errstr(rc),
                    statement_context(sql)));
    sqlite3_free(errmsg);
    return std::unexpected(std::move(e));
  }
  return {};
}

std::expected<Statement, DbError> Database::prepare(std::string_view sql) {
  if (sql.size() > static_cast<std::size_t>(INT_MAX)) {
    return std::unexpected(
        error::from_sqlite(SQLITE_TOOBIG, fmt::format("{}: statement too long", path_.string())));
  }
  sqlite3_stmt* raw = nullptr;
  const char* tail = nullptr;
  int rc = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()), 0, &raw, &tail);
  if (rc != SQLITE_OK) return std::unexpected(error(rc, statement_context(sql)));
  Statement st(db_, raw);
  if (raw == nullptr) {
    return std::unexpected(error::from_sqlite(
        SQLITE_MISUSE, fmt::format("{}: empty statement ({})", path_.string(), statement_context(sql))));
  }
  // One statement per prepare: text after it (other than comments and blanks) is refused.
  const auto used = static_cast<std::size_t>(tail - sql.data());
  const auto rest = sql.substr(used);
  if (!rest.empty()) {
    sqlite3_stmt* extra = nullptr;
    rc = sqlite3_prepare_v3(db_, rest.data(), static_cast<int>(rest.size()), 0, &extra, nullptr);
    const bool more = rc != SQLITE_OK || extra != nullptr;
    sqlite3_finalize(extra);
    if (more) {
      return std::unexpected(error::from_sqlite(
          SQLITE_MISUSE,
          fmt::format("{}: prepare takes one statement ({})", path_.string(), statement_context(sql))));
    }
  }
  return st;
}

std::expected<void, DbError> Database::begin_immediate() {
  if (in_transaction()) {
    return std::unexpected(
        error::from_sqlite(SQLITE_MISUSE, fmt::format("{}: a transaction is already open (transactions do "
                                                      "not nest)",
                                                      path_.string())));
  }
  return run_kept(begin_, "BEGIN IMMEDIATE");
}

std::expected<void, DbError> Database::commit() {
  return run_kept(commit_, "COMMIT");
}

std::expected<void, DbError> Database::run_kept(std::optional<Statement>& kept, std::string_view sql) {
  if (!kept) {
    auto st = prepare(sql);
    if (!st) return std::unexpected(std::move(st.error()));
    kept.emplace(std::move(*st));
  }
  auto done = kept->run();
  kept->reset();
  return done;
}

void Database::rollback() noexcept {
  // SQLite rolls back by itself on some errors (SQLITE_FULL, IOERR, NOMEM, ...): then there is
  // nothing left to roll back.
  if (in_transaction()) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

bool Database::in_transaction() const {
  return db_ != nullptr && sqlite3_get_autocommit(db_) == 0;
}
std::int64_t Database::last_insert_rowid() const {
  return sqlite3_last_insert_rowid(db_);
}
int Database::changes() const {
  return sqlite3_changes(db_);
}

std::expected<void, DbError> Database::integrity_check() {
  auto st = prepare("PRAGMA integrity_check");
  if (!st) return std::unexpected(std::move(st.error()));
  std::vector<std::string> lines;
  for (;;) {
    auto row = st->step();
    if (!row) return std::unexpected(std::move(row.error()));
    if (*row == Statement::Step::done) break;
    lines.push_back(st->column_text(0));
  }
  if (lines.size() == 1 && lines[0] == "ok") return {};
  return std::unexpected(error::from_sqlite(
      SQLITE_CORRUPT, fmt::format("{}: integrity_check: {}", path_.string(), fmt::join(lines, "; "))));
}

}  // namespace gpunode::store
