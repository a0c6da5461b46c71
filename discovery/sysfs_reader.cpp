// The sysfs + libpci adapter. See sysfs_reader.hpp for the contract. This file assembles a
// snapshot: the kernel command line, the IOMMU groups, which functions matter; reading each
// function (its files, links and libpci identity) is sysfs_device.cpp's.
//
// Cost model: a host may hold thousands of PCI functions of which a few dozen matter. Every
// function costs a readdir entry and one read of its `vendor` file; functions of a GPU vendor are
// identified through libpci and get their `class` read; only GPU candidates and the members of
// their IOMMU groups get the deeper look (libpci identity, driver, NUMA node, boot_vga, SR-IOV,
// links). On the 1,088-function bench host that is one file read per function plus ~20 per GPU.
#include "gpunode/discovery/sysfs_reader.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "gpunode/discovery/rules.hpp"
#include "sysfs_device.hpp"

namespace gpunode::discovery {
namespace {

using sysfs::describe;
using sysfs::DeviceReader;
using sysfs::exists_nofollow;
using sysfs::FileText;
using sysfs::LinkName;
using sysfs::list_dir;
using sysfs::parse_integer;
using sysfs::read_entries;
using sysfs::read_link_name;
using sysfs::read_small;
using sysfs::sysfs_text;

bool cmdline_has_acs_override(std::string_view cmdline) {
  std::size_t pos = 0;
  while (pos < cmdline.size()) {
    std::size_t end = cmdline.find_first_of(" \t\n", pos);
    if (end == std::string_view::npos) end = cmdline.size();
    std::string_view word = cmdline.substr(pos, end - pos);
    if (word == "pcie_acs_override" || word.starts_with("pcie_acs_override=")) return true;
    pos = end + 1;
  }
  return false;
}

// The whole of a file too long for one small read ("" when it cannot be opened). Not
// config::read_file, the agent's whole-file read, on purpose: that one is for files the operator
// gives the agent (a size limit, a refusal of anything but a regular file, errno kept for the
// message) and is gpunode::config's, which discovery does not link; this reads a kernel file under
// the host root (/proc/cmdline) and takes any failure as "nothing there", as discovery's sysfs
// reads do.
std::string read_whole(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  std::string all;
  if (f) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) all.append(buf, n);
    std::fclose(f);
  }
  return all;
}

std::optional<int> group_number(std::string_view text) {
  auto g = parse_integer(text);
  if (!g || *g < 0 || *g > INT32_MAX) return std::nullopt;
  return static_cast<int>(*g);
}

// The target of the link `path` under `dir_fd`, "-" when there is none, "?" when it cannot be read.
void append_link_at(int dir_fd, const std::string& path, std::string& out) {
  char buf[4096];
  const ssize_t n = ::readlinkat(dir_fd, path.c_str(), buf, sizeof buf);
  if (n >= 0)
    out.append(buf, static_cast<std::size_t>(n));
  else
    out += errno == ENOENT ? "-" : "?";
}

// fingerprint()'s descriptors, kept from one call to the next (an idle agent takes a fingerprint
// every rescan_interval, and what one costs is its system calls and path walks): the devices
// directory, read again from its start, and each listed function's own directory (O_PATH, at most
// kMaxHeldDirs; past that a link is read through the bus's symlink), so that a readlink walks one
// component instead of the symlink's several. A directory held for a function removed since reads
// as unbound and groupless, so a fingerprint that differs from the last one is taken again through
// fresh descriptors, and every SysfsReader::kFingerprintFreshEvery-th is anyway (a function
// removed and added back at the same address, unbound and groupless before, would otherwise read
// as before until then). The agent's own files have a budget (kOwnFiles in daemon/startup.cpp)
// that counts these.
class HeldDirs {
 public:
  static constexpr std::size_t kMaxHeldDirs = 64;

  explicit HeldDirs(std::string devices_dir) : devices_dir_(std::move(devices_dir)) {}
  ~HeldDirs() { drop(); }
  HeldDirs(const HeldDirs&) = delete;
  HeldDirs& operator=(const HeldDirs&) = delete;

  std::optional<std::string> fingerprint() {
    if (++taken_ % SysfsReader::kFingerprintFreshEvery == 0) drop();
    const bool reused = devices_ != nullptr;
    auto f = take();
    if (reused && f != last_) {
      drop();
      f = take();
    }
    if (!f) drop();
    last_ = f;
    return f;
  }

