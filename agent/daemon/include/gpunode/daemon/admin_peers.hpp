// gpunode/daemon/admin_peers.hpp: who may use the admin socket (CONTRACT §4, §7 The admin socket).
//
// A peer whose uid is in admin.allowed_uids, or whose primary or supplementary groups (read from
// the socket itself: SO_PEERCRED and SO_PEERGROUPS) hold admin.allowed_group's gid, acts as
// platform-admin. allowed() runs on the network thread for every admin-socket connection and
// makes no NSS call: the group's name is resolved to a gid by resolve(), which the daemon runs at
// start and on SIGHUP, and by resolve_if_due() after a rescan that finds it due(), on a thread
// that may block (an LDAP stall stalls nothing else). A lookup is the largest part of an idle agent's CPU
// (glibc reads /etc/group, then asks systemd-userdbd over varlink when the group is not there: 0.5 ms here),
// so a rescan asks again only when /etc/group changed or kRecheck has passed: a group created after start
// counts from the next rescan when it is made in /etc/group, within kRecheck from another NSS source (LDAP,
// systemd-userdb), and at once on a reload.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <ctime>
#include <expected>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpunode/config/config.hpp"
#include "gpunode/http/server.hpp"

namespace gpunode::daemon {

class AdminPeers {
 public:
  // What NSS says of a group name: its gid, nullopt when there is no such group, or the errno of
  // a lookup that itself failed (an LDAP or NSS outage).
  using Lookup = std::expected<std::optional<gid_t>, int>;
  using LookupFn = std::function<Lookup(const std::string& name)>;
  static constexpr std::chrono::minutes kRecheck{5};

  // `lookup` and `group_file` are the system's (getgrnam_r, /etc/group) but for tests.
  explicit AdminPeers(const config::Config::Admin& admin, LookupFn lookup = {},
                      std::string group_file = "/etc/group");

  // Network thread: no system call, no NSS.
  [[nodiscard]] bool allowed(const http::Peer& peer) const;
  // May block (NSS): looks admin.allowed_group up again. Returns its gid if it exists.
  std::optional<gid_t> resolve();
  // Whether resolve_if_due() would ask NSS now: /etc/group changed since the last lookup, kRecheck
  // has passed since it, or it failed. No NSS, one stat: the daemon asks it at every rescan and
  // wakes the slow thread only when it says so.
  [[nodiscard]] bool due(std::chrono::steady_clock::time_point now) const;
  // May block: resolve() when due(now). Returns whether it asked.
  bool resolve_if_due(std::chrono::steady_clock::time_point now);
  // SIGHUP: new allowed_uids and allowed_group (resolved again by the next resolve()).
  void configure(const config::Config::Admin& admin);
  [[nodiscard]] std::optional<gid_t> gid() const;

 private:
  // /etc/group's inode, size and times: a change to any is a change of the file.
  struct FileId {
    ino_t inode;
    off_t size;
    time_t mtime_s;
    long mtime_ns;
    time_t ctime_s;
    long ctime_ns;
    bool operator==(const FileId&) const = default;
  };
  [[nodiscard]] std::optional<FileId> group_file_id() const;
  [[nodiscard]] bool due_over(std::chrono::steady_clock::time_point now,
                              const std::optional<FileId>& file) const;
  std::optional<gid_t> resolve_at(std::chrono::steady_clock::time_point at, std::optional<FileId> file);

  LookupFn lookup_;
  std::string group_file_;
  // Shared between the network thread (allowed) and the slow thread (resolve, configure).
  mutable std::mutex mu_;
  std::vector<std::uint32_t> uids_;
  std::string group_name_;
  std::optional<gid_t> gid_;
  // When and over which /etc/group resolve() last asked, and whether that failed.
  std::optional<std::chrono::steady_clock::time_point> asked_at_;
  std::optional<FileId> asked_over_;  // /etc/group then (nullopt when it could not be stat'ed)
  bool failed_ = false;
};

}  // namespace gpunode::daemon
