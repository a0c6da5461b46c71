// The error vocabulary: errno's and SQLite's mappings onto a code, and how an error reads (kind()
// for an answer, to_string() for the log). SQLite's errors are made by a real SQLite: a full disk
// (max_page_count), a database held by another connection, a file with garbage over its header.
#include "gpunode/error/error.hpp"

#include <doctest/doctest.h>
#include <sqlite3.h>

#include <cerrno>
#include <fstream>
#include <optional>
#include <string>

#include "gpunode/store/database.hpp"
#include "temp_dir.hpp"

using gpunode::error::Errc;
using gpunode::error::Error;
using gpunode::error::Native;
using gpunode::store::Database;
using gpunode::store::DbError;
using gpunode::store::Tx;
using gpunode::test::TempDir;

namespace {

Database open_ok(const std::filesystem::path& file) {
  auto db = Database::open(file);
  REQUIRE_MESSAGE(db.has_value(), (db ? std::string() : db.error().to_string()));
  return std::move(*db);
}

}  // namespace

TEST_CASE("errno: each maps to the code an operator acts on, the detail ends with strerror") {
  struct Case {
    int err;
    Errc code;
    std::string_view kind;
  } cases[] = {
      {ENOENT, Errc::not_found, "not found"},
      {ENOTDIR, Errc::not_found, "not found"},
      {EACCES, Errc::permission, "permission denied"},
      {EPERM, Errc::permission, "permission denied"},
      {EEXIST, Errc::exists, "already exists"},
      {ENOSPC, Errc::full, "disk full"},
      {EDQUOT, Errc::full, "disk full"},
      {EROFS, Errc::read_only, "read-only"},
      {EAGAIN, Errc::busy, "busy"},
      {EWOULDBLOCK, Errc::busy, "busy"},
      {EBUSY, Errc::busy, "busy"},
      {EADDRINUSE, Errc::busy, "busy"},
      {EADDRNOTAVAIL, Errc::unavailable, "unavailable"},
      {ETIMEDOUT, Errc::timeout, "timed out"},
      {EIO, Errc::io, "I/O error"},
      {ECONNREFUSED, Errc::unavailable, "unavailable"},
      {ENETUNREACH, Errc::unavailable, "unavailable"},
      {EHOSTUNREACH, Errc::unavailable, "unavailable"},
      {ECONNRESET, Errc::unavailable, "unavailable"},
      {EPIPE, Errc::unavailable, "unavailable"},
      {EINVAL, Errc::invalid, "invalid"},
      {EFBIG, Errc::too_large, "too large"},
      {ENOMEM, Errc::internal, "internal"},
      {EXDEV, Errc::io, "I/O error"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.err);
    const Error e = gpunode::error::from_errno(c.err, "cannot open /x");
    CHECK(e.code == c.code);
    CHECK(e.kind() == c.kind);
    CHECK(e.native == c.err);
    CHECK(e.origin == Native::os);
    CHECK(e.code_name().empty());
    CHECK(e.primary_code() == 0);
  }
  const Error missing = gpunode::error::from_errno(ENOENT, "state directory /d: cannot open /d/lock");
  CHECK(missing.detail == "state directory /d: cannot open /d/lock: No such file or directory");
  CHECK(missing.to_string() ==
        "not found: state directory /d: cannot open /d/lock: No such file or directory");
  CHECK(gpunode::error::from_errno(ENOSPC, "write").to_string() ==
        "disk full: write: No space left on device");
}

TEST_CASE(
    "os_error: the errno's code and native, the detail as worded; with_context and with_kind keep both") {
  const Error missing = gpunode::error::os_error(ENOENT, "missing");
  CHECK(missing.detail == "missing");  // no strerror appended: the words already say why
  CHECK(missing.code == Errc::not_found);
  CHECK(missing.native == ENOENT);
  CHECK(missing.origin == Native::os);
  CHECK(gpunode::error::os_error(EACCES, "permission denied: uid 7 cannot read it").code == Errc::permission);

  const Error placed = gpunode::error::with_context(missing, "api.tls.cert");
  CHECK(placed.detail == "api.tls.cert: missing");
  CHECK(placed.code == Errc::not_found);
  CHECK(placed.native == ENOENT);
  CHECK(placed.origin == Native::os);

  const Error full = gpunode::error::from_sqlite(SQLITE_FULL, "/s/state.db: commit");
  const Error worded = gpunode::error::with_kind(full);
  CHECK(worded.detail == "disk full (SQLITE_FULL): /s/state.db: commit");
  CHECK(worded.detail == full.to_string());
  CHECK(worded.code == Errc::full);
  CHECK(worded.native == SQLITE_FULL);
  CHECK(worded.origin == Native::sqlite);
}

TEST_CASE("an error of the agent's own: the code's words, no native code") {
  const Error e{Errc::protocol, "the answer has no ackedSeq"};
  CHECK(e.kind() == "protocol error");
  CHECK(e.to_string() == "protocol error: the answer has no ackedSeq");
  CHECK(e.native == 0);
  CHECK(e.origin == Native::none);
  CHECK(Error{}.kind() == "internal");
  const gpunode::error::Result<int> r = gpunode::error::fail(Errc::invalid, "\"x\" is not a time");
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::invalid);
  CHECK(r.error().detail == "\"x\" is not a time");
}

