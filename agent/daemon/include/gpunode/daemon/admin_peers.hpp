// gpunode/daemon/admin_peers.hpp: who may use the admin socket (CONTRACT §4, §7 The admin socket).
//
// A peer whose uid is in admin.allowed_uids, or whose primary or supplementary groups (read from
// the socket itself: SO_PEERCRED and SO_PEERGROUPS) hold admin.allowed_group's gid, acts as
// platform-admin. allowed() runs on the network thread for every admin-socket connection and
// makes no NSS call: the group's name is resolved to a gid by resolve(), which the daemon runs at
// start, on SIGHUP and at every rescan on a thread that may block (an LDAP stall stalls nothing
// else), so a group created after start counts from the next rescan.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpunode/config/config.hpp"
#include "gpunode/http/server.hpp"

namespace gpunode::daemon {

class AdminPeers {
 public:
  explicit AdminPeers(const config::Config::Admin& admin);

  // Network thread: no system call, no NSS.
  [[nodiscard]] bool allowed(const http::Peer& peer) const;
  // May block (NSS): looks admin.allowed_group up again. Returns its gid if it exists.
  std::optional<gid_t> resolve();
  // SIGHUP: new allowed_uids and allowed_group (resolved again by the next resolve()).
  void configure(const config::Config::Admin& admin);
  [[nodiscard]] std::optional<gid_t> gid() const;

 private:
  // Shared between the network thread (allowed) and the slow thread (resolve, configure).
  mutable std::mutex mu_;
  std::vector<std::uint32_t> uids_;
  std::string group_name_;
  std::optional<gid_t> gid_;
};

}  // namespace gpunode::daemon
