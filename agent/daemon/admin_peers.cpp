#include "gpunode/daemon/admin_peers.hpp"

#include <grp.h>

#include <algorithm>
#include <cerrno>

namespace gpunode::daemon {

AdminPeers::AdminPeers(const config::Config::Admin& admin) {
  configure(admin);
}

void AdminPeers::configure(const config::Config::Admin& admin) {
  std::lock_guard lock{mu_};
  uids_ = admin.allowed_uids;
  if (group_name_ != admin.allowed_group) gid_.reset();
  group_name_ = admin.allowed_group;
}

std::optional<gid_t> AdminPeers::resolve() {
  std::string name;
  {
    std::lock_guard lock{mu_};
    name = group_name_;
  }
  std::optional<gid_t> found_gid;
  if (!name.empty()) {
    group g{};
    group* found = nullptr;
    std::vector<char> buf(16384);
    int rc = 0;
    while ((rc = ::getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &found)) == ERANGE &&
           buf.size() < (1U << 20))
      buf.resize(buf.size() * 2);
    if (rc == 0 && found != nullptr) found_gid = found->gr_gid;
    if (rc != 0 && rc != ENOENT && rc != ESRCH) {
      // The lookup failed (an LDAP or NSS outage), which is not "no such group": the gid known
      // before stays, so that the group's open admin connections are not closed by a reload or a
      // rescan that could not ask.
      std::lock_guard lock{mu_};
      return name == group_name_ ? gid_ : std::nullopt;
    }
  }
  std::lock_guard lock{mu_};
  if (name == group_name_) gid_ = found_gid;  // unless configure() changed the name meanwhile
  return found_gid;
}

std::optional<gid_t> AdminPeers::gid() const {
  std::lock_guard lock{mu_};
  return gid_;
}

bool AdminPeers::allowed(const http::Peer& peer) const {
  if (!peer.uid) return false;
  std::lock_guard lock{mu_};
  if (std::find(uids_.begin(), uids_.end(), static_cast<std::uint32_t>(*peer.uid)) != uids_.end())
    return true;
  if (!gid_) return false;
  if (peer.gid && *peer.gid == *gid_) return true;
  return std::find(peer.groups.begin(), peer.groups.end(), *gid_) != peer.groups.end();
}

}  // namespace gpunode::daemon