TEST_CASE("SQLite's result codes: the code, the store's words, SQLite's name") {
  struct Case {
    int rc;
    Errc code;
  } cases[] = {
      {SQLITE_FULL, Errc::full},
      {SQLITE_BUSY, Errc::busy},
      {SQLITE_BUSY_SNAPSHOT, Errc::busy},
      {SQLITE_LOCKED, Errc::busy},
      {SQLITE_CORRUPT, Errc::corrupt},
      {SQLITE_NOTADB, Errc::corrupt},
      {SQLITE_READONLY, Errc::read_only},
      {SQLITE_IOERR_FSYNC, Errc::io},
      {SQLITE_CANTOPEN, Errc::unavailable},
      {SQLITE_PERM, Errc::permission},
      {SQLITE_AUTH, Errc::permission},
      {SQLITE_CONSTRAINT_UNIQUE, Errc::exists},
      {SQLITE_CONSTRAINT_PRIMARYKEY, Errc::exists},
      {SQLITE_CONSTRAINT_FOREIGNKEY, Errc::invalid},
      {SQLITE_TOOBIG, Errc::too_large},
      {SQLITE_NOMEM, Errc::internal},
      {SQLITE_MISUSE, Errc::internal},
      {0, Errc::internal},
  };
  for (const auto& c : cases) {
    CAPTURE(c.rc);
    const Error e = gpunode::error::from_sqlite(c.rc, "state.db: what");
    CHECK(e.code == c.code);
    CHECK(e.native == c.rc);
    CHECK(e.origin == (c.rc == 0 ? Native::none : Native::sqlite));
    CHECK(e.primary_code() == (c.rc & 0xff));
  }
  // The store's words are finer than the codes' where SQLite says more.
  CHECK(gpunode::error::from_sqlite(SQLITE_CANTOPEN, "m").kind() == "cannot open");
  CHECK(gpunode::error::from_sqlite(SQLITE_CONSTRAINT_UNIQUE, "m").kind() == "constraint");
  CHECK(gpunode::error::from_sqlite(SQLITE_NOMEM, "m").kind() == "out of memory");
  CHECK(gpunode::error::from_sqlite(SQLITE_BUSY_SNAPSHOT, "m").to_string() ==
        "busy (SQLITE_BUSY, extended code " + std::to_string(SQLITE_BUSY_SNAPSHOT) + "): m");
  CHECK(gpunode::error::from_sqlite(0, "m").to_string() == "internal: m");
}

TEST_CASE("a real SQLite: a full disk, a busy and a corrupt database reach the caller told apart") {
  TempDir dir;
  const auto file = dir / "state.db";
  {
    auto db = open_ok(file);
    REQUIRE(db.exec("CREATE TABLE t (x BLOB)").has_value());

    SUBCASE("full: the file may not grow past max_page_count") {
      REQUIRE(db.exec("PRAGMA max_page_count = 8").has_value());
      std::optional<DbError> full;
      for (int i = 0; i < 20 && !full; ++i) {
        if (auto r = db.exec("INSERT INTO t VALUES (zeroblob(4096))"); !r) full = r.error();
      }
      REQUIRE(full.has_value());
      CHECK(full->code == Errc::full);
      CHECK(full->kind() == "disk full");
      CHECK(full->primary_code() == SQLITE_FULL);
      CHECK(full->to_string().starts_with("disk full (SQLITE_FULL): " + file.string() + ": "));
      CHECK(full->detail.find("database or disk is full") != std::string::npos);
    }

    SUBCASE("busy: another connection holds the write lock") {
      auto other = open_ok(file);
      REQUIRE(other.exec("PRAGMA busy_timeout = 10").has_value());
      std::optional<DbError> busy;
      auto held = db.transaction([&](Tx& tx) -> gpunode::error::Result<void> {
        REQUIRE(tx.exec("INSERT INTO t VALUES (1)").has_value());
        if (auto r = other.exec("INSERT INTO t VALUES (2)"); !r) busy = r.error();
        return {};
      });
      REQUIRE(held.has_value());
      REQUIRE(busy.has_value());
      CHECK(busy->code == Errc::busy);
      CHECK(busy->kind() == "busy");
      CHECK(busy->code_name() == "SQLITE_BUSY");
    }
  }

  SUBCASE("corrupt: garbage over the file's header") {
    {
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(0);
      f << std::string(100, '\x5a');
    }
    auto db = Database::open(file);
    REQUIRE_FALSE(db.has_value());
    CHECK(db.error().code == Errc::corrupt);
    CHECK(db.error().kind() == "corrupt");
    CHECK(db.error().code_name() == "SQLITE_NOTADB");
    CHECK(db.error().to_string().starts_with("corrupt (SQLITE_NOTADB): " + file.string()));
  }

  SUBCASE("an errno met by the store keeps SQLite's word and errno's code") {
    auto db = Database::open(dir / "no-such-dir" / "state.db");
    REQUIRE_FALSE(db.has_value());
    CHECK(db.error().code == Errc::not_found);
    CHECK(db.error().kind() == "cannot open");
    CHECK(db.error().code_name() == "SQLITE_CANTOPEN");
    CHECK(db.error().detail.ends_with(": No such file or directory"));
  }
}