 private:
  std::optional<std::string> take() {
    if (devices_ == nullptr)
      devices_ = ::opendir(devices_dir_.c_str());
    else
      ::rewinddir(devices_);
    if (devices_ == nullptr) return std::nullopt;
    auto entries = read_entries(devices_);
    if (!entries) return std::nullopt;
    std::sort(entries->begin(), entries->end());
    const int base = ::dirfd(devices_);
    std::string out;
    out.reserve(entries->size() * 96);
    for (const auto& name : *entries) {
      const int dir = dir_of(base, name);
      out += name;
      for (const char* link : {"driver", "iommu_group"}) {
        out += ' ';
        if (dir >= 0)
          append_link_at(dir, link, out);
        else
          append_link_at(base, name + "/" + link, out);
      }
      out += '\n';
    }
    return out;
  }
  // `name`'s directory under `base`, held; -1 past kMaxHeldDirs or when it cannot be opened.
  int dir_of(int base, const std::string& name) {
    if (const auto it = dirs_.find(name); it != dirs_.end()) return it->second;
    if (dirs_.size() >= kMaxHeldDirs) return -1;
    const int fd = ::openat(base, name.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) dirs_.emplace(name, fd);
    return fd;
  }
  void drop() {
    if (devices_ != nullptr) ::closedir(devices_);
    devices_ = nullptr;
    for (const auto& [name, fd] : dirs_) ::close(fd);
    dirs_.clear();
  }

  std::string devices_dir_;
  DIR* devices_ = nullptr;
  std::map<std::string, int, std::less<>> dirs_;
  std::optional<std::string> last_;
  unsigned taken_ = 0;
};

// The host's IOMMU groups (<groups_dir>/N/devices), each group's members listed when first needed.
class IommuGroups {
 public:
  // `numbers`: the entries of groups_dir.
  IommuGroups(const std::string& groups_dir, const std::vector<std::string>& numbers,
              std::vector<std::string>& warnings)
      : groups_dir_(groups_dir), numbers_(numbers), warnings_(warnings) {}

  // Lists the members of `group` unless listed already (none when its directory cannot be listed).
  void load(int group) {
    if (members_.contains(group)) return;
    auto& members = members_[group];
    const std::string dir = fmt::format("{}/{}/devices", groups_dir_, group);
    int e = 0;
    auto listed = list_dir(dir, &e);
    if (!listed) {
      warnings_.push_back(fmt::format("cannot list {}: {}", dir, std::strerror(e)));
      return;
    }
    for (const auto& n : *listed) {
      auto address = PciAddress::parse(n);
      if (!address) {
        warnings_.push_back(fmt::format("{}: ignoring \"{}\": not a PCI address", dir, sysfs_text(n)));
        continue;
      }
      members.push_back(*address);
    }
  }

  // The group that lists `address`, from every group's listing (all listed on the first call).
  std::optional<int> listing(const PciAddress& address) {
    if (!group_of_) {
      group_of_.emplace();
      for (const auto& g : numbers_) {
        auto gn = group_number(g);
        if (!gn) continue;
        load(*gn);
        for (const auto& m : members_[*gn]) group_of_->emplace(m, *gn);
      }
    }
    auto it = group_of_->find(address);
    if (it == group_of_->end()) return std::nullopt;
    return it->second;
  }

  // Group -> members, of the groups listed so far.
  [[nodiscard]] const std::map<int, std::vector<PciAddress>>& listed() const { return members_; }

 private:
  const std::string& groups_dir_;
  const std::vector<std::string>& numbers_;
  std::vector<std::string>& warnings_;
  std::map<int, std::vector<PciAddress>> members_;
  std::optional<std::map<PciAddress, int>> group_of_;  // built only if a GPU has no group link
};

// What the steps of one read() share.
struct Scan {
  std::map<PciAddress, DeviceRecord> all;  // every function on the bus, and the ghosts
  std::set<PciAddress> wanted;             // devices that belong in the snapshot
  std::vector<PciAddress> groupless;       // GPUs in no group
  std::map<PciAddress, int> group_of;      // members of the groups that hold a GPU candidate
  std::set<PciAddress> ghosts;             // listed in a group, absent from the bus
};

}  // namespace

