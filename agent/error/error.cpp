// The two native mappings (errno, SQLite's result codes) and the words of each code. SQLite's
// header is read for its constants only: nothing here calls SQLite.
#include "gpunode/error/error.hpp"

#include <fmt/format.h>
#include <sqlite3.h>

#include <cerrno>
#include <system_error>

namespace gpunode::error {

namespace {

std::string_view code_words(Errc code) {
  switch (code) {
    case Errc::invalid:
      return "invalid";
    case Errc::not_found:
      return "not found";
    case Errc::permission:
      return "permission denied";
    case Errc::exists:
      return "already exists";
    case Errc::busy:
      return "busy";
    case Errc::full:
      return "disk full";
    case Errc::corrupt:
      return "corrupt";
    case Errc::read_only:
      return "read-only";
    case Errc::io:
      return "I/O error";
    case Errc::unavailable:
      return "unavailable";
    case Errc::timeout:
      return "timed out";
    case Errc::protocol:
      return "protocol error";
    case Errc::too_large:
      return "too large";
    case Errc::internal:
      return "internal";
  }
  return "internal";
}

// The store's words for SQLite's primary codes, finer than the codes' (and unchanged since the
// store had its own error type: the answers and the log read them).
std::string_view sqlite_words(int native) {
  if (native == 0) return "internal";
  switch (native & 0xff) {
    case SQLITE_FULL:
      return "disk full";
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return "busy";
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return "corrupt";
    case SQLITE_READONLY:
      return "read-only";
    case SQLITE_IOERR:
      return "I/O error";
    case SQLITE_CANTOPEN:
      return "cannot open";
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return "permission denied";
    case SQLITE_NOMEM:
      return "out of memory";
    case SQLITE_CONSTRAINT:
      return "constraint";
    case SQLITE_SCHEMA:
      return "schema";
    default:
      return "error";
  }
}

std::string_view sqlite_name(int primary) {
  switch (primary) {
    case 0:
      return "";
    case SQLITE_ERROR:
      return "SQLITE_ERROR";
    case SQLITE_INTERNAL:
      return "SQLITE_INTERNAL";
    case SQLITE_PERM:
      return "SQLITE_PERM";
    case SQLITE_ABORT:
      return "SQLITE_ABORT";
    case SQLITE_BUSY:
      return "SQLITE_BUSY";
    case SQLITE_LOCKED:
      return "SQLITE_LOCKED";
    case SQLITE_NOMEM:
      return "SQLITE_NOMEM";
    case SQLITE_READONLY:
      return "SQLITE_READONLY";
    case SQLITE_INTERRUPT:
      return "SQLITE_INTERRUPT";
    case SQLITE_IOERR:
      return "SQLITE_IOERR";
    case SQLITE_CORRUPT:
      return "SQLITE_CORRUPT";
    case SQLITE_NOTFOUND:
      return "SQLITE_NOTFOUND";
    case SQLITE_FULL:
      return "SQLITE_FULL";
    case SQLITE_CANTOPEN:
      return "SQLITE_CANTOPEN";
    case SQLITE_PROTOCOL:
      return "SQLITE_PROTOCOL";
    case SQLITE_SCHEMA:
      return "SQLITE_SCHEMA";
    case SQLITE_TOOBIG:
      return "SQLITE_TOOBIG";
    case SQLITE_CONSTRAINT:
      return "SQLITE_CONSTRAINT";
    case SQLITE_MISMATCH:
      return "SQLITE_MISMATCH";
    case SQLITE_MISUSE:
      return "SQLITE_MISUSE";
    case SQLITE_AUTH:
      return "SQLITE_AUTH";
    case SQLITE_RANGE:
      return "SQLITE_RANGE";
    case SQLITE_NOTADB:
      return "SQLITE_NOTADB";
    default:
      return "SQLITE_UNKNOWN";
  }
}

}  // namespace

std::string_view Error::kind() const {
  return origin == Native::sqlite ? sqlite_words(native) : code_words(code);
}

std::string_view Error::code_name() const {
  return origin == Native::sqlite ? sqlite_name(primary_code()) : std::string_view();
}

std::string Error::to_string() const {
  const std::string_view name = code_name();
  if (name.empty()) return fmt::format("{}: {}", kind(), detail);
  if (native != primary_code())
    return fmt::format("{} ({}, extended code {}): {}", kind(), name, native, detail);
  return fmt::format("{} ({}): {}", kind(), name, detail);
}

Errc errno_code(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return Errc::not_found;
    case EACCES:
    case EPERM:
      return Errc::permission;
    case EEXIST:
      return Errc::exists;
    case ENOSPC:
    case EDQUOT:
      return Errc::full;
    case EROFS:
      return Errc::read_only;
    case EAGAIN:
#if EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
    case EBUSY:
    case EADDRINUSE:
      return Errc::busy;
    case ETIMEDOUT:
      return Errc::timeout;
    case ECONNREFUSED:
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ECONNRESET:
    case EPIPE:
    case EADDRNOTAVAIL:
      return Errc::unavailable;
    case EINVAL:
      return Errc::invalid;
    case EFBIG:
      return Errc::too_large;
    case ENOMEM:
      return Errc::internal;
    default:
      return Errc::io;
  }
}

Error os_error(int err, std::string detail) {
  return Error{errno_code(err), std::move(detail), err, Native::os};
}

Error from_errno(int err, std::string detail) {
  detail += ": ";
  detail += std::generic_category().message(err);
  return os_error(err, std::move(detail));
}

Errc sqlite_code(int rc) {
  switch (rc & 0xff) {
    case SQLITE_FULL:
      return Errc::full;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_PROTOCOL:
      return Errc::busy;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return Errc::corrupt;
    case SQLITE_READONLY:
      return Errc::read_only;
    case SQLITE_IOERR:
      return Errc::io;
    case SQLITE_CANTOPEN:
      return Errc::unavailable;
    case SQLITE_PERM:
    case SQLITE_AUTH:
      return Errc::permission;
    case SQLITE_CONSTRAINT:
      return rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY ? Errc::exists
                                                                                  : Errc::invalid;
    case SQLITE_MISMATCH:
      return Errc::invalid;
    case SQLITE_TOOBIG:
      return Errc::too_large;
    default:
      return Errc::internal;
  }
}

Error from_sqlite(int rc, std::string detail) {
  return Error{sqlite_code(rc), std::move(detail), rc, rc == 0 ? Native::none : Native::sqlite};
}

}  // namespace gpunode::error
