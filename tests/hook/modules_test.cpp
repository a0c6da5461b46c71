// Loading gpunode-agent's modules (modules.hpp), as the main and gpunodectl do: a module
// that cannot be loaded is unavailable, one without the entry not_found, each naming what and why.
#include "modules.hpp"

#include <dlfcn.h>
#include <doctest/doctest.h>

#include <string>

using gpunode::error::Errc;

TEST_CASE("load_entry: a module that cannot be loaded, and one without the entry, told apart by code") {
  const auto missing =
      gpunode::agent::load_entry("/nonexistent/gpunode-agent-tools.so", "gpunode_agent_tools_main");
  REQUIRE_FALSE(missing);
  CHECK(missing.error().code == Errc::unavailable);
  CHECK(missing.error().detail.starts_with("cannot load /nonexistent/gpunode-agent-tools.so: "));

  // The C library is loaded in every process: dlopen finds it, dlsym does not find the entry.
  const auto no_entry = gpunode::agent::load_entry("libc.so.6", "gpunode_no_such_entry_v1");
  REQUIRE_FALSE(no_entry);
  CHECK(no_entry.error().code == Errc::not_found);
  CHECK(no_entry.error().detail == "libc.so.6 has no gpunode_no_such_entry_v1");

  const auto found = gpunode::agent::load_entry("libc.so.6", "malloc");
  REQUIRE(found);
  CHECK(*found != nullptr);
}

TEST_CASE("open_entry: the module's handle comes with its entry, and closing it unloads the module") {
  // A library no test links (glibc's compatibility stub for getaddrinfo_a, now in libc itself).
  constexpr const char* kLib = "libanl.so.1";
  REQUIRE(::dlopen(kLib, RTLD_NOW | RTLD_NOLOAD) == nullptr);
  const auto opened = gpunode::agent::open_entry(kLib, "getaddrinfo_a");
  REQUIRE(opened);
  CHECK(opened->entry != nullptr);
  REQUIRE(opened->module != nullptr);
  CHECK(::dlclose(opened->module) == 0);
  CHECK(::dlopen(kLib, RTLD_NOW | RTLD_NOLOAD) == nullptr);  // gone from the process

  // Without the entry, the module is not left loaded either.
  const auto no_entry = gpunode::agent::open_entry(kLib, "gpunode_no_such_entry_v1");
  REQUIRE_FALSE(no_entry);
  CHECK(no_entry.error().code == Errc::not_found);
  CHECK(::dlopen(kLib, RTLD_NOW | RTLD_NOLOAD) == nullptr);
}
