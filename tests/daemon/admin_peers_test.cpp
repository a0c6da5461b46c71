// Who may use the admin socket (admin_peers.hpp): the group's gid as NSS said it, and when a rescan
// asks NSS again (a lookup is most of an idle agent's CPU): after /etc/group changed, after
// kRecheck, after a lookup that failed; never twice in a row otherwise (and due() says so without
// asking).
#include "gpunode/daemon/admin_peers.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <time.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "temp_dir.hpp"

using gpunode::daemon::AdminPeers;
using namespace std::chrono_literals;

namespace {

// An NSS the test sets: the groups it knows, or an outage; counts the lookups.
struct FakeNss {
  std::map<std::string, gid_t> groups;
  int error = 0;
  int asked = 0;
  AdminPeers::LookupFn fn() {
    return [this](const std::string& name) {
      ++asked;
      if (error != 0) return AdminPeers::Lookup{std::unexpected(error)};
      const auto it = groups.find(name);
      return it == groups.end() ? AdminPeers::Lookup{std::nullopt} : AdminPeers::Lookup{it->second};
    };
  }
};

gpunode::config::Config::Admin admin(std::string group, std::vector<std::uint32_t> uids = {}) {
  gpunode::config::Config::Admin a;
  a.allowed_group = std::move(group);
  a.allowed_uids = std::move(uids);
  return a;
}

gpunode::http::Peer peer(uid_t uid, gid_t gid, std::vector<gid_t> groups = {}) {
  gpunode::http::Peer p;
  p.kind = gpunode::http::Peer::Kind::unix_socket;
  p.uid = uid;
  p.gid = gid;
  p.groups = std::move(groups);
  return p;
}

void write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::trunc) << text;
}

// Gives the file another modification time than any write in this second has (a write within the
// file system's timestamp granularity could otherwise leave it looking unchanged).
void touch_later(const std::filesystem::path& path, long seconds) {
  struct timespec times[2];
  ::clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec += seconds;
  times[1] = times[0];
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
}

}  // namespace

TEST_CASE("admin peers: a uid in allowed_uids, or the group's gid as primary or supplementary group") {
  FakeNss nss{.groups = {{"gpunode-admin", 4242}}};
  gpunode::test::TempDir dir;
  AdminPeers peers{admin("gpunode-admin", {1001}), nss.fn(), (dir / "group").string()};
  CHECK_FALSE(peers.allowed(peer(2000, 4242)));  // not resolved yet: no gid is trusted
  CHECK(peers.resolve() == std::optional<gid_t>{4242});
  CHECK(peers.allowed(peer(1001, 100)));
  CHECK(peers.allowed(peer(2000, 4242)));
  CHECK(peers.allowed(peer(2000, 100, {27, 4242})));
  CHECK_FALSE(peers.allowed(peer(2000, 100, {27})));
  gpunode::http::Peer no_uid = peer(1001, 4242);
  no_uid.uid.reset();
  CHECK_FALSE(peers.allowed(no_uid));
}