struct SysfsReader::Impl {
  std::filesystem::path host_root;
  Policy policy;
  const PciIds* names;
  std::string sys;          // <host_root>/sys
  std::string devices_dir;  // <host_root>/sys/bus/pci/devices
  std::string groups_dir;   // <host_root>/sys/kernel/iommu_groups
  sysfs::PciLibrary pci;
  HeldDirs held;  // fingerprint()'s

  Impl(std::filesystem::path root, Policy p, const PciIds* n)
      : host_root(std::move(root)),
        policy(std::move(p)),
        names(n),
        sys((host_root / "sys").string()),
        devices_dir(sys + "/bus/pci/devices"),
        groups_dir(sys + "/kernel/iommu_groups"),
        pci(sys + "/bus/pci"),
        held(devices_dir) {}

  std::string dev_path(const PciAddress& a) const { return devices_dir + "/" + a.to_string(); }

  HostSnapshot read() {
    HostSnapshot snap;
    const sysfs::PciWarnings pci_warnings(snap.warnings);
    read_acs_override(snap);
    const std::vector<std::string> group_numbers = list_groups(snap);

    int err = 0;
    auto entries = list_dir(devices_dir, &err);
    if (!entries) {
      snap.warnings.push_back(fmt::format("cannot list {}: {}", devices_dir, std::strerror(err)));
      return snap;
    }
    if (!pci.start(snap.warnings)) return snap;
    DeviceReader reader(pci.handle(), devices_dir, policy, names, snap.warnings);
    IommuGroups groups(groups_dir, group_numbers, snap.warnings);
    Scan scan;
    scan.all = identify_all(*entries, reader, snap);
    find_candidates(scan, groups, snap);
    add_members(scan, groups, snap);
    look_closer(scan, reader, snap);
    warn_unidentified(scan, snap);
    return snap;
  }

  // pcie_acs_override on the kernel command line.
  void read_acs_override(HostSnapshot& snap) const {
    const std::string path = (host_root / "proc" / "cmdline").string();
    FileText cmdline = read_small(path);
    if (cmdline.error && cmdline.error != EFBIG) {
      snap.warnings.push_back(fmt::format("cannot read {}: {}", path, describe(cmdline)));
    } else if (cmdline.error == EFBIG) {
      snap.acs_override = cmdline_has_acs_override(read_whole(path));  // longer than one small read
    } else {
      snap.acs_override = cmdline_has_acs_override(cmdline.text);
    }
  }

  // The entries of groups_dir (none when it cannot be listed); any group number among them means
  // the host has IOMMU groups.
  std::vector<std::string> list_groups(HostSnapshot& snap) const {
    auto group_names = list_dir(groups_dir);
    if (!group_names) return {};
    for (const auto& n : *group_names) {
      if (group_number(n)) {
        snap.iommu_groups_present = true;
      } else {
        snap.warnings.push_back(
            fmt::format("{}: ignoring \"{}\": not an IOMMU group number", groups_dir, sysfs_text(n)));
      }
    }
    return std::move(*group_names);
  }

  // 1. Identity: every function listed gets the reader's first look.
  std::map<PciAddress, DeviceRecord> identify_all(const std::vector<std::string>& entries,
                                                  DeviceReader& reader, HostSnapshot& snap) const {
    std::map<PciAddress, DeviceRecord> all;
    for (const auto& name : entries) {
      auto address = PciAddress::parse(name);
      if (!address) {
        snap.warnings.push_back(
            fmt::format("{}: ignoring \"{}\": not a PCI address", devices_dir, sysfs_text(name)));
        continue;
      }
      DeviceRecord d = reader.first_look(*address);
      all.emplace(d.address, std::move(d));
    }
    return all;
  }

  // 2. GPU candidates, and their groups listed.
  void find_candidates(Scan& scan, IommuGroups& groups, HostSnapshot& snap) const {
    for (auto& [address, d] : scan.all) {
      if (!is_gpu_candidate(d, policy)) continue;
      d.is_virtual_function = exists_nofollow(dev_path(address) + "/physfn");
      if (d.is_virtual_function) continue;  // never a GPU of its own
      scan.wanted.insert(address);
      if (!snap.iommu_groups_present) {
        scan.groupless.push_back(address);
        continue;
      }
      const auto group = group_of(address, groups);
      if (!group) {
        snap.warnings.push_back(
            fmt::format("{}: in no IOMMU group although the host has IOMMU groups", address.to_string()));
        scan.groupless.push_back(address);
        continue;
      }
      groups.load(*group);
    }
  }

