// libvirt's errors as the agent's one error: the mapping of libvirt's codes (from_libvirt), and
// real libvirt errors through the adapter: a libvirtd that hangs up, and a call whose connection libvirt
// calls invalid.
//
// For the last, this binary defines virConnectListAllDomains itself (as libvirt_threads_test.cpp
// does two other calls): every call goes on to libvirt's own (dlsym RTLD_NEXT), except one asked
// for by `lose_next_listing`, which libvirt's own gets with no connection: a real libvirt error of
// a connection that is gone (VIR_ERR_INVALID_CONN), on a connection the adapter finds alive.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gpunode/vmctl/vmctl.hpp"

using namespace gpunode::vmctl;
using gpunode::error::Errc;
using gpunode::error::Native;

namespace {

std::atomic<bool> lose_next_listing{false};

}  // namespace

// Exported (the build hides symbols by default): the loader must see it to bind libvirt's calls here.
extern "C" __attribute__((visibility("default"))) int virConnectListAllDomains(virConnectPtr conn,
                                                                               virDomainPtr** domains,
                                                                               unsigned int flags) {
  static const auto call = reinterpret_cast<int (*)(virConnectPtr, virDomainPtr**, unsigned int)>(
      dlsym(RTLD_NEXT, "virConnectListAllDomains"));
  return call(lose_next_listing.exchange(false) ? nullptr : conn, domains, flags);
}

TEST_CASE("from_libvirt: libvirt's codes, mapped once") {
  struct Case {
    int code;
    Errc want;
  };
  const std::vector<Case> cases{
      // The connection is gone or unusable.
      {VIR_ERR_NO_CONNECT, Errc::unavailable},
      {VIR_ERR_INVALID_CONN, Errc::unavailable},
      {VIR_ERR_SYSTEM_ERROR, Errc::unavailable},
      {VIR_ERR_RPC, Errc::unavailable},
      {VIR_ERR_OPERATION_TIMEOUT, Errc::unavailable},
      {VIR_ERR_AUTH_FAILED, Errc::unavailable},
      {VIR_ERR_AUTH_CANCELLED, Errc::unavailable},
      {VIR_ERR_AUTH_UNAVAILABLE, Errc::unavailable},
      // No such thing.
      {VIR_ERR_NO_DOMAIN, Errc::not_found},
      {VIR_ERR_NO_DOMAIN_SNAPSHOT, Errc::not_found},
      {VIR_ERR_NO_DOMAIN_CHECKPOINT, Errc::not_found},
      {VIR_ERR_NO_DOMAIN_METADATA, Errc::not_found},
      {VIR_ERR_NO_NETWORK, Errc::not_found},
      {VIR_ERR_NO_STORAGE_POOL, Errc::not_found},
      {VIR_ERR_NO_STORAGE_VOL, Errc::not_found},
      {VIR_ERR_NO_NODE_DEVICE, Errc::not_found},
      {VIR_ERR_NO_SECRET, Errc::not_found},
      // The rest.
      {VIR_ERR_OPERATION_INVALID, Errc::invalid},
      {VIR_ERR_INVALID_ARG, Errc::invalid},
      {VIR_ERR_XML_ERROR, Errc::invalid},
      {VIR_ERR_XML_DETAIL, Errc::invalid},
      {VIR_ERR_OPERATION_DENIED, Errc::permission},
      {VIR_ERR_ACCESS_DENIED, Errc::permission},
      {VIR_ERR_DOM_EXIST, Errc::exists},
      {VIR_ERR_RESOURCE_BUSY, Errc::busy},
      {VIR_ERR_AGENT_UNRESPONSIVE, Errc::timeout},
      {VIR_ERR_NO_SUPPORT, Errc::protocol},
      {VIR_ERR_OPERATION_UNSUPPORTED, Errc::protocol},
      {VIR_ERR_ARGUMENT_UNSUPPORTED, Errc::protocol},
      {VIR_ERR_OK, Errc::internal},
      {VIR_ERR_INTERNAL_ERROR, Errc::internal},
      {VIR_ERR_NO_MEMORY, Errc::internal},
      {VIR_ERR_INVALID_DOMAIN, Errc::internal},
      {VIR_ERR_OPERATION_FAILED, Errc::io},
      {VIR_ERR_HOOK_SCRIPT_FAILED, Errc::io},
      {VIR_ERR_MIGRATE_UNSAFE, Errc::io},
      {VIR_ERR_NO_DOMAIN_BACKUP + 1000, Errc::io},  // a code this table has never heard of
  };
  for (const auto& c : cases) {
    CAPTURE(c.code);
    CHECK(libvirt_code(c.code) == c.want);
    const auto e = from_libvirt(c.code, "libvirt's words");
    CHECK(e.code == c.want);
    CHECK(e.detail == "libvirt's words");  // whole, nothing added
    CHECK(e.native == c.code);
    CHECK(e.origin == (c.code == VIR_ERR_OK ? Native::none : Native::libvirt));
    CHECK(e.code_name().empty());  // no name table for libvirt's codes
    CHECK(e.primary_code() == 0);
    CHECK(e.to_string() == std::string(e.kind()) + ": libvirt's words");
  }
  CHECK(from_libvirt(VIR_ERR_NO_DOMAIN, "x").kind() == "not found");
  CHECK(from_libvirt(VIR_ERR_RPC, "x").kind() == "unavailable");
  CHECK(from_libvirt(VIR_ERR_OPERATION_INVALID, "x").to_string() == "invalid: x");
}

