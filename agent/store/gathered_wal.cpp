#include "gathered_wal.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>

namespace gpunode::store::detail {
namespace {

// The most gathered at once: 15 frames of a 4 KiB page, more than a create's 6 to 11; a larger
// commit is written in several. Only what is gathered is touched, so a commit's pages stay what
// it adds to the agent's memory. The unix VFS writes at most 128 KiB - 1 bytes in one call (it
// masks a larger amount): a gathered write must stay under that.
constexpr int kMostGathered = 64 * 1024;
static_assert(kMostGathered <= 0x1ffff, "the unix VFS writes at most 0x1ffff bytes in one call");

std::atomic<unsigned long long> g_asked{0}, g_written{0};  // any thread: relaxed counters

// The default VFS: set once by register_once (under the static's initialisation lock) before the
// VFS is registered, so before any thread can open through it; only read after that.
sqlite3_vfs* g_base = nullptr;

// A WAL file: our methods in front, the default VFS's file behind (in the same allocation, at
// kRealAt). `pending` holds bytes [at, at + used) not yet written; each file is used by one
// connection at a time (SQLite's own locking), so the file needs no lock of its own.
struct WalFile {
  sqlite3_file io;  // first: SQLite sees this
  sqlite3_file* real;
  std::unique_ptr<char[]> pending;
  sqlite3_int64 at;
  int used;
};
constexpr std::size_t kRealAt =
    (sizeof(WalFile) + alignof(std::max_align_t) - 1) / alignof(std::max_align_t) * alignof(std::max_align_t);

WalFile& wal(sqlite3_file* f) {
  return *reinterpret_cast<WalFile*>(f);
}
const sqlite3_io_methods& real_io(WalFile& w) {
  return *w.real->pMethods;
}

int write_pending(WalFile& w) {
  if (w.used == 0) return SQLITE_OK;
  const int n = w.used;
  w.used = 0;  // written or failed, it is not written again: a failure fails the commit
  g_written.fetch_add(1, std::memory_order_relaxed);
  return real_io(w).xWrite(w.real, w.pending.get(), n, w.at);
}

int wal_close(sqlite3_file* f) {
  auto& w = wal(f);
  const int wrote = write_pending(w);
  const int rc = real_io(w).xClose(w.real);
  w.~WalFile();
  return wrote != SQLITE_OK ? wrote : rc;
}
int wal_read(sqlite3_file* f, void* out, int n, sqlite3_int64 off) {
  auto& w = wal(f);
  if (int rc = write_pending(w); rc != SQLITE_OK) return rc;
  return real_io(w).xRead(w.real, out, n, off);
}
int wal_write(sqlite3_file* f, const void* data, int n, sqlite3_int64 off) {
  auto& w = wal(f);
  g_asked.fetch_add(1, std::memory_order_relaxed);
  const bool follows = w.used > 0 && off == w.at + w.used && n <= kMostGathered - w.used;
  if (!follows) {
    if (int rc = write_pending(w); rc != SQLITE_OK) return rc;
    if (n > kMostGathered) {
      g_written.fetch_add(1, std::memory_order_relaxed);
      return real_io(w).xWrite(w.real, data, n, off);
    }
    if (!w.pending) w.pending = std::make_unique_for_overwrite<char[]>(kMostGathered);
    w.at = off;
  }
  std::memcpy(w.pending.get() + w.used, data, static_cast<std::size_t>(n));
  w.used += n;
  return SQLITE_OK;
}
int wal_truncate(sqlite3_file* f, sqlite3_int64 size) {
  auto& w = wal(f);
  if (int rc = write_pending(w); rc != SQLITE_OK) return rc;
  return real_io(w).xTruncate(w.real, size);
}
int wal_sync(sqlite3_file* f, int flags) {
  auto& w = wal(f);
  if (int rc = write_pending(w); rc != SQLITE_OK) return rc;
  return real_io(w).xSync(w.real, flags);
}
int wal_file_size(sqlite3_file* f, sqlite3_int64* size) {
  auto& w = wal(f);
  if (int rc = write_pending(w); rc != SQLITE_OK) return rc;
  return real_io(w).xFileSize(w.real, size);
}
int wal_lock(sqlite3_file* f, int level) {
  return real_io(wal(f)).xLock(wal(f).real, level);
}
int wal_unlock(sqlite3_file* f, int level) {
  return real_io(wal(f)).xUnlock(wal(f).real, level);
}
int wal_check_reserved(sqlite3_file* f, int* out) {
  return real_io(wal(f)).xCheckReservedLock(wal(f).real, out);
}
int wal_file_control(sqlite3_file* f, int op, void* arg) {
  auto& w = wal(f);
  if (int rc = write_pending(w); rc != SQLITE_OK) return rc;
  return real_io(w).xFileControl(w.real, op, arg);
}
int wal_sector_size(sqlite3_file* f) {
  return real_io(wal(f)).xSectorSize(wal(f).real);
}
int wal_device(sqlite3_file* f) {
  return real_io(wal(f)).xDeviceCharacteristics(wal(f).real);
}

// Version 1: a WAL file has no shared memory and is never mapped (SQLite asks those of the
// database file, which is the default VFS's own, untouched).
constexpr sqlite3_io_methods kWalMethods = {
    .iVersion = 1,
    .xClose = wal_close,
    .xRead = wal_read,
    .xWrite = wal_write,
    .xTruncate = wal_truncate,
    .xSync = wal_sync,
    .xFileSize = wal_file_size,
    .xLock = wal_lock,
    .xUnlock = wal_unlock,
    .xCheckReservedLock = wal_check_reserved,
    .xFileControl = wal_file_control,
    .xSectorSize = wal_sector_size,
    .xDeviceCharacteristics = wal_device,
    .xShmMap = nullptr,
    .xShmLock = nullptr,
    .xShmBarrier = nullptr,
    .xShmUnmap = nullptr,
    .xFetch = nullptr,
    .xUnfetch = nullptr,
};

int gathering_open(sqlite3_vfs*, const char* name, sqlite3_file* f, int flags, int* out_flags) {
  // Every file but a WAL is the default VFS's own, in place: nothing in front of it.
  if ((flags & SQLITE_OPEN_WAL) == 0) return g_base->xOpen(g_base, name, f, flags, out_flags);
  auto* real = reinterpret_cast<sqlite3_file*>(reinterpret_cast<char*>(f) + kRealAt);
  std::memset(real, 0, static_cast<std::size_t>(g_base->szOsFile));
  const int rc = g_base->xOpen(g_base, name, real, flags, out_flags);
  if (rc != SQLITE_OK) {
    // SQLite calls xClose only when pMethods is set; the default VFS's file closes itself on failure.
    if (real->pMethods != nullptr) real->pMethods->xClose(real);
    f->pMethods = nullptr;
    return rc;
  }
  new (f) WalFile{{&kWalMethods}, real, nullptr, 0, 0};
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
  vfs.szOsFile = std::max(g_base->szOsFile, static_cast<int>(kRealAt) + g_base->szOsFile);
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
