#include "gathered_wal.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <new>
#include <type_traits>

namespace gpunode::store::detail {
namespace {

// The most gathered at once: 15 frames of a 4 KiB page, more than a create's 6 to 11; a larger
// commit is written in several. Only what is gathered is touched, so a commit's pages stay what
// it adds to the agent's memory. The unix VFS writes at most 128 KiB - 1 bytes in one call (it
// masks a larger amount): a gathered write must stay under that.
constexpr int kMostGathered = 64 * 1024;
static_assert(kMostGathered <= 0x1ffff, "the unix VFS writes at most 0x1ffff bytes in one call");

// SQLite's WAL write lock: the first of the shared-memory locks (wal.c's WAL_WRITE_LOCK). A
// connection holds it exclusively from its first frame to the end of its transaction.
constexpr int kWalWriteLock = 0;

std::atomic<unsigned long long> g_asked{0}, g_written{0};  // any thread: relaxed counters

// The default VFS: set once by register_once (under the static's initialisation lock) before the
// VFS is registered, so before any thread can open through it; only read after that.
sqlite3_vfs* g_base = nullptr;

struct DbFile;

// A WAL file: our methods in front, the default VFS's file behind (in the same allocation, at
// kRealAt). `pending` holds the bytes [at, at + used) not yet written. `db` is its database's file,
// whose write lock bounds what may stay pending. Both files belong to one connection and are used
// by its thread only: they need no lock of their own.
struct WalFile {
  sqlite3_file io;  // first: SQLite sees this
  sqlite3_file* real;
  DbFile* db;     // nullptr: not paired, nothing is gathered
  char* pending;  // kMostGathered bytes once the first write is gathered
  sqlite3_int64 at;
  int used;
};
// The main database file: the default VFS's, with the shared-memory lock watched.
struct DbFile {
  sqlite3_file io;
  sqlite3_file* real;
  WalFile* wal;  // while its WAL is open
};
static_assert(std::is_standard_layout_v<WalFile> && std::is_standard_layout_v<DbFile> &&
                  std::is_trivially_destructible_v<WalFile> && std::is_trivially_destructible_v<DbFile>,
              "SQLite hands back the sqlite3_file at the start of each");

constexpr std::size_t round_up(std::size_t n) {
  return (n + alignof(std::max_align_t) - 1) / alignof(std::max_align_t) * alignof(std::max_align_t);
}
constexpr std::size_t kRealAt = round_up(std::max(sizeof(WalFile), sizeof(DbFile)));

sqlite3_file* real_behind(sqlite3_file* f) {
  return reinterpret_cast<sqlite3_file*>(reinterpret_cast<char*>(f) + kRealAt);
}
WalFile& wal(sqlite3_file* f) {
  return *reinterpret_cast<WalFile*>(f);
}
DbFile& db(sqlite3_file* f) {
  return *reinterpret_cast<DbFile*>(f);
}
const sqlite3_io_methods& io(sqlite3_file* real) {
  return *real->pMethods;
}
// A call SQLite makes of our file, made of the default VFS's file behind it, unchanged.
template <auto Method, class... Args>
auto pass(sqlite3_file* f, Args... args) {
  sqlite3_file* real = real_behind(f);
  return (real->pMethods->*Method)(real, args...);
}
using M = sqlite3_io_methods;

// Writes what is gathered. Whatever the outcome it is not written again: a failure fails the call
// that asked (a sync fails the commit).
int write_pending(WalFile& w) {
  if (w.used == 0) return SQLITE_OK;
  const int n = w.used;
  w.used = 0;
  g_written.fetch_add(1, std::memory_order_relaxed);
  return io(w.real).xWrite(w.real, w.pending, n, w.at);
}
// The same, before a call that is not a write: an error becomes an I/O error, so SQLite rolls the
// whole transaction back (a "disk full" there would roll back only the statement, keeping frames
// that never reached the file).
int write_pending_before(WalFile& w) {
  const int rc = write_pending(w);
  return rc == SQLITE_OK ? rc : SQLITE_IOERR_WRITE;
}

int wal_close(sqlite3_file* f) {
  auto& w = wal(f);
  const int wrote = write_pending(w);
  if (w.db != nullptr) w.db->wal = nullptr;
  const int rc = io(w.real).xClose(w.real);
  delete[] w.pending;
  return wrote != SQLITE_OK ? wrote : rc;
}
int wal_read(sqlite3_file* f, void* out, int n, sqlite3_int64 off) {
  auto& w = wal(f);
  if (int rc = write_pending_before(w); rc != SQLITE_OK) return rc;
  return io(w.real).xRead(w.real, out, n, off);
}
int wal_write(sqlite3_file* f, const void* data, int n, sqlite3_int64 off) {
  auto& w = wal(f);
  g_asked.fetch_add(1, std::memory_order_relaxed);
  const bool follows = w.used > 0 && off == w.at + w.used && n <= kMostGathered - w.used;
  if (!follows) {
    if (int rc = write_pending(w); rc != SQLITE_OK) return rc;
    if (w.db != nullptr && w.pending == nullptr) {
      w.pending = new (std::nothrow) char[kMostGathered];
      if (w.pending == nullptr) {  // no memory for it: unpaired, written as it comes from now on
        w.db->wal = nullptr;
        w.db = nullptr;
      }
    }
    if (w.db == nullptr || n > kMostGathered) {  // written as it comes
      g_written.fetch_add(1, std::memory_order_relaxed);
      return io(w.real).xWrite(w.real, data, n, off);
    }
    w.at = off;
  }
  std::memcpy(w.pending + w.used, data, static_cast<std::size_t>(n));
  w.used += n;
  return SQLITE_OK;
}
int wal_truncate(sqlite3_file* f, sqlite3_int64 size) {
  auto& w = wal(f);
  if (int rc = write_pending_before(w); rc != SQLITE_OK) return rc;
  return io(w.real).xTruncate(w.real, size);
}
int wal_sync(sqlite3_file* f, int flags) {
  auto& w = wal(f);
  if (int rc = write_pending(w); rc != SQLITE_OK) return rc;
  return io(w.real).xSync(w.real, flags);
}
int wal_file_size(sqlite3_file* f, sqlite3_int64* size) {
  auto& w = wal(f);
  if (int rc = write_pending_before(w); rc != SQLITE_OK) return rc;
  return io(w.real).xFileSize(w.real, size);
}
int wal_file_control(sqlite3_file* f, int op, void* arg) {
  auto& w = wal(f);
  if (int rc = write_pending_before(w); rc != SQLITE_OK) return rc;
  return io(w.real).xFileControl(w.real, op, arg);
}

// Version 1: a WAL file has no shared memory and is never mapped (SQLite asks those of the
// database file).
constexpr sqlite3_io_methods kWalMethods = {
    .iVersion = 1,
    .xClose = wal_close,
    .xRead = wal_read,
    .xWrite = wal_write,
    .xTruncate = wal_truncate,
    .xSync = wal_sync,
    .xFileSize = wal_file_size,
    .xLock = pass<&M::xLock, int>,
    .xUnlock = pass<&M::xUnlock, int>,
    .xCheckReservedLock = pass<&M::xCheckReservedLock, int*>,
    .xFileControl = wal_file_control,
    .xSectorSize = pass<&M::xSectorSize>,
    .xDeviceCharacteristics = pass<&M::xDeviceCharacteristics>,
    .xShmMap = nullptr,
    .xShmLock = nullptr,
    .xShmBarrier = nullptr,
    .xShmUnmap = nullptr,
    .xFetch = nullptr,
    .xUnfetch = nullptr,
};

// The database file: every call is the default VFS's. Three of them first write what its WAL
// gathered: the release of the WAL's write lock; the release of the file's own lock (what ends a
// transaction in exclusive locking mode, which takes no shared-memory lock); and the barrier SQLite
// puts between the two copies of its WAL index header (the moment a commit is shown to readers).
// Under synchronous=FULL a commit's frames were written at its sync, so what is left at the first
// two is a transaction's that did not commit (pages spilled, then rolled back): written as the
// default VFS would have, before another connection may write frames where they lie. Its error is
// logged and dropped: those frames are past the last commit, and nothing reads them.
void write_pending_at_release(DbFile& d) {
  if (d.wal == nullptr) return;
  if (const int rc = write_pending(*d.wal); rc != SQLITE_OK)
    sqlite3_log(rc, "gathered WAL: frames of a transaction that did not commit were not written");
}
int db_shm_lock(sqlite3_file* f, int offset, int n, int flags) {
  auto& d = db(f);
  const int release = SQLITE_SHM_UNLOCK | SQLITE_SHM_EXCLUSIVE;
  if ((flags & release) == release && offset <= kWalWriteLock && kWalWriteLock < offset + n)
    write_pending_at_release(d);
  return io(d.real).xShmLock(d.real, offset, n, flags);
}
int db_close(sqlite3_file* f) {
  auto& d = db(f);
  if (d.wal != nullptr) d.wal->db = nullptr;
  return io(d.real).xClose(d.real);
}
int db_unlock(sqlite3_file* f, int level) {
  write_pending_at_release(db(f));
  return io(db(f).real).xUnlock(db(f).real, level);
}
void db_shm_barrier(sqlite3_file* f) {
  write_pending_at_release(db(f));
  io(db(f).real).xShmBarrier(db(f).real);
}
int db_fetch(sqlite3_file* f, sqlite3_int64 off, int n, void** out) {
  *out = nullptr;  // no mapping: SQLite reads instead
  const auto& m = io(db(f).real);
  return m.iVersion >= 3 ? m.xFetch(db(f).real, off, n, out) : SQLITE_OK;
}
int db_unfetch(sqlite3_file* f, sqlite3_int64 off, void* p) {
  const auto& m = io(db(f).real);
  return m.iVersion >= 3 ? m.xUnfetch(db(f).real, off, p) : SQLITE_OK;
}

constexpr sqlite3_io_methods kDbMethods = {
    .iVersion = 3,
    .xClose = db_close,
    .xRead = pass<&M::xRead, void*, int, sqlite3_int64>,
    .xWrite = pass<&M::xWrite, const void*, int, sqlite3_int64>,
    .xTruncate = pass<&M::xTruncate, sqlite3_int64>,
    .xSync = pass<&M::xSync, int>,
    .xFileSize = pass<&M::xFileSize, sqlite3_int64*>,
    .xLock = pass<&M::xLock, int>,
    .xUnlock = db_unlock,
    .xCheckReservedLock = pass<&M::xCheckReservedLock, int*>,
    .xFileControl = pass<&M::xFileControl, int, void*>,
    .xSectorSize = pass<&M::xSectorSize>,
    .xDeviceCharacteristics = pass<&M::xDeviceCharacteristics>,
    .xShmMap = pass<&M::xShmMap, int, int, int, void volatile**>,
    .xShmLock = db_shm_lock,
    .xShmBarrier = db_shm_barrier,
    .xShmUnmap = pass<&M::xShmUnmap, int>,
    .xFetch = db_fetch,
    .xUnfetch = db_unfetch,
};

// A database file whose default-VFS file has no shared memory (a default VFS without it): the same
// calls, and none of shared memory or mapping, so SQLite will not put it in WAL mode either.
constexpr sqlite3_io_methods without_shared_memory(sqlite3_io_methods m) {
  m.iVersion = 1;
  m.xShmMap = nullptr;
  m.xShmLock = nullptr;
  m.xShmBarrier = nullptr;
  m.xShmUnmap = nullptr;
  m.xFetch = nullptr;
  m.xUnfetch = nullptr;
  return m;
}
constexpr sqlite3_io_methods kDbMethodsNoShm = without_shared_memory(kDbMethods);

int gathering_open(sqlite3_vfs*, const char* name, sqlite3_file* f, int flags, int* out_flags) {
  const bool is_wal = (flags & SQLITE_OPEN_WAL) != 0, is_db = (flags & SQLITE_OPEN_MAIN_DB) != 0;
  // Journals, temporary files and the rest are the default VFS's own, in place.
  if (!is_wal && !is_db) return g_base->xOpen(g_base, name, f, flags, out_flags);
  sqlite3_file* real = real_behind(f);
  std::memset(real, 0, static_cast<std::size_t>(g_base->szOsFile));
  const int rc = g_base->xOpen(g_base, name, real, flags, out_flags);
  if (rc != SQLITE_OK) {
    // SQLite calls xClose after a failed open only when pMethods is set: close the file behind
    // ourselves if it was left open, and leave ours unset.
    if (real->pMethods != nullptr) real->pMethods->xClose(real);
    f->pMethods = nullptr;
    return rc;
  }
  if (is_db) {
    const bool shm = real->pMethods->iVersion >= 2 && real->pMethods->xShmMap != nullptr;
    new (f) DbFile{{shm ? &kDbMethods : &kDbMethodsNoShm}, real, nullptr};
    return SQLITE_OK;
  }
  // The WAL's database is open already, and through this VFS: pair them. Unpaired, nothing is
  // gathered (the WAL is written as it comes).
  auto* w = new (f) WalFile{{&kWalMethods}, real, nullptr, nullptr, 0, 0};
  // Without power-safe overwrite SQLite pads a commit to the sector and writes the last frame's
  // tail after the sync: nothing is gathered then.
  sqlite3_file* main = sqlite3_database_file_object(name);
  if (main != nullptr && main->pMethods == &kDbMethods &&
      (main->pMethods->xDeviceCharacteristics(main) & SQLITE_IOCAP_POWERSAFE_OVERWRITE) != 0) {
    w->db = &db(main);
    w->db->wal = w;
  }
  return SQLITE_OK;
}

// The rest of the VFS is the default's, called with the default's own object.
int vfs_delete(sqlite3_vfs*, const char* name, int sync_dir) {
  return g_base->xDelete(g_base, name, sync_dir);
}
int vfs_access(sqlite3_vfs*, const char* name, int flags, int* out) {
  return g_base->xAccess(g_base, name, flags, out);
}
int vfs_full_pathname(sqlite3_vfs*, const char* name, int n, char* out) {
  return g_base->xFullPathname(g_base, name, n, out);
}
void* vfs_dl_open(sqlite3_vfs*, const char* name) {
  return g_base->xDlOpen(g_base, name);
}
void vfs_dl_error(sqlite3_vfs*, int n, char* out) {
  g_base->xDlError(g_base, n, out);
}
void (*vfs_dl_sym(sqlite3_vfs*, void* h, const char* sym))() {
  return g_base->xDlSym(g_base, h, sym);
}
void vfs_dl_close(sqlite3_vfs*, void* h) {
  g_base->xDlClose(g_base, h);
}
int vfs_randomness(sqlite3_vfs*, int n, char* out) {
  return g_base->xRandomness(g_base, n, out);
}
int vfs_sleep(sqlite3_vfs*, int us) {
  return g_base->xSleep(g_base, us);
}
int vfs_current_time(sqlite3_vfs*, double* out) {
  return g_base->xCurrentTime(g_base, out);
}
int vfs_last_error(sqlite3_vfs*, int n, char* out) {
  return g_base->xGetLastError != nullptr ? g_base->xGetLastError(g_base, n, out) : 0;
}
int vfs_current_time64(sqlite3_vfs*, sqlite3_int64* out) {
  if (g_base->iVersion >= 2 && g_base->xCurrentTimeInt64 != nullptr)
    return g_base->xCurrentTimeInt64(g_base, out);
  double days = 0;
  const int rc = g_base->xCurrentTime(g_base, &days);
  *out = static_cast<sqlite3_int64>(days * 86400000.0);
  return rc;
}

const char* register_once() {
  g_base = sqlite3_vfs_find(nullptr);
  if (g_base == nullptr) return nullptr;
  static sqlite3_vfs vfs{};
  vfs.iVersion = 2;
  vfs.szOsFile = static_cast<int>(kRealAt) + g_base->szOsFile;
  vfs.mxPathname = g_base->mxPathname;
  vfs.zName = "gpunode-gathered-wal";
  vfs.xOpen = gathering_open;
  vfs.xDelete = vfs_delete;
  vfs.xAccess = vfs_access;
  vfs.xFullPathname = vfs_full_pathname;
  vfs.xDlOpen = vfs_dl_open;
  vfs.xDlError = vfs_dl_error;
  vfs.xDlSym = vfs_dl_sym;
  vfs.xDlClose = vfs_dl_close;
  vfs.xRandomness = vfs_randomness;
  vfs.xSleep = vfs_sleep;
  vfs.xCurrentTime = vfs_current_time;
  vfs.xGetLastError = vfs_last_error;
  vfs.xCurrentTimeInt64 = vfs_current_time64;
  if (sqlite3_vfs_register(&vfs, 0) != SQLITE_OK) return nullptr;
  return vfs.zName;
}

}  // namespace

const char* gathering_vfs() {
  static const char* const name = register_once();  // once, under C++'s static initialisation lock
  return name;
}

GatheredWrites gathered_writes() {
  return {g_asked.load(std::memory_order_relaxed), g_written.load(std::memory_order_relaxed)};
}

}  // namespace gpunode::store::detail
