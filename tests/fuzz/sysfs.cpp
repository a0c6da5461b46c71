// Fuzz target: the sysfs reader (gpunode::discovery::SysfsReader, libpci included) over a tree
// the input describes, and what the host's units become (build_units, the units' JSON).
//
// The input is text, one instruction a line (a line's bytes are taken as they are; `\n`, `\\`
// and `\xNN` in CONTENT and TARGET are unescaped):
//   dev ADDR                 a function: sys/devices/pci0000:00/ADDR, linked from sys/bus/pci/devices
//   file ADDR NAME CONTENT   a file in the function's directory (vendor, class, config, numa_node...)
//   driver ADDR NAME         sys/bus/pci/drivers/NAME and the function's `driver` link to it
//   group ADDR N             sys/kernel/iommu_groups/N/devices/ADDR and the `iommu_group` link
//   link ADDR NAME TARGET    any link in the function's directory (physfn, consumer:pci:...)
//   dir ADDR NAME            a directory in the function's directory (mdev_supported_types)
//   cmdline CONTENT          proc/cmdline
// Names never hold '/' (it becomes '_'); "." and ".." become "_". The tree lives on tmpfs when
// /dev/shm exists, and is emptied before each input.
//
// Properties: the reader never throws and never ends the process (libpci's errors included);
// devices come sorted and unique; the units' JSON, as GET units serializes it, is valid UTF-8
// whatever bytes the tree holds; fingerprint() of an unchanged tree is stable.
#include <unistd.h>

#include <boost/json/serialize.hpp>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "fuzz_check.hpp"
#include "gpunode/discovery/json.hpp"
#include "gpunode/discovery/rules.hpp"
#include "gpunode/discovery/sysfs_reader.hpp"
#include "gpunode/store/canonical_json.hpp"

namespace {

namespace fs = std::filesystem;
namespace discovery = gpunode::discovery;
using gpunode::fuzz::check;

constexpr std::size_t kMaxLines = 64;
constexpr std::size_t kMaxName = 80;

std::string safe_name(std::string_view raw) {
  std::string out(raw.substr(0, kMaxName));
  for (char& c : out)
    if (c == '/' || c == '\0') c = '_';
  if (out.empty() || out == "." || out == "..") out = "_";
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string unescape(std::string_view in) {
  std::string out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 == in.size()) {
      out.push_back(in[i]);
      continue;
    }
    const char n = in[++i];
    if (n == 'n') {
      out.push_back('\n');
    } else if (n == 'x' && i + 2 < in.size() && hex_digit(in[i + 1]) >= 0 && hex_digit(in[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex_digit(in[i + 1]) * 16 + hex_digit(in[i + 2])));
      i += 2;
    } else {
      out.push_back(n);
    }
  }
  return out;
}

// The next space-separated word of `line` (and `line` moves past it).
std::string_view word(std::string_view& line) {
  const auto end = line.find(' ');
  const std::string_view w = line.substr(0, end);
  line = end == std::string_view::npos ? std::string_view{} : line.substr(end + 1);
  return w;
}

class Tree {
 public:
  Tree() {
    const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    root_ = base / ("gpunode-fuzz-sysfs-" + std::to_string(::getpid()));
  }
  ~Tree() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  Tree(const Tree&) = delete;
  Tree& operator=(const Tree&) = delete;

  const fs::path& root() const { return root_; }

  void build(std::string_view text) {
    std::error_code ec;
    fs::remove_all(root_, ec);
    fs::create_directories(root_ / "sys/bus/pci/devices", ec);
    fs::create_directories(root_ / "sys/bus/pci/drivers", ec);
    fs::create_directories(root_ / "sys/kernel/iommu_groups", ec);
    fs::create_directories(root_ / "proc", ec);
    std::size_t lines = 0;
    while (!text.empty() && lines++ < kMaxLines) {
      const auto nl = text.find('\n');
      std::string_view line = text.substr(0, nl);
      text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
      apply(line);
    }
  }

 private:
  fs::path dev(std::string_view addr) const { return root_ / "sys/devices/pci0000:00" / safe_name(addr); }

  static void write(const fs::path& p, const std::string& content) {
    std::ofstream(p, std::ios::binary | std::ios::trunc) << content;
  }

  void apply(std::string_view line) {
    std::error_code ec;
    const std::string_view op = word(line);
    if (op == "cmdline") {
      write(root_ / "proc/cmdline", unescape(line));
      return;
    }
    const std::string addr = safe_name(word(line));
    const fs::path d = dev(addr);
    if (op == "dev") {
      fs::create_directories(d, ec);
      fs::create_directory_symlink(fs::path("../../../devices/pci0000:00") / addr,
                                   root_ / "sys/bus/pci/devices" / addr, ec);
    } else if (op == "file") {
      const std::string name = safe_name(word(line));
      fs::create_directories(d, ec);
      write(d / name, unescape(line));
    } else if (op == "driver") {
      const std::string name = safe_name(line);
      fs::create_directories(root_ / "sys/bus/pci/drivers" / name, ec);
      fs::create_directories(d, ec);
      fs::create_directory_symlink(fs::path("../../../bus/pci/drivers") / name, d / "driver", ec);
    } else if (op == "group") {
      const std::string n = safe_name(line);
      const fs::path g = root_ / "sys/kernel/iommu_groups" / n;
      fs::create_directories(g / "devices", ec);
      fs::create_directories(d, ec);
      fs::create_directory_symlink(fs::path("../../../../devices/pci0000:00") / addr, g / "devices" / addr,
                                   ec);
      fs::create_directory_symlink(fs::path("../../../kernel/iommu_groups") / n, d / "iommu_group", ec);
    } else if (op == "link") {
      const std::string name = safe_name(word(line));
      fs::create_directories(d, ec);
      fs::create_symlink(unescape(line), d / name, ec);
    } else if (op == "dir") {
      fs::create_directories(d / safe_name(line), ec);
    }
  }

  fs::path root_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Tree tree;
  tree.build(std::string_view(reinterpret_cast<const char*>(data), size));

  const discovery::Policy policy;
  discovery::SysfsReader reader(tree.root(), policy, nullptr);
  const auto first = reader.fingerprint();
  const discovery::HostSnapshot snap = reader.read();
  check(reader.fingerprint() == first, "the fingerprint of an unchanged tree changed");

  for (std::size_t i = 1; i < snap.devices.size(); ++i)
    check(snap.devices[i - 1].address < snap.devices[i].address, "devices not sorted and unique");

  const auto units = discovery::build_units(snap, policy);
  const std::string body = boost::json::serialize(discovery::units_body("node-fuzz", units));
  check(gpunode::store::is_valid_utf8(body), "the units' JSON is not valid UTF-8", body);
  for (const auto& unit : units) {
    check(unit.reasons.empty() == unit.reservable, "a unit reservable with reasons, or not without");
  }
  return 0;
}