  // A candidate's group: its iommu_group link, or without a usable one the group that lists it.
  std::optional<int> group_of(const PciAddress& address, IommuGroups& groups) const {
    LinkName link = read_link_name(dev_path(address) + "/iommu_group");
    if (auto group = link.name ? group_number(*link.name) : std::nullopt) return group;
    return groups.listing(address);
  }

  // 3. Members: group members, or the slot of a GPU without a group.
  void add_members(Scan& scan, const IommuGroups& groups, const HostSnapshot& snap) const {
    for (const auto& [group, members] : groups.listed()) {
      bool has_candidate = std::any_of(members.begin(), members.end(),
                                       [&](const PciAddress& m) { return scan.wanted.contains(m); });
      if (!has_candidate) continue;
      for (const auto& m : members) scan.group_of[m] = group;
    }
    for (const auto& gpu : scan.groupless) {
      for (const auto& [address, d] : scan.all) {
        if (!address.same_slot(gpu) || scan.group_of.contains(address)) continue;
        if (snap.iommu_groups_present && exists_nofollow(dev_path(address) + "/iommu_group")) continue;
        scan.wanted.insert(address);
      }
    }
    for (const auto& [member, group] : scan.group_of) {
      scan.wanted.insert(member);
      if (!scan.all.contains(member)) {
        // Listed in the group but not on the PCI bus: something we cannot identify shares the group.
        DeviceRecord ghost;
        ghost.address = member;
        sysfs::add_fault(ghost, "vendor",
                         fmt::format("listed in IOMMU group {} but absent from {}", group, devices_dir));
        scan.ghosts.insert(member);
        scan.all.emplace(member, std::move(ghost));
      }
    }
  }

  // 4. The deeper look, for the devices that matter; their faults become warnings.
  void look_closer(Scan& scan, DeviceReader& reader, HostSnapshot& snap) const {
    for (const auto& address : scan.wanted) {
      DeviceRecord& d = scan.all.at(address);
      if (auto g = scan.group_of.find(address); g != scan.group_of.end()) d.iommu_group = g->second;
      if (!scan.ghosts.contains(address)) reader.look_closer(d);
      for (const auto& f : d.faults) {
        snap.warnings.push_back(fmt::format("{}: {}: {}", address.to_string(), f.attribute, f.message));
      }
      snap.devices.push_back(std::move(d));
    }
  }

  // Functions that could not be identified at all might have been GPUs: say which.
  static void warn_unidentified(const Scan& scan, HostSnapshot& snap) {
    for (const auto& [address, d] : scan.all) {
      if (scan.wanted.contains(address)) continue;
      if (const Fault* f = d.fault("vendor")) {
        snap.warnings.push_back(fmt::format("{}: vendor: {} (skipped: cannot tell whether it is a GPU)",
                                            address.to_string(), f->message));
      } else if (const Fault* c = d.fault("class")) {
        snap.warnings.push_back(fmt::format("{}: class: {} (skipped: cannot tell whether it is a GPU)",
                                            address.to_string(), c->message));
      }
    }
  }
};

SysfsReader::SysfsReader(std::filesystem::path host_root, Policy policy, const PciIds* names)
    : impl_(std::make_unique<Impl>(std::move(host_root), std::move(policy), names)) {}

SysfsReader::~SysfsReader() = default;

HostSnapshot SysfsReader::read() {
  return impl_->read();
}

std::optional<std::string> SysfsReader::fingerprint() {
  return impl_->held.fingerprint();
}

std::optional<std::uint32_t> pci_class_of(const std::filesystem::path& host_root,
                                          const std::string& address) {
  auto parsed = PciAddress::parse(address);
  if (!parsed) return std::nullopt;  // never a path of someone else's making
  FileText f = read_small((host_root / "sys/bus/pci/devices" / parsed->to_string() / "class").string());
  auto v = f.error ? std::nullopt : parse_integer(f.text);
  if (!v || *v < 0 || *v > 0xffffff) return std::nullopt;
  return static_cast<std::uint32_t>(*v);
}

}  // namespace gpunode::discovery
