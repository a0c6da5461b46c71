// Reading PCI functions from sysfs and libpci (see sysfs_device.hpp). Nothing here ends the
// process or throws for anything the host tree holds: libpci's errors are caught (below), and a
// file that cannot be read or parsed is a Fault on its device.
#include "sysfs_device.hpp"

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

extern "C" {
#include <pci/pci.h>
}

#include "gpunode/discovery/rules.hpp"
#include "gpunode/text/printable.hpp"
#include "gpunode/text/utf8.hpp"

namespace gpunode::discovery::sysfs {
namespace {

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

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string unparsable(const std::string& text) {
  return fmt::format("unparsable value \"{}\"", sysfs_text(text.substr(0, 40)));
}

// ---- one attribute each (see DeviceReader::read_deep) ---------------------------------------

// vendor/device through libpci (the sysfs `vendor` and `device` files; never config space).
void read_ident(DeviceRecord& d, pci_dev* pd) {
  if (auto err = pci_guard([&] { pci_fill_info(pd, PCI_FILL_IDENT); })) {
    add_fault(d, "vendor", *err);
    return;
  }
  if (pd->vendor_id == 0x0000 || pd->vendor_id == 0xffff) {
    add_fault(d, "vendor",
              fmt::format("0x{:04x} is not a vendor id (garbled or missing device)", pd->vendor_id));
    return;
  }
  d.vendor_id = pd->vendor_id;
  d.device_id = pd->device_id;
}

void read_driver(DeviceRecord& d, const std::string& base) {
  LinkName drv = read_link_name(base + "/driver");
  if (drv.error) {
    d.driver_known = false;
    add_fault(d, "driver", fmt::format("cannot read the driver link: {}", std::strerror(drv.error)));
  } else {
    d.driver = drv.name ? std::optional<std::string>(sysfs_text(*drv.name)) : std::nullopt;
  }
}

void read_numa_node(DeviceRecord& d, const std::string& base) {
  FileText numa = read_small(base + "/numa_node");
  if (!numa.error) {
    auto v = parse_integer(numa.text);
    if (!v || *v < -1 || *v > 4095) {
      add_fault(d, "numa_node", unparsable(numa.text));
    } else if (*v >= 0) {
      d.numa_node = static_cast<int>(*v);
    }
  } else if (numa.error != ENOENT) {
    add_fault(d, "numa_node", describe(numa));
  }
}

void read_boot_vga(DeviceRecord& d, const std::string& base) {
  FileText vga = read_small(base + "/boot_vga");
  if (!vga.error) {
    if (vga.text == "0" || vga.text == "1") {
      d.boot_vga = vga.text == "1";
    } else {
      d.boot_vga = std::nullopt;
      add_fault(d, "boot_vga", unparsable(vga.text));
    }
  } else if (vga.error != ENOENT) {
    d.boot_vga = std::nullopt;
    add_fault(d, "boot_vga", describe(vga));
  }
}

void read_sriov_numvfs(DeviceRecord& d, const std::string& base) {
  FileText vfs = read_small(base + "/sriov_numvfs");
  if (!vfs.error) {
    auto v = parse_integer(vfs.text);
    if (!v || *v < 0 || *v > 65535) {
      d.sriov_numvfs = std::nullopt;
      add_fault(d, "sriov_numvfs", unparsable(vfs.text));
    } else {
      d.sriov_numvfs = static_cast<int>(*v);
    }
  } else if (vfs.error != ENOENT) {
    d.sriov_numvfs = std::nullopt;
    add_fault(d, "sriov_numvfs", describe(vfs));
  }
}

// The devices a GPU's `consumer:pci:ADDRESS` device links name (its companions, by address).
void read_consumers(DeviceRecord& d, const std::string& base, std::vector<std::string>& warnings) {
  auto entries = list_dir(base);
  if (!entries) return;
  for (const auto& name : *entries) {
    if (!name.starts_with("consumer:pci:")) continue;
    if (auto consumer = PciAddress::parse(std::string_view(name).substr(13))) {
      d.consumers.push_back(*consumer);
    } else {
      warnings.push_back(
          fmt::format("{}: ignoring device link \"{}\"", d.address.to_string(), sysfs_text(name)));
    }
  }
  std::sort(d.consumers.begin(), d.consumers.end());
}

// The header type decides `bridge` for devices whose class does not; read only for those, and
// only from the first 64 bytes of config space (never for a GPU, which must not be woken).
void read_header_type(DeviceRecord& d, pci_dev* pd) {
  if (!d.class_code) return;
  const auto c = *d.class_code >> 8;
  if ((c >> 8) == 0x06 || c == 0x0403 || c == 0x0c03 || c == 0x0c80) return;  // bridges by class, companions
  u8 value = 0xff;
  if (auto err = pci_guard([&] { value = pci_read_byte(pd, PCI_HEADER_TYPE); })) {
    add_fault(d, "config", *err);
    return;
  }
  if (value == 0xff) {
    add_fault(d, "config", "cannot read the header type");
    return;
  }
  d.header_type = static_cast<std::uint8_t>(value & 0x7f);
}

}  // namespace

// ---- small sysfs reads ----------------------------------------------------------------------

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

// sysfs holds bytes, not text: a garbled attribute must not make the API's JSON invalid or split
// a log line.
std::string sysfs_text(std::string_view raw) {
  return gpunode::text::printable(raw);
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

std::optional<std::vector<std::string>> list_dir(const std::string& path, int* error) {
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) {
    if (error) *error = errno;
    return std::nullopt;
  }
  auto names = read_entries(dir);
  if (!names && error) *error = errno;
  ::closedir(dir);
  return names;
}

std::optional<std::vector<std::string>> read_entries(DIR* dir) {
  std::vector<std::string> names;
  for (;;) {
    errno = 0;  // readdir's end and its failure differ only by errno
    const dirent* entry = ::readdir(dir);
    if (entry == nullptr) break;
    if (entry->d_name[0] != '.') names.emplace_back(entry->d_name);
  }
  if (errno != 0) return std::nullopt;
  return names;
}

DirFd::~DirFd() {
  if (fd >= 0) ::close(fd);
}

void add_fault(DeviceRecord& d, std::string attribute, std::string message) {
  std::erase_if(d.faults, [&](const Fault& f) { return f.attribute == attribute; });
  d.faults.push_back({std::move(attribute), std::move(message)});
}

// ---- libpci ---------------------------------------------------------------------------------

PciWarnings::PciWarnings(std::vector<std::string>& warnings) {
  t_pci_warnings = &warnings;
}

PciWarnings::~PciWarnings() {
  t_pci_warnings = nullptr;
}

PciLibrary::~PciLibrary() {
  if (pacc_ != nullptr) {
    pci_access* a = pacc_;
    pci_guard([&] { pci_cleanup(a); });
  }
}

bool PciLibrary::start(std::vector<std::string>& warnings) {
  if (pacc_ != nullptr) return true;
  pci_access* a = pci_alloc();
  if (a == nullptr) {
    warnings.emplace_back("libpci: cannot allocate an access handle");
    return false;
  }
  a->error = on_pci_error;
  a->warning = on_pci_warning;
  a->debug = on_pci_debug;
  a->method = PCI_ACCESS_SYS_BUS_PCI;
  std::vector<char> bus_c(bus_dir_.begin(), bus_dir_.end());
  bus_c.push_back('\0');
  char param[] = "sysfs.path";
  auto failed = pci_guard([&] {
    pci_set_param(a, param, bus_c.data());
    pci_init(a);
  });
  if (failed) {
    warnings.push_back(fmt::format("libpci: cannot start on {}: {}", bus_dir_, *failed));
    pci_guard([&] { pci_cleanup(a); });
    return false;
  }
  pacc_ = a;
  return true;
}

void PciDevFree::operator()(pci_dev* d) const {
  pci_free_dev(d);
}

// ---- DeviceReader ---------------------------------------------------------------------------

// Every function's `vendor` is read relative to the devices directory: the kernel then walks two
// path components per read instead of the whole <host_root>/sys/bus/pci/devices/... path, on a
// host where that read is most of what discovery costs.
DeviceReader::DeviceReader(pci_access* pacc, std::string devices_dir, const Policy& policy,
                           const PciIds* names, std::vector<std::string>& warnings)
    : pacc_(pacc),
      devices_dir_(std::move(devices_dir)),
      policy_(policy),
      names_(names),
      warnings_(warnings),
      devices_{::open(devices_dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_PATH)} {}

DeviceReader::~DeviceReader() = default;

DeviceRecord DeviceReader::first_look(const PciAddress& address) {
  DeviceRecord d;
  d.address = address;
  FileText vendor = devices_.fd >= 0 ? read_small_at(devices_.fd, d.address.to_string() + "/vendor")
                                     : read_small(dev_path(d.address) + "/vendor");
  auto v = vendor.error ? std::nullopt : parse_integer(vendor.text);
  if (v && *v > 0 && *v < 0xffff) {
    d.vendor_id = static_cast<std::uint16_t>(*v);
  } else {
    // Leave the verdict to libpci, should this device turn out to matter.
    add_fault(d, "vendor", vendor.error ? describe(vendor) : unparsable(vendor.text));
  }
  if (is_gpu_vendor(d)) {
    identify(d);
    read_class(d);
  }
  return d;
}

void DeviceReader::look_closer(DeviceRecord& d) {
  if (!handles_.contains(d.address)) identify(d);  // through libpci
  auto h = handles_.find(d.address);
  read_deep(d, h == handles_.end() ? nullptr : h->second.get());
}

bool DeviceReader::is_gpu_vendor(const DeviceRecord& d) const {
  return d.vendor_id && std::find(policy_.gpu_vendors.begin(), policy_.gpu_vendors.end(), *d.vendor_id) !=
                            policy_.gpu_vendors.end();
}

// The libpci handle of `d`, opened once per scan; null (with a fault) when libpci has no such device.
pci_dev* DeviceReader::open_handle(DeviceRecord& d) {
  if (auto h = handles_.find(d.address); h != handles_.end()) return h->second.get();
  pci_dev* pd = nullptr;
  pci_access* a = pacc_;
  const PciAddress ad = d.address;
  if (auto e =
          pci_guard([&] { pd = pci_get_dev(a, static_cast<int>(ad.domain), ad.bus, ad.slot, ad.function); });
      e || pd == nullptr) {
    add_fault(d, "vendor", fmt::format("libpci: {}", e.value_or("no such device")));
    return nullptr;
  }
  handles_.emplace(ad, pd);
  return pd;
}

// libpci's identity replaces what the first look read of the vendor.
void DeviceReader::identify(DeviceRecord& d) {
  if (pci_dev* pd = open_handle(d)) {
    d.vendor_id.reset();
    std::erase_if(d.faults, [](const Fault& f) { return f.attribute == "vendor"; });
    read_ident(d, pd);
  }
}

void DeviceReader::read_class(DeviceRecord& d) const {
  if (d.class_code || d.fault("class")) return;
  // libpci keeps only the top 16 bits of `class`; read the whole file ourselves so the
  // programming interface is kept and garbage is told apart from class 0.
  FileText f = read_small(dev_path(d.address) + "/class");
  if (f.error) {
    add_fault(d, "class", describe(f));
    return;
  }
  auto v = parse_integer(f.text);
  if (!v || *v < 0 || *v > 0xffffff) {
    add_fault(d, "class", unparsable(f.text));
    return;
  }
  d.class_code = static_cast<std::uint32_t>(*v);
}

// `pd` is null when libpci could not open the device; what sysfs still says is read all the same.
void DeviceReader::read_deep(DeviceRecord& d, pci_dev* pd) const {
  const std::string base = dev_path(d.address);
  read_class(d);
  read_driver(d, base);
  read_numa_node(d, base);
  read_boot_vga(d, base);
  d.is_virtual_function = exists_nofollow(base + "/physfn");
  if (!is_gpu_candidate(d, policy_) || d.is_virtual_function) {
    if (pd != nullptr && d.vendor_id) read_header_type(d, pd);
    return;
  }

  // GPU facts.
  read_sriov_numvfs(d, base);
  d.mdev_parent = is_directory(base + "/mdev_supported_types");
  read_consumers(d, base, warnings_);
  if (names_ != nullptr && d.vendor_id && d.device_id)
    d.name = names_->device_name(*d.vendor_id, *d.device_id);
}

}  // namespace gpunode::discovery::sysfs
