// The sysfs + libpci adapter. See sysfs_reader.hpp for the contract.
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
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csetjmp>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

extern "C" {
#include <pci/pci.h>
}

#include "gpunode/discovery/rules.hpp"
#include "gpunode/json/utf8.hpp"

namespace gpunode::discovery {
namespace {

std::string sysfs_text(std::string_view raw);  // below: sysfs bytes as text safe to show

// ---- libpci error handling ------------------------------------------------------------------
// libpci's `error` callback must not return (its default calls exit()). Ours records the message
// and jumps back to the guard around the libpci call that failed; only C frames lie in between.
thread_local std::jmp_buf* t_pci_jump = nullptr;
thread_local char t_pci_message[512];
thread_local std::vector<std::string>* t_pci_warnings = nullptr;

// Declared with libpci's own attribute macros, as its callback members are: clang takes GNU
// noreturn as part of the function's type (assigning to `error` needs it), and the format
// attribute lets the va_list reach vsnprintf under -Wformat-nonliteral.
void on_pci_error(char* format, ...) PCI_PRINTF(1, 2) PCI_NONRET;
void on_pci_warning(char* format, ...) PCI_PRINTF(1, 2);

void on_pci_error(char* format, ...) {
  va_list args;
  va_start(args, format);
  std::vsnprintf(t_pci_message, sizeof t_pci_message, format, args);
  va_end(args);
  if (t_pci_jump != nullptr) std::longjmp(*t_pci_jump, 1);
  // Unreachable by construction: every libpci call runs under pci_guard().
  std::fprintf(stderr, "gpunode: libpci error outside a guard: %s\n", t_pci_message);
  std::abort();
}

void on_pci_warning(char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  if (t_pci_warnings != nullptr) t_pci_warnings->push_back(fmt::format("libpci: {}", sysfs_text(buf)));
}

void on_pci_debug(char*, ...) {}

// Runs `call` (which must only call libpci: no C++ objects with destructors in between) and
// returns the libpci error message if it failed.
template <class Call>
std::optional<std::string> pci_guard(Call&& call) {
  std::jmp_buf jump;
  std::jmp_buf* volatile previous = t_pci_jump;
  if (setjmp(jump) != 0) {
    t_pci_jump = previous;
    return sysfs_text(t_pci_message);
  }
  t_pci_jump = &jump;
  call();
  t_pci_jump = previous;
  return std::nullopt;
}

// ---- small sysfs reads ----------------------------------------------------------------------
struct FileText {
  std::string text;  // without trailing whitespace
  int error = 0;     // errno, 0 on success
};

// `path` is relative to the directory `dir_fd` (AT_FDCWD: to the working directory, or absolute).
FileText read_small_at(int dir_fd, const std::string& path) {
  FileText out;
  int fd = ::openat(dir_fd, path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0 && errno == ELOOP)
    fd = ::openat(dir_fd, path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a link: follow once
  if (fd < 0) {
    out.error = errno;
    return out;
  }
  char buf[256];
  ssize_t n = ::read(fd, buf, sizeof buf);
  const int read_errno = errno;
  ::close(fd);
  if (n < 0) {
    out.error = read_errno;
    return out;
  }
  if (static_cast<std::size_t>(n) == sizeof buf) {
    out.error = EFBIG;
    return out;
  }
  std::string_view v(buf, static_cast<std::size_t>(n));
  while (!v.empty() && (v.back() == '\n' || v.back() == ' ' || v.back() == '\t' || v.back() == '\0')) {
    v.remove_suffix(1);
  }
  out.text.assign(v);
  return out;
}

FileText read_small(const std::string& path) {
  return read_small_at(AT_FDCWD, path);
}

// Text taken from sysfs (a value, a link's target, an entry's name, libpci's message about one) as
// it may appear in reasons, warnings and the units' JSON: well-formed UTF-8 is kept; every other
// byte, and every control character, becomes `\xNN`. sysfs holds bytes, not text: a garbled
// attribute must not make the API's JSON invalid or split a log line.
std::string sysfs_text(std::string_view raw) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(raw.size());
  auto escape = [&](unsigned char c) {
    out += "\\x";
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 0x0f]);
  };
  std::size_t i = 0;
  while (i < raw.size()) {
    const auto c = static_cast<unsigned char>(raw[i]);
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f)
        escape(c);
      else
        out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    const std::size_t n = gpunode::json::utf8_sequence(raw, i);
    if (n == 0) {
      escape(c);
      ++i;
    } else {
      out.append(raw.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string describe(const FileText& f) {
  if (f.error == EFBIG) return "value too long";
  return std::strerror(f.error);
}

std::optional<long long> parse_integer(std::string_view text) {
  long long value = 0;
  int base = 10;
  if (text.starts_with("0x") || text.starts_with("0X")) {
    text.remove_prefix(2);
    base = 16;
  }
  if (text.empty()) return std::nullopt;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (ec != std::errc{} || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

bool exists_nofollow(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The last component of a symlink's target ("../../bus/pci/drivers/vfio-pci" -> "vfio-pci").
struct LinkName {
  std::optional<std::string> name;  // nullopt with error 0: no such link
  int error = 0;
};

LinkName read_link_name(const std::string& path) {
  char buf[4096];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  if (n < 0) {
    if (errno == ENOENT) return {};
    return {std::nullopt, errno};
  }
  std::string_view target(buf, static_cast<std::size_t>(n));
  while (!target.empty() && target.back() == '/') target.remove_suffix(1);
  auto slash = target.rfind('/');
  std::string_view base = slash == std::string_view::npos ? target : target.substr(slash + 1);
  if (base.empty() || base == "." || base == "..") return {std::nullopt, EINVAL};
  return {std::string(base), 0};
}

// Entry names of a directory; nullopt (with errno) if it cannot be opened.
std::optional<std::vector<std::string>> list_dir(const std::string& path, int* error = nullptr) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) {
    if (error) *error = errno;
    return std::nullopt;
  }
  std::vector<std::string> names;
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    names.emplace_back(entry->d_name);
  }
  ::closedir(dir);
  return names;
}

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

struct DirFd {
  int fd;
  ~DirFd() {
    if (fd >= 0) ::close(fd);
  }
};

// The target of the link `path` under `dir_fd`, "-" when there is none, "?" when it cannot be read.
void append_link_at(int dir_fd, const std::string& path, std::string& out) {
  char buf[4096];
  const ssize_t n = ::readlinkat(dir_fd, path.c_str(), buf, sizeof buf);
  if (n >= 0)
    out.append(buf, static_cast<std::size_t>(n));
  else
    out += errno == ENOENT ? "-" : "?";
}

struct PciDevDeleter {
  void operator()(pci_dev* d) const { pci_free_dev(d); }
};

}  // namespace

struct SysfsReader::Impl {
  std::filesystem::path host_root;
  Policy policy;
  const PciIds* names;
  std::string sys;          // <host_root>/sys
  std::string devices_dir;  // <host_root>/sys/bus/pci/devices
  std::string groups_dir;   // <host_root>/sys/kernel/iommu_groups
  pci_access* pacc = nullptr;

  Impl(std::filesystem::path root, Policy p, const PciIds* n)
      : host_root(std::move(root)), policy(std::move(p)), names(n) {
    sys = (host_root / "sys").string();
    devices_dir = sys + "/bus/pci/devices";
    groups_dir = sys + "/kernel/iommu_groups";
  }

  ~Impl() {
    if (pacc != nullptr) {
      pci_access* a = pacc;
      pci_guard([&] { pci_cleanup(a); });
    }
  }

  // Creates the libpci handle on first use; false (with a warning) if libpci cannot start.
  bool ensure_libpci(std::vector<std::string>& warnings) {
    if (pacc != nullptr) return true;
    pci_access* a = pci_alloc();
    if (a == nullptr) {
      warnings.emplace_back("libpci: cannot allocate an access handle");
      return false;
    }
    a->error = on_pci_error;
    a->warning = on_pci_warning;
    a->debug = on_pci_debug;
    a->method = PCI_ACCESS_SYS_BUS_PCI;
    std::string bus = sys + "/bus/pci";
    std::vector<char> bus_c(bus.begin(), bus.end());
    bus_c.push_back('\0');
    char param[] = "sysfs.path";
    auto failed = pci_guard([&] {
      pci_set_param(a, param, bus_c.data());
      pci_init(a);
    });
    if (failed) {
      warnings.push_back(fmt::format("libpci: cannot start on {}: {}", bus, *failed));
      pci_guard([&] { pci_cleanup(a); });
      return false;
    }
    pacc = a;
    return true;
  }

  std::string dev_path(const PciAddress& a) const { return devices_dir + "/" + a.to_string(); }

  // Faults become warnings once the device is known to matter (see read()).
  static void add_fault(DeviceRecord& d, std::string attribute, std::string message, HostSnapshot&) {
    std::erase_if(d.faults, [&](const Fault& f) { return f.attribute == attribute; });
    d.faults.push_back({std::move(attribute), std::move(message)});
  }

  // vendor/device through libpci (the sysfs `vendor` and `device` files; never config space).
  void read_ident(DeviceRecord& d, pci_dev* pd, HostSnapshot& snap) const {
    if (auto err = pci_guard([&] { pci_fill_info(pd, PCI_FILL_IDENT); })) {
      add_fault(d, "vendor", *err, snap);
      return;
    }
    if (pd->vendor_id == 0x0000 || pd->vendor_id == 0xffff) {
      add_fault(d, "vendor",
                fmt::format("0x{:04x} is not a vendor id (garbled or missing device)", pd->vendor_id), snap);
      return;
    }
    d.vendor_id = pd->vendor_id;
    d.device_id = pd->device_id;
  }

  void read_class(DeviceRecord& d, HostSnapshot& snap) const {
    if (d.class_code || d.fault("class")) return;
    // libpci keeps only the top 16 bits of `class`; read the whole file ourselves so the
    // programming interface is kept and garbage is told apart from class 0.
    FileText f = read_small(dev_path(d.address) + "/class");
    if (f.error) {
      add_fault(d, "class", describe(f), snap);
      return;
    }
    auto v = parse_integer(f.text);
    if (!v || *v < 0 || *v > 0xffffff) {
      add_fault(d, "class", fmt::format("unparsable value \"{}\"", sysfs_text(f.text.substr(0, 40))), snap);
      return;
    }
    d.class_code = static_cast<std::uint32_t>(*v);
  }

  // Everything the rules need of a member of a unit (or a GPU candidate). `pd` is null when
  // libpci could not open the device; what sysfs still says is read all the same.
  void read_deep(DeviceRecord& d, pci_dev* pd, HostSnapshot& snap) const {
    const std::string base = dev_path(d.address);
    read_class(d, snap);

    LinkName drv = read_link_name(base + "/driver");
    if (drv.error) {
      d.driver_known = false;
      add_fault(d, "driver", fmt::format("cannot read the driver link: {}", std::strerror(drv.error)), snap);
    } else {
      d.driver = drv.name ? std::optional<std::string>(sysfs_text(*drv.name)) : std::nullopt;
    }

    FileText numa = read_small(base + "/numa_node");
    if (!numa.error) {
      auto v = parse_integer(numa.text);
      if (!v || *v < -1 || *v > 4095) {
        add_fault(d, "numa_node", fmt::format("unparsable value \"{}\"", sysfs_text(numa.text.substr(0, 40))),
                  snap);
      } else if (*v >= 0) {
        d.numa_node = static_cast<int>(*v);
      }
    } else if (numa.error != ENOENT) {
      add_fault(d, "numa_node", describe(numa), snap);
    }

    FileText vga = read_small(base + "/boot_vga");
    if (!vga.error) {
      if (vga.text == "0" || vga.text == "1") {
        d.boot_vga = vga.text == "1";
      } else {
        d.boot_vga = std::nullopt;
        add_fault(d, "boot_vga", fmt::format("unparsable value \"{}\"", sysfs_text(vga.text.substr(0, 40))),
                  snap);
      }
    } else if (vga.error != ENOENT) {
      d.boot_vga = std::nullopt;
      add_fault(d, "boot_vga", describe(vga), snap);
    }

    d.is_virtual_function = exists_nofollow(base + "/physfn");
    if (!is_gpu_candidate(d, policy) || d.is_virtual_function) {
      if (pd != nullptr && d.vendor_id) read_header_type(d, pd, snap);
      return;
    }

    // GPU facts.
    FileText vfs = read_small(base + "/sriov_numvfs");
    if (!vfs.error) {
      auto v = parse_integer(vfs.text);
      if (!v || *v < 0 || *v > 65535) {
        d.sriov_numvfs = std::nullopt;
        add_fault(d, "sriov_numvfs",
                  fmt::format("unparsable value \"{}\"", sysfs_text(vfs.text.substr(0, 40))), snap);
      } else {
        d.sriov_numvfs = static_cast<int>(*v);
      }
    } else if (vfs.error != ENOENT) {
      d.sriov_numvfs = std::nullopt;
      add_fault(d, "sriov_numvfs", describe(vfs), snap);
    }
    d.mdev_parent = is_directory(base + "/mdev_supported_types");
    if (auto entries = list_dir(base)) {
      for (const auto& name : *entries) {
        if (!name.starts_with("consumer:pci:")) continue;
        if (auto consumer = PciAddress::parse(std::string_view(name).substr(13))) {
          d.consumers.push_back(*consumer);
        } else {
          snap.warnings.push_back(
              fmt::format("{}: ignoring device link \"{}\"", d.address.to_string(), sysfs_text(name)));
        }
      }
      std::sort(d.consumers.begin(), d.consumers.end());
    }
    if (names != nullptr && d.vendor_id && d.device_id)
      d.name = names->device_name(*d.vendor_id, *d.device_id);
  }

  // The header type decides `bridge` for devices whose class does not; read only for those, and
  // only from the first 64 bytes of config space (never for a GPU, which must not be woken).
  void read_header_type(DeviceRecord& d, pci_dev* pd, HostSnapshot& snap) const {
    if (!d.class_code) return;
    const auto c = *d.class_code >> 8;
    if ((c >> 8) == 0x06 || c == 0x0403 || c == 0x0c03 || c == 0x0c80)
      return;  // bridges by class, companions
    u8 value = 0xff;
    if (auto err = pci_guard([&] { value = pci_read_byte(pd, PCI_HEADER_TYPE); })) {
      add_fault(d, "config", *err, snap);
      return;
    }
    if (value == 0xff) {
      add_fault(d, "config", "cannot read the header type", snap);
      return;
    }
    d.header_type = static_cast<std::uint8_t>(value & 0x7f);
  }

  HostSnapshot read() {
    HostSnapshot snap;
    t_pci_warnings = &snap.warnings;
    struct Reset {
      ~Reset() { t_pci_warnings = nullptr; }
    } reset;

    FileText cmdline = read_small((host_root / "proc" / "cmdline").string());
    if (cmdline.error && cmdline.error != EFBIG) {
      snap.warnings.push_back(
          fmt::format("cannot read {}: {}", (host_root / "proc" / "cmdline").string(), describe(cmdline)));
    } else if (cmdline.error == EFBIG) {
      // Longer than one small read: read it whole.
      std::FILE* f = std::fopen((host_root / "proc" / "cmdline").c_str(), "r");
      std::string all;
      if (f) {
        char buf[4096];
        std::size_t n;
        while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) all.append(buf, n);
        std::fclose(f);
      }
      snap.acs_override = cmdline_has_acs_override(all);
    } else {
      snap.acs_override = cmdline_has_acs_override(cmdline.text);
    }

    int err = 0;
    auto group_names = list_dir(groups_dir, &err);
    if (group_names) {
      for (const auto& n : *group_names) {
        auto g = parse_integer(n);
        if (g && *g >= 0 && *g <= INT32_MAX) {
          snap.iommu_groups_present = true;
        } else {
          snap.warnings.push_back(
              fmt::format("{}: ignoring \"{}\": not an IOMMU group number", groups_dir, sysfs_text(n)));
        }
      }
    }

    auto entries = list_dir(devices_dir, &err);
    if (!entries) {
      snap.warnings.push_back(fmt::format("cannot list {}: {}", devices_dir, std::strerror(err)));
      return snap;
    }
    if (!ensure_libpci(snap.warnings)) return snap;
    // Every function's `vendor` is read relative to the devices directory: the kernel then walks
    // two path components per read instead of the whole <host_root>/sys/bus/pci/devices/... path,
    // on a host where that read is most of what discovery costs.
    DirFd devices{::open(devices_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_PATH)};

    // 1. Identity. Every function costs one read of its `vendor` file, the cheapest filter there
    //    is; functions of a GPU vendor are then identified through libpci, and their class read.
    std::map<PciAddress, DeviceRecord> all;
    std::map<PciAddress, std::unique_ptr<pci_dev, PciDevDeleter>> handles;
    auto open_handle = [&](DeviceRecord& d) -> pci_dev* {
      if (auto h = handles.find(d.address); h != handles.end()) return h->second.get();
      pci_dev* pd = nullptr;
      pci_access* a = pacc;
      const PciAddress ad = d.address;
      if (auto e = pci_guard(
              [&] { pd = pci_get_dev(a, static_cast<int>(ad.domain), ad.bus, ad.slot, ad.function); });
          e || pd == nullptr) {
        add_fault(d, "vendor", fmt::format("libpci: {}", e.value_or("no such device")), snap);
        return nullptr;
      }
      handles.emplace(ad, pd);
      return pd;
    };
    auto identify = [&](DeviceRecord& d) {
      if (pci_dev* pd = open_handle(d)) {
        d.vendor_id.reset();
        std::erase_if(d.faults, [](const Fault& f) { return f.attribute == "vendor"; });
        read_ident(d, pd, snap);
      }
    };
    std::set<PciAddress> ghosts;  // listed in a group, absent from the bus
    for (const auto& name : *entries) {
      auto address = PciAddress::parse(name);
      if (!address) {
        snap.warnings.push_back(
            fmt::format("{}: ignoring \"{}\": not a PCI address", devices_dir, sysfs_text(name)));
        continue;
      }
      DeviceRecord d;
      d.address = *address;
      FileText vendor = devices.fd >= 0 ? read_small_at(devices.fd, d.address.to_string() + "/vendor")
                                        : read_small(dev_path(d.address) + "/vendor");
      auto v = vendor.error ? std::nullopt : parse_integer(vendor.text);
      if (v && *v > 0 && *v < 0xffff) {
        d.vendor_id = static_cast<std::uint16_t>(*v);
      } else {
        // Leave the verdict to libpci below, should this device turn out to matter.
        add_fault(d, "vendor",
                  vendor.error
                      ? describe(vendor)
                      : fmt::format("unparsable value \"{}\"", sysfs_text(vendor.text.substr(0, 40))),
                  snap);
      }
      if (d.vendor_id && std::find(policy.gpu_vendors.begin(), policy.gpu_vendors.end(), *d.vendor_id) !=
                             policy.gpu_vendors.end()) {
        identify(d);
        read_class(d, snap);
      }
      all.emplace(d.address, std::move(d));
    }

    // 2. GPU candidates and their groups.
    std::set<PciAddress> wanted;                    // devices that belong in the snapshot
    std::map<int, std::vector<PciAddress>> groups;  // group -> members (from iommu_groups/N/devices)
    std::vector<PciAddress> groupless;              // GPUs in no group
    std::optional<std::map<PciAddress, int>> full_group_map;  // built only if a GPU has no group link

    auto load_group = [&](int group) {
      if (groups.contains(group)) return;
      auto& members = groups[group];
      const std::string dir = fmt::format("{}/{}/devices", groups_dir, group);
      int e = 0;
      auto listed = list_dir(dir, &e);
      if (!listed) {
        snap.warnings.push_back(fmt::format("cannot list {}: {}", dir, std::strerror(e)));
        return;
      }
      for (const auto& n : *listed) {
        auto address = PciAddress::parse(n);
        if (!address) {
          snap.warnings.push_back(fmt::format("{}: ignoring \"{}\": not a PCI address", dir, sysfs_text(n)));
          continue;
        }
        members.push_back(*address);
      }
    };

    for (auto& [address, d] : all) {
      if (!is_gpu_candidate(d, policy)) continue;
      d.is_virtual_function = exists_nofollow(dev_path(address) + "/physfn");
      if (d.is_virtual_function) continue;  // never a GPU of its own
      wanted.insert(address);
      if (!snap.iommu_groups_present) {
        groupless.push_back(address);
        continue;
      }
      LinkName link = read_link_name(dev_path(address) + "/iommu_group");
      auto group = link.name ? parse_integer(*link.name) : std::nullopt;
      if (!group || *group < 0 || *group > INT32_MAX) {
        // No (usable) link: look the device up in the groups themselves.
        if (!full_group_map) {
          full_group_map.emplace();
          for (const auto& g : *group_names) {
            auto gn = parse_integer(g);
            if (!gn || *gn < 0 || *gn > INT32_MAX) continue;
            load_group(static_cast<int>(*gn));
            for (const auto& m : groups[static_cast<int>(*gn)])
              full_group_map->emplace(m, static_cast<int>(*gn));
          }
        }
        auto it = full_group_map->find(address);
        if (it == full_group_map->end()) {
          snap.warnings.push_back(
              fmt::format("{}: in no IOMMU group although the host has IOMMU groups", address.to_string()));
          groupless.push_back(address);
          continue;
        }
        group = it->second;
      }
      load_group(static_cast<int>(*group));
    }

    // 3. Members: group members, or the slot of a GPU without a group.
    std::map<PciAddress, int> group_of;
    for (const auto& [group, members] : groups) {
      bool has_candidate = std::any_of(members.begin(), members.end(),
                                       [&](const PciAddress& m) { return wanted.contains(m); });
      if (!has_candidate) continue;
      for (const auto& m : members) group_of[m] = group;
    }
    for (const auto& gpu : groupless) {
      for (const auto& [address, d] : all) {
        if (!address.same_slot(gpu) || group_of.contains(address)) continue;
        if (snap.iommu_groups_present && exists_nofollow(dev_path(address) + "/iommu_group")) continue;
        wanted.insert(address);
      }
    }
    for (const auto& [member, group] : group_of) {
      wanted.insert(member);
      if (!all.contains(member)) {
        // Listed in the group but not on the PCI bus: something we cannot identify shares the group.
        DeviceRecord ghost;
        ghost.address = member;
        add_fault(ghost, "vendor",
                  fmt::format("listed in IOMMU group {} but absent from {}", group, devices_dir), snap);
        ghosts.insert(member);
        all.emplace(member, std::move(ghost));
      }
    }

    // 4. The deeper look, for the devices that matter.
    for (const auto& address : wanted) {
      DeviceRecord& d = all.at(address);
      if (auto g = group_of.find(address); g != group_of.end()) d.iommu_group = g->second;
      if (!handles.contains(address) && !ghosts.contains(address)) identify(d);  // through libpci
      if (!ghosts.contains(address)) {
        auto h = handles.find(address);
        read_deep(d, h == handles.end() ? nullptr : h->second.get(), snap);
      }
      for (const auto& f : d.faults) {
        snap.warnings.push_back(fmt::format("{}: {}: {}", address.to_string(), f.attribute, f.message));
      }
      snap.devices.push_back(std::move(d));
    }
    // Functions that could not be identified at all might have been GPUs: say which.
    for (const auto& [address, d] : all) {
      if (wanted.contains(address)) continue;
      if (const Fault* f = d.fault("vendor")) {
        snap.warnings.push_back(fmt::format("{}: vendor: {} (skipped: cannot tell whether it is a GPU)",
                                            address.to_string(), f->message));
      } else if (const Fault* c = d.fault("class")) {
        snap.warnings.push_back(fmt::format("{}: class: {} (skipped: cannot tell whether it is a GPU)",
                                            address.to_string(), c->message));
      }
    }
    return snap;
  }
};

SysfsReader::SysfsReader(std::filesystem::path host_root, Policy policy, const PciIds* names)
    : impl_(std::make_unique<Impl>(std::move(host_root), std::move(policy), names)) {}

SysfsReader::~SysfsReader() = default;

HostSnapshot SysfsReader::read() {
  return impl_->read();
}

std::optional<std::string> SysfsReader::fingerprint() const {
  int err = 0;
  auto entries = list_dir(impl_->devices_dir, &err);
  const DirFd devices{::open(impl_->devices_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_PATH)};
  if (!entries || devices.fd < 0) return std::nullopt;
  std::sort(entries->begin(), entries->end());
  std::string out;
  out.reserve(entries->size() * 96);
  for (const auto& name : *entries) {
    out += name;
    out += ' ';
    append_link_at(devices.fd, name + "/driver", out);
    out += ' ';
    append_link_at(devices.fd, name + "/iommu_group", out);
    out += '\n';
  }
  return out;
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
