// The admin socket over real Unix sockets (server_fixture.hpp): the peer's credentials and groups,
// the socket's mode, group and directory, stale and foreign files, a refused group, the filter.
#include <sys/syscall.h>

#include "server_fixture.hpp"

using namespace server_test;

TEST_CASE("admin socket: round trip with the peer's credentials; stale and foreign files") {
  Fixture f;
  auto path = f.dir.file("admin.sock");
  // A stale socket left behind by a dead process is replaced.
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
    REQUIRE(::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0);
    ::close(fd);
  }
  std::atomic<int> filtered{0};
  auto lr = f.server->listen_unix(path, 0660, std::nullopt, [&](const Peer& p) {
    ++filtered;
    return p.uid == ::getuid();
  });
  REQUIRE_MESSAGE(lr.has_value(), (lr ? "" : lr.error().detail));  // mode and group: the next test

  auto u = Client::plain_unix(path);
  REQUIRE(u->ok);
  for (int i = 0; i < 3; ++i) {
    auto r = u->roundtrip(request("POST", "/echo", "x", {"X-Request-Id: local-1"}));
    REQUIRE(r);
    CHECK(r->status == 200);
    CHECK(r->header("x-request-id") == "local-1");
    auto o = json::parse(r->body).as_object();
    CHECK(o["peerKind"].as_string() == "unix");
    CHECK(o["peerAddress"].as_string() == path);
    CHECK(o["uid"].to_number<uid_t>() == ::getuid());
    CHECK(o["pid"].to_number<pid_t>() == ::getpid());
  }
  CHECK(filtered == 1);

  // A live socket is not stolen; a file that is not a socket is not removed.
  Server other{f.io, test_limits(), [](Request, Reply reply) { reply(Response{}); }, {}};
  auto r2 = other.listen_unix(path, 0660, std::nullopt, {});
  REQUIRE_FALSE(r2.has_value());
  CHECK(r2.error().detail.find(path) != std::string::npos);
  CHECK(r2.error().code == gpunode::error::Errc::busy);
  auto regular = f.dir.file("regular");
  std::ofstream(regular) << "keep me\n";
  r2 = other.listen_unix(regular, 0660, std::nullopt, {});
  REQUIRE_FALSE(r2.has_value());
  CHECK(r2.error().detail.find(regular) != std::string::npos);
  CHECK(r2.error().detail.find("not a socket") != std::string::npos);
  CHECK(r2.error().code == gpunode::error::Errc::exists);
  CHECK(fs::exists(regular));
  auto nodir = f.dir.file("no/such/dir.sock");  // only the socket's own directory is made
  r2 = other.listen_unix(nodir, 0660, std::nullopt, {});
  REQUIRE_FALSE(r2.has_value());
  CHECK(r2.error().detail.find(nodir) != std::string::npos);
  CHECK(r2.error().code == gpunode::error::Errc::not_found);
}

namespace {

// A group for the admin socket tests that differs from the process's own where possible, so that
// a socket left with its creator's group is told apart: a supplementary group, or as root any gid.
gid_t admin_test_group() {
  std::vector<gid_t> groups(static_cast<std::size_t>(std::max(::getgroups(0, nullptr), 0)));
  groups.resize(
      static_cast<std::size_t>(std::max(::getgroups(static_cast<int>(groups.size()), groups.data()), 0)));
  for (gid_t g : groups) {
    if (g != ::getegid()) return g;
  }
  if (::geteuid() == 0) return 4242;
  MESSAGE("no group other than the primary one: the socket's group cannot be told from its creator's");
  return ::getegid();
}

std::set<gid_t> own_groups() {
  std::vector<gid_t> groups(static_cast<std::size_t>(std::max(::getgroups(0, nullptr), 0)));
  int n = ::getgroups(static_cast<int>(groups.size()), groups.data());
  REQUIRE(n >= 0);
  groups.resize(static_cast<std::size_t>(n));
  return {groups.begin(), groups.end()};
}

}  // namespace

