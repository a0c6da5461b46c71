// check_host_root (CONTRACT §7 "The host root"): a root without sys/bus/pci is refused with a
// message naming that path; a PCI bus without a GPU is a host.
#include "gpunode/discovery/host_root.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gpunode/discovery/rules.hpp"
#include "sysfs_tree.hpp"

namespace fs = std::filesystem;
using gpunode::discovery::check_host_root;
using gpunode::error::Errc;
using gpunode::testing::Tree;

TEST_CASE("host root: a root that does not exist is refused, naming <root>/sys/bus/pci") {
  Tree t;
  const fs::path wrong = t.root() / "wrong";
  auto r = check_host_root(wrong);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail == (wrong / "sys/bus/pci").string() +
                                " does not exist: is discovery.host_root (or --host-root) the host's root?");
  CHECK(r.error().code == Errc::not_found);
}

TEST_CASE("host root: sys and proc without a PCI bus are refused") {
  Tree t;  // sys/kernel/iommu_groups and proc/cmdline stay
  fs::remove_all(t.root() / "sys/bus");
  auto r = check_host_root(t.root());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail.starts_with((t.root() / "sys/bus/pci").string() + " does not exist: "));
  CHECK(r.error().code == Errc::not_found);
}

TEST_CASE("host root: sys/bus/pci that is not a directory is refused") {
  Tree t;
  fs::remove_all(t.root() / "sys/bus/pci");
  t.write("sys/bus/pci", "not a bus\n");
  auto r = check_host_root(t.root());
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().detail.starts_with((t.root() / "sys/bus/pci").string() + " is not a directory: "));
  CHECK(r.error().detail.find("discovery.host_root") != std::string::npos);
  CHECK(r.error().code == Errc::invalid);
}

TEST_CASE("host root: a PCI bus without any GPU is a host, with no units") {
  Tree t;
  REQUIRE(check_host_root(t.root()).has_value());                    // an empty bus
  t.add("0000:61:00.0", "15b3", "101d", "020000", "mlx5_core", 52);  // one NIC, no GPU
  REQUIRE(check_host_root(t.root()).has_value());
  CHECK(gpunode::discovery::build_units(t.read(), {}).empty());
}

TEST_CASE("host root: the real root passes where this machine has a PCI bus") {
  if (!fs::is_directory("/sys/bus/pci")) return;  // a container without sysfs: nothing to compare
  CHECK(check_host_root("/").has_value());
}
