// Internal: reading PCI functions from a host's sysfs tree: attribute files and links, and
// identity through libpci. sysfs_reader.cpp decides which functions matter and assembles them
// with their IOMMU groups into a HostSnapshot; everything it reads goes through here.
#pragma once

#include <dirent.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/discovery/model.hpp"
#include "gpunode/discovery/pci_ids.hpp"

struct pci_access;  // libpci's, from <pci/pci.h>
struct pci_dev;

namespace gpunode::discovery::sysfs {

// ---- small sysfs reads ----------------------------------------------------------------------
struct FileText {
  std::string text;  // without trailing whitespace
  int error = 0;     // errno, 0 on success
};

// `path` is relative to the directory `dir_fd` (AT_FDCWD: to the working directory, or absolute).
// A value of 256 bytes or more is an error (EFBIG).
FileText read_small_at(int dir_fd, const std::string& path);
FileText read_small(const std::string& path);

// Text taken from sysfs (a value, a link's target, an entry's name, libpci's message about one) as
// it may appear in reasons, warnings and the units' JSON: well-formed UTF-8 is kept; every other
// byte, and every control character, becomes `\xNN`.
std::string sysfs_text(std::string_view raw);

// Why a read failed, for a Fault or a warning.
std::string describe(const FileText& f);

// A decimal or 0x-prefixed hexadecimal integer, the whole text.
std::optional<long long> parse_integer(std::string_view text);

bool exists_nofollow(const std::string& path);

// The last component of a symlink's target ("../../bus/pci/drivers/vfio-pci" -> "vfio-pci").
struct LinkName {
  std::optional<std::string> name;  // nullopt with error 0: no such link
  int error = 0;
};
LinkName read_link_name(const std::string& path);

// Entry names of a directory (not those starting with '.'); nullopt (with errno) if it cannot be
// opened.
std::optional<std::vector<std::string>> list_dir(const std::string& path, int* error = nullptr);
// The same of a directory already open, read from where it stands (rewinddir first to read it all
// again); nullopt (with errno) when a read fails.
std::optional<std::vector<std::string>> read_entries(DIR* dir);

struct DirFd {
  int fd;
  ~DirFd();
};

// Records what could not be read of `d` (one fault per attribute: the latest). Faults become
// warnings once the device is known to matter.
void add_fault(DeviceRecord& d, std::string attribute, std::string message);

// ---- libpci ---------------------------------------------------------------------------------

// libpci's warnings go to `warnings` while this lives (one scan), and nowhere otherwise.
class PciWarnings {
 public:
  explicit PciWarnings(std::vector<std::string>& warnings);
  ~PciWarnings();
  PciWarnings(const PciWarnings&) = delete;
  PciWarnings& operator=(const PciWarnings&) = delete;
};

// libpci's access handle on `bus_dir` (<host_root>/sys/bus/pci): started on first use, then kept
// for every scan. libpci never ends the process: its errors become messages.
class PciLibrary {
 public:
  explicit PciLibrary(std::string bus_dir) : bus_dir_(std::move(bus_dir)) {}
  ~PciLibrary();
  PciLibrary(const PciLibrary&) = delete;
  PciLibrary& operator=(const PciLibrary&) = delete;

  // Starts libpci unless started; false (with a warning) if it cannot start.
  bool start(std::vector<std::string>& warnings);
  [[nodiscard]] pci_access* handle() const { return pacc_; }

 private:
  std::string bus_dir_;
  pci_access* pacc_ = nullptr;
};

struct PciDevFree {
  void operator()(pci_dev* d) const;
};

// One scan's reads of PCI functions under `devices_dir`: the first look every function gets, and
// the deeper look of those that matter. What cannot be read becomes Faults on the record (and
// `warnings`, for a link that names no device). The libpci device handles it opens are freed
// with it.
class DeviceReader {
 public:
  // `pacc` started; `names` may be null.
  DeviceReader(pci_access* pacc, std::string devices_dir, const Policy& policy, const PciIds* names,
               std::vector<std::string>& warnings);
  ~DeviceReader();
  DeviceReader(const DeviceReader&) = delete;
  DeviceReader& operator=(const DeviceReader&) = delete;

  // The function at `address` as far as deciding whether it can be a GPU takes: one read of its
  // `vendor` file, the cheapest filter there is; a GPU vendor's function is then identified
  // through libpci and its class read.
  DeviceRecord first_look(const PciAddress& address);
  // Everything the rules need of a member of a unit (or a GPU candidate): identity through libpci
  // unless the first look took it, class, driver, NUMA node, boot_vga, and for a GPU SR-IOV,
  // mediated devices and device links.
  void look_closer(DeviceRecord& d);

 private:
  [[nodiscard]] std::string dev_path(const PciAddress& a) const { return devices_dir_ + "/" + a.to_string(); }
  [[nodiscard]] bool is_gpu_vendor(const DeviceRecord& d) const;
  pci_dev* open_handle(DeviceRecord& d);
  void identify(DeviceRecord& d);
  void read_class(DeviceRecord& d) const;
  void read_deep(DeviceRecord& d, pci_dev* pd) const;

  pci_access* pacc_;
  std::string devices_dir_;
  const Policy& policy_;
  const PciIds* names_;
  std::vector<std::string>& warnings_;
  DirFd devices_;  // devices_dir_ itself (O_PATH), for the first look's relative reads
  std::map<PciAddress, std::unique_ptr<pci_dev, PciDevFree>> handles_;
};

}  // namespace gpunode::discovery::sysfs