TEST_CASE(
    "admin peers: a rescan asks NSS again only when /etc/group changed, kRecheck passed, or it failed") {
  FakeNss nss{.groups = {}};
  gpunode::test::TempDir dir;
  const auto group_file = dir / "group";
  write(group_file, "root:x:0:\n");
  AdminPeers peers{admin("gpunode-admin"), nss.fn(), group_file.string()};
  const auto t0 = std::chrono::steady_clock::now();

  CHECK(peers.due(t0));
  CHECK(nss.asked == 0);            // due() itself never asks
  CHECK(peers.resolve_if_due(t0));  // never asked: asks
  CHECK(nss.asked == 1);
  CHECK_FALSE(peers.gid());
  CHECK_FALSE(peers.due(t0 + 30s));
  CHECK_FALSE(peers.resolve_if_due(t0 + 30s));  // nothing changed: NSS is not asked
  CHECK_FALSE(peers.resolve_if_due(t0 + 4min));
  CHECK(nss.asked == 1);

  SUBCASE("the group made in /etc/group counts from the next rescan") {
    nss.groups["gpunode-admin"] = 4242;
    write(group_file, "root:x:0:\ngpunode-admin:x:4242:\n");
    touch_later(group_file, 1);
    CHECK(peers.due(t0 + 60s));
    CHECK(nss.asked == 1);
    CHECK(peers.resolve_if_due(t0 + 60s));
    CHECK(peers.gid() == std::optional<gid_t>{4242});
    CHECK_FALSE(peers.resolve_if_due(t0 + 90s));
    CHECK(nss.asked == 2);
  }
  SUBCASE("/etc/group replaced by rename with the same times: another inode, asked again") {
    nss.groups["gpunode-admin"] = 4242;
    const auto fresh = dir / "group.new";
    write(fresh, "root:x:0:\n");
    std::filesystem::rename(fresh, group_file);
    CHECK(peers.resolve_if_due(t0 + 60s));
    CHECK(peers.gid() == std::optional<gid_t>{4242});
  }
  SUBCASE("a group from another source (LDAP, userdb) counts within kRecheck") {
    nss.groups["gpunode-admin"] = 4242;
    CHECK_FALSE(peers.due(t0 + AdminPeers::kRecheck - 1s));
    CHECK_FALSE(peers.resolve_if_due(t0 + AdminPeers::kRecheck - 1s));
    CHECK(peers.due(t0 + AdminPeers::kRecheck));
    CHECK(peers.resolve_if_due(t0 + AdminPeers::kRecheck));
    CHECK(peers.gid() == std::optional<gid_t>{4242});
  }
  SUBCASE("no /etc/group at all: asked at kRecheck, not at every rescan") {
    std::filesystem::remove(group_file);
    CHECK(peers.resolve_if_due(t0 + 30s));  // the file's identity changed (gone)
    CHECK_FALSE(peers.resolve_if_due(t0 + 60s));
    CHECK(nss.asked == 2);
  }
}

TEST_CASE("admin peers: an NSS outage keeps the gid known and is asked again at the next rescan") {
  FakeNss nss{.groups = {{"gpunode-admin", 4242}}};
  gpunode::test::TempDir dir;
  write(dir / "group", "gpunode-admin:x:4242:\n");
  AdminPeers peers{admin("gpunode-admin"), nss.fn(), (dir / "group").string()};
  REQUIRE(peers.resolve() == std::optional<gid_t>{4242});
  const auto t0 = std::chrono::steady_clock::now();  // after the lookup resolve() stamped

  nss.error = EIO;
  CHECK(peers.resolve_if_due(t0 + AdminPeers::kRecheck));
  CHECK(peers.gid() == std::optional<gid_t>{4242});  // not "no such group": open connections stay
  CHECK(peers.allowed(peer(2000, 4242)));
  CHECK(peers.due(t0 + AdminPeers::kRecheck + 30s));
  CHECK(peers.resolve_if_due(t0 + AdminPeers::kRecheck + 30s));  // failed: asked again at once
  nss.error = 0;
  nss.groups.erase("gpunode-admin");
  CHECK(peers.resolve_if_due(t0 + AdminPeers::kRecheck + 60s));
  CHECK_FALSE(peers.gid());  // the group is gone now, and NSS said so
  CHECK_FALSE(peers.allowed(peer(2000, 4242)));
}

TEST_CASE("admin peers: a reload that names another group forgets the old gid until it is resolved") {
  FakeNss nss{.groups = {{"gpunode-admin", 4242}, {"ops", 5000}}};
  gpunode::test::TempDir dir;
  AdminPeers peers{admin("gpunode-admin"), nss.fn(), (dir / "group").string()};
  REQUIRE(peers.resolve() == std::optional<gid_t>{4242});
  peers.configure(admin("ops"));
  CHECK_FALSE(peers.gid());
  CHECK_FALSE(peers.allowed(peer(2000, 4242)));
  CHECK(peers.resolve() == std::optional<gid_t>{5000});
  CHECK(peers.allowed(peer(2000, 100, {5000})));
  peers.configure(admin(""));  // no group: only allowed_uids
  CHECK(peers.resolve() == std::nullopt);
  CHECK_FALSE(peers.allowed(peer(2000, 5000)));
}
