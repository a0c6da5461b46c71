// gpunode/discovery/sysfs_reader.hpp: reads a host's PCI devices and IOMMU groups.
//
// The adapter between the kernel and the pure rules: libpci (linux-sysfs method, pointed at
// <host_root>/sys/bus/pci) for device identity, sysfs attributes and links for the rest,
// /sys/kernel/iommu_groups/N/devices for group membership and /proc/cmdline for the ACS override.
// It never reads PCI config space for identity, and no input ends the process: one bad device
// becomes Faults on its record and warnings in the snapshot.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "gpunode/discovery/model.hpp"
#include "gpunode/discovery/pci_ids.hpp"

namespace gpunode::discovery {

// The class code of one PCI function (<host_root>/sys/bus/pci/devices/ADDRESS/class), read on
// demand; nullopt when the host has no such function or the file cannot be read. `address` is
// "dddd:bb:ss.f".
std::optional<std::uint32_t> pci_class_of(const std::filesystem::path& host_root, const std::string& address);

class SysfsReader {
 public:
  // `names` may be null (then devices carry no names); it must outlive the reader.
  SysfsReader(std::filesystem::path host_root, Policy policy, const PciIds* names);
  ~SysfsReader();
  SysfsReader(const SysfsReader&) = delete;
  SysfsReader& operator=(const SysfsReader&) = delete;

  // One scan of the host. Never throws for anything the host tree holds.
  HostSnapshot read();
  // What changes when a PCI function comes or goes or is bound to another driver, or its IOMMU
  // group changes: each function's address with its `driver` and `iommu_group` links, two
  // readlink calls a function instead of the dozen reads of read(). The daemon's periodic rescan
  // (the backstop to the kernel's uevents) reads the host again only when it differs from the one
  // taken before the last read(). nullopt: the devices directory cannot be listed. It holds the
  // directories it reads between calls (sysfs_reader.cpp, HeldDirs): one thread at a time.
  [[nodiscard]] std::optional<std::string> fingerprint();
  // Every this many fingerprints are taken through freshly opened directories (10 minutes at the
  // default rescan_interval).
  static constexpr unsigned kFingerprintFreshEvery = 20;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpunode::discovery
