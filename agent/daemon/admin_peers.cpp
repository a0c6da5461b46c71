#include "gpunode/daemon/admin_peers.hpp"

#include <grp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

namespace gpunode::daemon {

namespace {

// getgrnam_r with a buffer that grows for large groups (up to 1 MiB).
AdminPeers::Lookup nss_lookup(const std::string& name) {
  group g{};
  group* found = nullptr;
  std::vector<char> buf(16384);
  int rc = 0;
  while ((rc = ::getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &found)) == ERANGE &&
         buf.size() < (1U << 20))
    buf.resize(buf.size() * 2);
  if (rc == 0 && found != nullptr) return found->gr_gid;
  if (rc == 0 || rc == ENOENT || rc == ESRCH) return std::nullopt;  // no such group
  return std::unexpected(rc);
}

}  // namespace

// The group file as stat(2) sees it (nullopt when it cannot): a file replaced by rename has another
// inode, one written in place other times or size.
std::optional<AdminPeers::FileId> AdminPeers::group_file_id() const {
  struct stat st {};
  if (::stat(group_file_.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_ino,          st.st_size,        st.st_mtim.tv_sec,
                st.st_mtim.tv_nsec, st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
}

AdminPeers::AdminPeers(const config::Config::Admin& admin, LookupFn lookup, std::string group_file)
    : lookup_(lookup ? std::move(lookup) : LookupFn{nss_lookup}), group_file_(std::move(group_file)) {
  configure(admin);
}

void AdminPeers::configure(const config::Config::Admin& admin) {
  std::lock_guard lock{mu_};
  uids_ = admin.allowed_uids;
  if (group_name_ != admin.allowed_group) gid_.reset();
  group_name_ = admin.allowed_group;
}

std::optional<gid_t> AdminPeers::resolve() {
  // The file before the lookup: a change made during it is seen by the next rescan.
  return resolve_at(std::chrono::steady_clock::now(), group_file_id());
}

std::optional<gid_t> AdminPeers::resolve_at(std::chrono::steady_clock::time_point at,
                                            std::optional<FileId> file) {
  std::string name;
  {
    std::lock_guard lock{mu_};
    name = group_name_;
  }
  const Lookup found = name.empty() ? Lookup{std::nullopt} : lookup_(name);
  std::lock_guard lock{mu_};
  asked_at_ = at;
  asked_over_ = file;
  failed_ = !found;
  if (!found) {
    // The lookup failed, which is not "no such group": the gid known before stays, so that the
    // group's open admin connections are not closed by a reload or a rescan that could not ask.
    return name == group_name_ ? gid_ : std::nullopt;
  }
  if (name == group_name_) gid_ = *found;  // unless configure() changed the name meanwhile
  return *found;
}

bool AdminPeers::due_over(std::chrono::steady_clock::time_point now,
                          const std::optional<FileId>& file) const {
  std::lock_guard lock{mu_};
  return !asked_at_ || failed_ || now - *asked_at_ >= kRecheck || file != asked_over_;
}

bool AdminPeers::due(std::chrono::steady_clock::time_point now) const {
  return due_over(now, group_file_id());
}

bool AdminPeers::resolve_if_due(std::chrono::steady_clock::time_point now) {
  const auto file = group_file_id();
  const bool due = due_over(now, file);
  if (due) resolve_at(now, file);
  return due;
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