TEST_CASE("admin socket: mode 0660 and the admin group, its directory made 0750, whatever the umask") {
  Fixture f;
  const gid_t group = admin_test_group();
  const auto dir = f.dir.path / "run";  // missing: listen_unix makes it
  const auto path = (dir / "admin.sock").string();
  auto old_mask = ::umask(077);
  auto lr = f.server->listen_unix(path, 0660, group, {});
  ::umask(old_mask);
  REQUIRE_MESSAGE(lr.has_value(), (lr ? "" : lr.error().detail));
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 07777) == 0660);
  CHECK(st.st_uid == ::geteuid());
  CHECK(st.st_gid == group);
  REQUIRE(::stat(dir.c_str(), &st) == 0);
  CHECK(S_ISDIR(st.st_mode));
  CHECK((st.st_mode & 07777) == 0750);
  CHECK(st.st_uid == ::geteuid());
  CHECK(st.st_gid == group);
  auto u = Client::plain_unix(path);
  REQUIRE(u->ok);
  auto r = u->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  CHECK(r->status == 200);

  // A directory that exists is left as it is; without a group the socket keeps its creator's.
  Server other{f.io, test_limits(), [](Request, Reply reply) { reply(Response{}); }, {}};
  fs::create_directory(f.dir.path / "mine");
  fs::permissions(f.dir.path / "mine", fs::perms(0711));
  const auto path2 = (f.dir.path / "mine" / "admin.sock").string();
  lr = other.listen_unix(path2, 0660, std::nullopt, {});
  REQUIRE_MESSAGE(lr.has_value(), (lr ? "" : lr.error().detail));
  REQUIRE(::stat((f.dir.path / "mine").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0711);
  REQUIRE(::stat(path2.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0660);
  CHECK(st.st_gid == ::getegid());
  other.stop_accepting();
}

// As root, this thread alone becomes nobody for the call (the kernel keeps credentials per thread;
// the raw system calls do not spread them to the process's other threads as glibc's do), keeping
// root as its saved uid to come back: root may give a file to any group, and the refusal would
// never be tried.
struct ThreadAsNobody {
  bool was_root = ::geteuid() == 0;
  ThreadAsNobody() {
    if (!was_root) return;
    REQUIRE(::syscall(SYS_setresgid, -1, 65534, -1) == 0);
    REQUIRE(::syscall(SYS_setresuid, -1, 65534, -1) == 0);
  }
  ~ThreadAsNobody() {
    if (!was_root) return;
    CHECK(::syscall(SYS_setresuid, -1, 0, -1) == 0);
    CHECK(::syscall(SYS_setresgid, -1, 0, -1) == 0);
  }
  ThreadAsNobody(const ThreadAsNobody&) = delete;
  ThreadAsNobody& operator=(const ThreadAsNobody&) = delete;
};

TEST_CASE("admin socket: a group the process may not give the socket to is an error naming both") {
  Fixture f;
  if (::geteuid() == 0) REQUIRE(::chown(f.dir.path.c_str(), 65534, 65534) == 0);  // nobody's to bind in
  std::optional<gpunode::error::Result<void>> refused;
  const auto path = f.dir.file("admin.sock");
  gid_t foreign = 4242;
  {
    ThreadAsNobody nobody;
    while (own_groups().contains(foreign) || foreign == ::getegid()) ++foreign;
    refused = f.server->listen_unix(path, 0660, foreign, {});
  }
  REQUIRE(refused);
  auto& lr = *refused;
  REQUIRE_FALSE(lr.has_value());
  CHECK(lr.error().detail.find(path) != std::string::npos);
  CHECK(lr.error().detail.find("group " + std::to_string(foreign)) != std::string::npos);
  CHECK(lr.error().code == gpunode::error::Errc::permission);
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("admin socket: the peer's primary group and supplementary groups, read from the socket") {
  Fixture f;
  std::mutex mu;
  std::optional<Peer> seen;
  const auto path = f.dir.file("admin.sock");
  auto lr = f.server->listen_unix(path, 0660, std::nullopt, [&](const Peer& p) {
    std::lock_guard lock(mu);
    seen = p;
    return true;
  });
  REQUIRE_MESSAGE(lr.has_value(), (lr ? "" : lr.error().detail));

  // As root, first take 100 distinctive groups (more than the server's first buffer holds, so the
  // ERANGE retry is taken): the kernel keeps the credentials of the moment of connect.
  std::vector<gid_t> saved;
  const bool root = ::geteuid() == 0;
  if (root) {
    auto before = own_groups();
    saved.assign(before.begin(), before.end());
    std::vector<gid_t> many;
    for (gid_t g = 5000; g < 5100; ++g) many.push_back(g);
    REQUIRE(::setgroups(many.size(), many.data()) == 0);
  }
  const std::set<gid_t> expected = own_groups();
  auto u = Client::plain_unix(path);
  if (root) REQUIRE(::setgroups(saved.size(), saved.data()) == 0);
  REQUIRE(u->ok);
  if (root) CHECK(expected.size() == 100);

  auto r = u->roundtrip(request("GET", "/echo"));
  REQUIRE(r);
  REQUIRE(r->status == 200);
  auto o = json::parse(r->body).as_object();
  CHECK(o["gid"].to_number<gid_t>() == ::getegid());
  std::set<gid_t> got;
  for (const auto& g : o["groups"].as_array()) got.insert(g.to_number<gid_t>());
  CHECK(got == expected);
  CHECK(o["groups"].as_array().size() == expected.size());
  std::lock_guard lock(mu);
  REQUIRE(seen);
  CHECK(seen->gid == ::getegid());
  CHECK(std::set<gid_t>(seen->groups.begin(), seen->groups.end()) == expected);
}

TEST_CASE("admin socket: a peer the filter refuses is closed without an answer, and logged") {
  Fixture f;
  auto path = f.listen_unix([](const Peer&) { return false; });
  auto u = Client::plain_unix(path);
  REQUIRE(u->ok);
  u->send(request("GET", "/echo"));
  CHECK(u->closed_without_data());
  CHECK(eventually([&] { return f.logged("refused peer uid=" + std::to_string(::getuid())); }));
  CHECK(f.server->open_connections() == 0);
}
