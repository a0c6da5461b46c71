// tests/support/sysfs_tree.hpp: a minimal kernel-shaped sysfs tree written by a test, for
// in-process tests of the reader and the service. (Whole hosts modelled on real machines are
// tests/fixtures/hosts/*.py.)
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "gpunode/discovery/sysfs_reader.hpp"

namespace gpunode::testing {

namespace fs = std::filesystem;
using discovery::HostSnapshot;
using discovery::Policy;
using discovery::SysfsReader;

// A minimal kernel-shaped tree: sys/devices/pci0000:00/ADDR, bus/pci/devices links, drivers,
// iommu groups, proc/cmdline.
class Tree {
 public:
  Tree() {
    char tmpl[] = "/tmp/gpunode-reader-XXXXXX";
    root_ = ::mkdtemp(tmpl);
    fs::create_directories(root_ / "sys/bus/pci/devices");
    fs::create_directories(root_ / "sys/kernel/iommu_groups");
    write("proc/cmdline", "BOOT_IMAGE=/vmlinuz ro intel_iommu=on\n");
  }
  ~Tree() { fs::remove_all(root_); }
  Tree(const Tree&) = delete;
  Tree& operator=(const Tree&) = delete;

  fs::path root() const { return root_; }
  fs::path dev(const std::string& a) const {
    const auto p = parents_.find(a);
    return p == parents_.end() ? root_ / "sys/devices/pci0000:00" / a : dev(p->second) / a;
  }
  // Functions added after this nest under `parent` (its bridge), as the kernel lays them out.
  void nest(const std::string& a, const std::string& parent) { parents_[a] = parent; }

  void write(const fs::path& rel, const std::string& text) {
    fs::path p = rel.is_absolute() ? rel : root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
  }

  void add(const std::string& a, const char* vendor, const char* device, const char* cls,
           const std::string& driver, int group) {
    fs::path d = dev(a);
    write(d / "vendor", fmt::format("0x{}\n", vendor));
    write(d / "device", fmt::format("0x{}\n", device));
    write(d / "class", fmt::format("0x{}\n", cls));
    write(d / "numa_node", "0\n");
    std::string config(64, '\0');
    config[0x0e] = std::string_view(cls).starts_with("0604") ? '\x01' : '\x00';
    write(d / "config", config);
    fs::create_directory_symlink(fs::relative(d, root_ / "sys/bus/pci/devices"),
                                 root_ / "sys/bus/pci/devices" / a);
    if (!driver.empty()) {
      fs::path drv = root_ / "sys/bus/pci/drivers" / driver;
      fs::create_directories(drv);
      fs::create_directory_symlink(fs::relative(drv, d), d / "driver");
    }
    if (group >= 0) {
      fs::path g = root_ / "sys/kernel/iommu_groups" / std::to_string(group);
      fs::create_directories(g / "devices");
      fs::create_directory_symlink(fs::relative(d, g / "devices"), g / "devices" / a);
      fs::create_directory_symlink(fs::relative(g, d), d / "iommu_group");
    }
  }

  HostSnapshot read(Policy policy = {}) { return SysfsReader(root_, std::move(policy), nullptr).read(); }

 private:
  fs::path root_;
  std::map<std::string, std::string> parents_;  // address -> its parent bridge's
};

}  // namespace gpunode::testing