TEST_CASE("libvirt: a libvirtd that hangs up is unavailable, with libvirt's code") {
  // A socket that takes each connection and closes it at once: the remote driver's first call
  // finds the connection gone. (libvirt writes to it unguarded: SIGPIPE is ignored meanwhile.)
  char pattern[] = "/tmp/gpunode-vmctl-XXXXXX";
  REQUIRE(mkdtemp(pattern) != nullptr);
  const std::filesystem::path dir{pattern};
  const std::string path = (dir / "libvirt-sock").string();
  const int server = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(server >= 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  REQUIRE(path.size() < sizeof address.sun_path);
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  REQUIRE(::bind(server, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  REQUIRE(::listen(server, 8) == 0);
  std::thread hang_up([server] {
    for (int client; (client = ::accept(server, nullptr, nullptr)) >= 0;) ::close(client);
  });
  const auto old_pipe = std::signal(SIGPIPE, SIG_IGN);

  auto hv = make_libvirt("test+unix:///default?socket=" + path);
  auto r = hv->list();
  auto s = hv->state("a0000000-0000-4000-8000-000000000001");

  std::signal(SIGPIPE, old_pipe);
  ::shutdown(server, SHUT_RDWR);  // ends accept()
  hang_up.join();
  ::close(server);
  std::filesystem::remove_all(dir);

  REQUIRE_FALSE(r.has_value());
  CAPTURE(r.error().detail);
  CAPTURE(r.error().native);
  CHECK(r.error().code == Errc::unavailable);
  CHECK(r.error().origin == Native::libvirt);
  // "Cannot recv data: Connection reset by peer", "Cannot write data: Broken pipe" or "End of file
  // while reading data": libvirt says which, as a system error.
  CHECK((r.error().native == VIR_ERR_SYSTEM_ERROR || r.error().native == VIR_ERR_RPC));
  CHECK(r.error().detail.starts_with("test+unix:///default?socket=" + path + ": "));
  CHECK_FALSE(hv->connected());
  REQUIRE_FALSE(s.has_value());
  CHECK(s.error().code == Errc::unavailable);
  CHECK(s.error().origin == Native::libvirt);
}

TEST_CASE("libvirt: a call whose connection libvirt says is gone is unavailable; the next reconnects") {
  auto hv = make_libvirt("test:///default");
  REQUIRE(hv->list().has_value());
  REQUIRE(hv->connected());

  lose_next_listing = true;
  auto lost = hv->list();
  REQUIRE_FALSE(lost.has_value());
  CAPTURE(lost.error().detail);
  CHECK(lost.error().code == Errc::unavailable);
  CHECK(lost.error().native == VIR_ERR_INVALID_CONN);  // libvirt's code, kept
  CHECK(lost.error().origin == Native::libvirt);
  CHECK(lost.error().detail.find("invalid connection pointer") != std::string::npos);  // libvirt's words
  CHECK_FALSE(hv->connected());  // dropped: the next call opens a fresh one

  auto again = hv->list();
  REQUIRE(again.has_value());
  CHECK_FALSE(again->empty());
  CHECK(hv->connected());
}
