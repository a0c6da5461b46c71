// The RSS floor of the agent's mandated libraries (design card: libvirt, OpenSSL, SQLite, and
// libstdc++ under all of them): the memory a process holds at idle when it only links them
// (`linked`), and when it also initialises them as the agent must (`initialised`: a TLS server
// context, an SQLite database with a row, libvirt with its event loop and a connection attempt to
// qemu:///system). Printed as JSON for tests/bench/api_bench.py, which sets it beside the agent.
#include <libvirt/libvirt.h>
#include <libvirt/virterror.h>
#include <openssl/ssl.h>
#include <sqlite3.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace {

void quiet(void*, virErrorPtr) {}

long field(const char* file, const char* key) {
  FILE* f = std::fopen(file, "r");
  if (f == nullptr) return -1;
  char line[256];
  long value = -1;
  const std::size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, key, n) == 0 && line[n] == ':') {
      value = std::strtol(line + n + 1, nullptr, 10);
      break;
    }
  }
  std::fclose(f);
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "initialised";
  if (mode != "linked" && mode != "initialised") {
    std::fprintf(stderr, "usage: rss_floor [linked|initialised]\n");
    return 2;
  }
  if (mode == "initialised") {
    SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
    sqlite3* db = nullptr;
    sqlite3_open(":memory:", &db);
    sqlite3_exec(db, "CREATE TABLE t (x TEXT); INSERT INTO t VALUES ('x');", nullptr, nullptr, nullptr);
    virInitialize();
    virSetErrorFunc(nullptr, quiet);
    virEventRegisterDefaultImpl();
    virConnectPtr conn =
        virConnectOpen("qemu:///system");  // fails without a libvirtd: the attempt is the cost
    if (conn != nullptr) virConnectClose(conn);
    (void)ctx;
  }
  std::printf("{\"mode\": \"%s\", \"VmRSS\": %ld, \"RssAnon\": %ld, \"RssFile\": %ld, \"Pss\": %ld}\n",
              mode.c_str(), field("/proc/self/status", "VmRSS"), field("/proc/self/status", "RssAnon"),
              field("/proc/self/status", "RssFile"), field("/proc/self/smaps_rollup", "Pss"));
  // Referenced so that `linked` keeps every library mapped, as the agent does.
  if (argc > 5)
    return static_cast<int>(reinterpret_cast<std::uintptr_t>(&virConnectOpen) ^
                            reinterpret_cast<std::uintptr_t>(&SSL_CTX_new) ^
                            reinterpret_cast<std::uintptr_t>(&sqlite3_open));
  return 0;
}
