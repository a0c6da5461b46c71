// gpunode/error/error.hpp: the agent's one error vocabulary, a code and a detail.
//
// A fallible function returns Result<T> (std::expected<T, Error>). The adapter that meets the
// outside world's error (an errno, SQLite's result code, libvirt's error number) decides the code
// once, where it makes the Error, as leveldb's Status and PosixError do; callers above it pass the
// Error on, choose by its code, and print its detail (what users see: the same words as before
// there was a code) or, in the log, to_string() (the kind in front).
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>
#include <utility>

namespace gpunode::error {

// What went wrong, in the terms a caller chooses by (retry, answer 4xx or 503, tell the operator).
enum class Errc : std::uint8_t {
  invalid,      // the input is wrong: a bad value, a malformed file or request
  not_found,    // no such file, entry or thing
  permission,   // not allowed: file modes, a refused peer
  exists,       // already there (a unique key, a file that must be new)
  busy,         // held by someone else now: a lock, EAGAIN; may pass on a retry
  full,         // the disk (or a quota) is full
  corrupt,      // stored data that cannot be what was written
  read_only,    // the file or file system takes no writes
  io,           // the device failed a read or write (and errno's that fit nowhere else)
  unavailable,  // the other end is not there: refused, unreachable, cannot open
  timeout,      // it did not answer in time
  protocol,     // the other end answered, but not as agreed
  too_large,    // over a limit on size
  internal,     // the agent's own fault (a bug, out of memory)
};

// What Error::native holds.
enum class Native : std::uint8_t {
  none,     // nothing (native is 0)
  os,       // an errno
  sqlite,   // SQLite's extended result code (SQLITE_FULL, SQLITE_IOERR_WRITE, ...)
  libvirt,  // libvirt's virErrorNumber (virGetLastError()'s code: VIR_ERR_NO_DOMAIN, ...), mapped
            // by vmctl::from_libvirt, where libvirt's header is (this library reads none)
};

struct Error {
  Errc code = Errc::internal;
  std::string detail;  // what failed and where, in the words users see (a file, a statement, strerror)
  int native = 0;      // the errno, SQLite or libvirt code it came from (origin says which), 0 when none
  Native origin = Native::none;

  // What an operator acts on, in words: "disk full", "busy", "corrupt", "read-only", "I/O error",
  // "permission denied", "not found", ... (the code's words). An error from SQLite keeps the
  // store's finer words for its result code ("cannot open", "constraint", "schema", "out of
  // memory", "error"; "internal" for SQLite code 0). Names no file: safe to show a caller.
  std::string_view kind() const;
  // SQLite's name of the primary code ("SQLITE_FULL") for an error from SQLite, else "" (libvirt's
  // errors too: their kind is the code's words, to_string() "KIND: DETAIL").
  std::string_view code_name() const;
  // SQLite's primary result code (native & 0xff) for an error from SQLite, else 0.
  int primary_code() const { return origin == Native::sqlite ? native & 0xff : 0; }
  // For the log: "disk full: DETAIL"; from SQLite "disk full (SQLITE_FULL): DETAIL" and, for an
  // extended code, "I/O error (SQLITE_IOERR, extended code 778): DETAIL".
  std::string to_string() const;
};

template <class T>
using Result = std::expected<T, Error>;

// `return fail(Errc::invalid, "...")` from a function that returns Result<T>.
inline std::unexpected<Error> fail(Errc code, std::string detail) {
  return std::unexpected(Error{code, std::move(detail)});
}

// The one mapping of an errno: ENOENT/ENOTDIR not_found, EACCES/EPERM permission, EEXIST exists,
// ENOSPC/EDQUOT full, EROFS read_only, EAGAIN/EWOULDBLOCK/EBUSY/EADDRINUSE busy, ETIMEDOUT timeout,
// ECONNREFUSED/ENETUNREACH/EHOSTUNREACH/ECONNRESET/EPIPE/EADDRNOTAVAIL unavailable, EINVAL invalid, EFBIG
// too_large, ENOMEM internal, else io.
// The detail is `detail + ": " + strerror(err)`, as the agent's messages have always read.
Errc errno_code(int err);
Error from_errno(int err, std::string detail);

// An errno's Error (errno_code(err), native `err`) whose detail is `detail` whole: for words that
// already say why ("missing", strerror alone, a reason before a hint), as the message always read.
Error os_error(int err, std::string detail);

// `e` with `context` and ": " before its detail ("api.listen: " + detail); its code and native
// kept. For a caller that says where: `return std::unexpected(with_context(std::move(e), "api.listen"))`.
inline Error with_context(Error e, std::string_view context) {
  e.detail.insert(0, std::string(context) + ": ");
  return e;
}

// `e` with to_string() as its detail (the kind in front): for a message that has always shown the
// kind ("disk full (SQLITE_FULL): ..."), so that the callers above print the detail, as elsewhere.
inline Error with_kind(Error e) {
  e.detail = e.to_string();
  return e;
}

// The one mapping of SQLite's result code (`rc`, primary or extended; 0 for the agent's own):
// FULL full, BUSY/LOCKED/PROTOCOL busy, CORRUPT/NOTADB corrupt, READONLY read_only, IOERR io,
// CANTOPEN unavailable, PERM/AUTH permission, a UNIQUE or PRIMARY KEY constraint exists (another
// constraint, MISMATCH invalid), TOOBIG too_large, everything else internal. The detail is kept.
Errc sqlite_code(int rc);
Error from_sqlite(int rc, std::string detail);

}  // namespace gpunode::error
