// The SQLite VFS every Database opens through (private to gpunode_store): the platform's default
// VFS, except that the writes to a WAL file that follow each other in the file are gathered and
// written as one when SQLite next syncs, reads, sizes, truncates, controls or closes that file, or
// when its database file releases the WAL's write lock or its own lock, or shows a commit to
// readers (the barrier inside the WAL index header's write).
//
// Why: SQLite writes a WAL frame as two writes (its 24-byte header, then the page), so a commit of
// N pages is 2N write calls before its one fdatasync; a reservation's create commits 6 to 11 pages.
// Gathered, they are one call. Measured here (2 vCPUs, ext4): a 7-page commit with synchronous=OFF
// 45 -> 25 µs, with synchronous=FULL 200 -> 165 µs (docs/benchmarks.md).
//
// It needs synchronous=FULL (or EXTRA), which Database::open sets and checks: SQLite then syncs the
// WAL before its index shows a commit's frames to any reader, and the sync writes what was gathered
// first. With NORMAL or OFF the frames would be written at the index's barrier, where a failed
// write can only be logged: never open a database through it with those. What a transaction wrote
// and did not commit (pages spilled, then rolled back) is written before the write lock, or in
// exclusive locking mode the file's lock, is released, so it never lands on frames another
// connection commits later. A failed gathered write fails the call that wrote it: the sync (the
// commit fails, as it would have at the write), or a read, size or truncate (as an I/O error, so
// SQLite rolls the whole transaction back). Without power-safe overwrite (SQLite then writes a
// commit's last sector after its sync) nothing is gathered.
#pragma once

namespace gpunode::store::detail {

// The VFS's name, registered (not as the default) at the first call; nullptr if SQLite has no
// default VFS to wrap, in which case the caller opens with SQLite's default.
const char* gathering_vfs();

// What the gathering did in this process (both counters only grow): the WAL writes SQLite asked
// for, and the writes that reached the file for them.
struct GatheredWrites {
  unsigned long long asked = 0;
  unsigned long long written = 0;
};
GatheredWrites gathered_writes();

}  // namespace gpunode::store::detail
