// The sysfs/libpci adapter against small trees written here, with one fault at a time.
// (Whole hosts modelled on real machines are tested through the binary in tests/fixtures/.)
#include "gpunode/discovery/sysfs_reader.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gpunode/discovery/rules.hpp"
#include "sysfs_tree.hpp"

namespace fs = std::filesystem;
using namespace gpunode::discovery;
using gpunode::testing::Tree;

namespace {

const DeviceRecord* find(const HostSnapshot& s, std::string_view a) {
  for (const auto& d : s.devices) {
    if (d.address.to_string() == a) return &d;
  }
  return nullptr;
}

bool warned(const HostSnapshot& s, std::string_view needle) {
  for (const auto& w : s.warnings) {
    if (w.find(needle) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("a plain group: identity, driver, NUMA node, group") {
  Tree t;
  t.add("0000:41:00.0", "10de", "2330", "030200", "vfio-pci", 37);
  t.add("0000:41:00.1", "10de", "22ba", "040300", "vfio-pci", 37);
  t.add("0000:61:00.0", "15b3", "101d", "020000", "mlx5_core", 52);  // no GPU in its group: not read deeply
  HostSnapshot s = t.read();
  CHECK(s.iommu_groups_present);
  CHECK_FALSE(s.acs_override);
  REQUIRE(s.devices.size() == 2);
  const DeviceRecord* g = find(s, "0000:41:00.0");
  REQUIRE(g);
  CHECK(g->vendor_id == 0x10de);
  CHECK(g->device_id == 0x2330);
  CHECK(g->class_code == 0x030200u);
  CHECK(g->driver == "vfio-pci");
  CHECK(g->numa_node == 0);
  CHECK(g->iommu_group == 37);
  CHECK(s.warnings.empty());
  auto units = build_units(s, {});
  REQUIRE(units.size() == 1);
  CHECK(units[0].reservable);
}

TEST_CASE("no IOMMU groups: slot mates are read, the host says so") {
  Tree t;
  t.add("0000:41:00.0", "10de", "1e04", "030000", "vfio-pci", -1);
  t.add("0000:41:00.1", "10de", "10f7", "040300", "vfio-pci", -1);
  t.add("0000:42:00.0", "8086", "1533", "020000", "igb", -1);
  HostSnapshot s = t.read();
  CHECK_FALSE(s.iommu_groups_present);
  CHECK(s.devices.size() == 2);
  auto units = build_units(s, {});
  REQUIRE(units.size() == 1);
  CHECK(units[0].reasons.at(0).code == "iommu-disabled");
}

TEST_CASE("a missing vendor file is a fault, never an exit of the process") {
  Tree t;
  t.add("0000:41:00.0", "10de", "2330", "030200", "vfio-pci", 3);
  t.add("0000:41:00.1", "10de", "22ba", "040300", "vfio-pci", 3);
  fs::remove(t.dev("0000:41:00.1") / "vendor");
  HostSnapshot s = t.read();
  const DeviceRecord* c = find(s, "0000:41:00.1");
  REQUIRE(c);
  CHECK_FALSE(c->vendor_id);
  REQUIRE(c->fault("vendor"));
  // libpci itself reported it (its error callback would have called exit()); we are still here.
  CHECK(c->fault("vendor")->message.find("Cannot open") != std::string::npos);
  CHECK(warned(s, "0000:41:00.1: vendor"));
  auto units = build_units(s, {});
  REQUIRE(units.size() == 1);
  CHECK(units[0].reasons.at(0).code == "foreign-device");
}

TEST_CASE("garbage in attribute files becomes faults with safe readings") {
  Tree t;
  t.add("0000:41:00.0", "10de", "2330", "030000", "vfio-pci", 3);
  t.write(t.dev("0000:41:00.0") / "boot_vga", "maybe\n");
  t.write(t.dev("0000:41:00.0") / "sriov_numvfs", "-3\n");
  t.write(t.dev("0000:41:00.0") / "numa_node", "zero\n");
  HostSnapshot s = t.read();
  const DeviceRecord* g = find(s, "0000:41:00.0");
  REQUIRE(g);
  CHECK_FALSE(g->boot_vga.has_value());
  CHECK_FALSE(g->sriov_numvfs.has_value());
  CHECK_FALSE(g->numa_node.has_value());
  CHECK(g->faults.size() == 3);
  auto units = build_units(s, {});
  REQUIRE(units.size() == 1);
  CHECK(units[0].reasons.size() == 2);
  CHECK(units[0].reasons[0].code == "host-boot-display");
  CHECK(units[0].reasons[1].code == "sriov-enabled");
}

// Found by tests/fuzz/sysfs (regressions/sysfs): raw bytes of a garbled file reached the reasons,
// and so GET units, as invalid UTF-8.
TEST_CASE("bytes that are not UTF-8 text in sysfs are shown escaped, never raw") {
  Tree t;
  t.add("0000:41:00.0", "10de", "2330", "030000", "vfio-pci", 3);
  t.add("0000:41:00.1", "10de", "22bc", "040300", "snd\xff", 3);
  t.write(t.dev("0000:41:00.0") / "boot_vga", "\xc3\x28\x01\n");
  HostSnapshot s = t.read();
  const DeviceRecord* g = find(s, "0000:41:00.0");
  const DeviceRecord* audio = find(s, "0000:41:00.1");
  REQUIRE(g);
  REQUIRE(audio);
  REQUIRE(g->fault("boot_vga"));
  CHECK(g->fault("boot_vga")->message == "unparsable value \"\\xc3(\\x01\"");
  CHECK(audio->driver == "snd\\xff");
  auto units = build_units(s, {});
  REQUIRE(units.size() == 1);
  for (const auto& r : units[0].reasons) CHECK(r.message.find('\xc3') == std::string::npos);
}

TEST_CASE("junk entries, a driver that is not a link, a member absent from the bus") {
  Tree t;
  t.add("0000:41:00.0", "10de", "2330", "030200", "vfio-pci", 3);
  t.add("0000:43:00.0", "10de", "2330", "030200", "", 4);
  t.write("sys/bus/pci/devices/garbage", "x");
  t.write("sys/kernel/iommu_groups/3/devices/not-an-address", "x");
  fs::create_directories(t.root() / "sys/kernel/iommu_groups/3/devices");
  fs::create_directory_symlink("../../../../devices/pci0000:00/0000:41:00.7",
                               t.root() / "sys/kernel/iommu_groups/3/devices/0000:41:00.7");
  t.write(t.dev("0000:43:00.0") / "driver", "not a link");
  HostSnapshot s = t.read();
  CHECK(warned(s, "ignoring \"garbage\""));
  CHECK(warned(s, "ignoring \"not-an-address\""));
  auto units = build_units(s, {});
  REQUIRE(units.size() == 2);
  CHECK(units[0].reasons.at(0).code == "foreign-device");  // 41:00.7 is in the group but not on the bus
  CHECK(units[1].cls == UnitClass::none);
  CHECK(units[1].reasons.at(0).code == "mixed-drivers");
}

TEST_CASE("a tree without sys is an empty host, with a warning") {
  char tmpl[] = "/tmp/gpunode-empty-XXXXXX";
  fs::path root = ::mkdtemp(tmpl);
  HostSnapshot s = SysfsReader(root, {}, nullptr).read();
  CHECK(s.devices.empty());
  CHECK(warned(s, "cannot list"));
  fs::remove_all(root);
}

TEST_CASE("the ACS override and a gpu's type-0 neighbour that is not a bridge") {
  Tree t;
  t.write("proc/cmdline", "ro pcie_acs_override=downstream,multifunction quiet\n");
  t.add("0000:41:00.0", "10de", "2330", "030200", "vfio-pci", 3);
  t.add("0000:41:00.2", "1234", "0001", "ff0000", "", 3);
  HostSnapshot s = t.read();
  CHECK(s.acs_override);
  const DeviceRecord* other = find(s, "0000:41:00.2");
  REQUIRE(other);
  CHECK(other->header_type == 0);
}

TEST_CASE("rescans see changes") {
  Tree t;
  t.add("0000:41:00.0", "10de", "2330", "030200", "vfio-pci", 3);
  SysfsReader reader(t.root(), {}, nullptr);
  CHECK(reader.read().devices.size() == 1);
  t.add("0000:42:00.0", "10de", "2330", "030200", "nvidia", 4);
  CHECK(reader.read().devices.size() == 2);
}

TEST_CASE("the fingerprint moves with the functions, their drivers and their groups, and only with them") {
  Tree t;
  t.add("0000:41:00.0", "10de", "2330", "030200", "vfio-pci", 3);
  SysfsReader reader(t.root(), {}, nullptr);
  const auto first = reader.fingerprint();
  REQUIRE(first);
  CHECK(first->find("0000:41:00.0 ") != std::string::npos);
  CHECK(reader.fingerprint() == first);

  t.write(t.dev("0000:41:00.0") / "numa_node", "1\n");  // not what a uevent announces: unchanged
  CHECK(reader.fingerprint() == first);

  fs::remove(t.dev("0000:41:00.0") / "driver");  // unbound
  const auto unbound = reader.fingerprint();
  CHECK(unbound != first);
  fs::create_directories(t.root() / "sys/bus/pci/drivers/nvidia");
  fs::create_directory_symlink(fs::relative(t.root() / "sys/bus/pci/drivers/nvidia", t.dev("0000:41:00.0")),
                               t.dev("0000:41:00.0") / "driver");  // bound to another driver
  const auto rebound = reader.fingerprint();
  CHECK(rebound != unbound);
  CHECK(rebound != first);

  fs::remove(t.dev("0000:41:00.0") / "iommu_group");
  const auto groupless = reader.fingerprint();
  CHECK(groupless != rebound);

  t.add("0000:42:00.0", "10de", "2330", "030200", "vfio-pci", 4);  // a function comes
  const auto two = reader.fingerprint();
  CHECK(two != groupless);
  CHECK(two->find("0000:42:00.0 ") != std::string::npos);
  fs::remove(t.root() / "sys/bus/pci/devices/0000:42:00.0");  // and goes
  CHECK(reader.fingerprint() == groupless);

  fs::remove_all(t.root() / "sys/bus/pci/devices");
  CHECK_FALSE(reader.fingerprint());  // nothing to compare: the caller reads the host in full
}

namespace {
// The function at `a` removed (its directory, its bus link, its group's link), as the kernel does.
void remove_function(Tree& t, const std::string& a, int group) {
  fs::remove_all(t.dev(a));
  fs::remove(t.root() / "sys/bus/pci/devices" / a);
  if (group >= 0) fs::remove(t.root() / "sys/kernel/iommu_groups" / std::to_string(group) / "devices" / a);
}
std::optional<std::string> fresh_fingerprint(const Tree& t) {
  return SysfsReader(t.root(), {}, nullptr).fingerprint();
}
}  // namespace

TEST_CASE("the fingerprint through the directories it holds: a function removed and added back is seen") {
  Tree t;
  t.add("0000:41:00.0", "10de", "2330", "030200", "vfio-pci", 3);
  SysfsReader reader(t.root(), {}, nullptr);
  const auto before = reader.fingerprint();
  REQUIRE(before);
  CHECK(reader.fingerprint() == before);  // through the directories it holds now
  // Back at the same address, bound to another driver: the directory held is the removed one's.
  remove_function(t, "0000:41:00.0", 3);
  t.add("0000:41:00.0", "10de", "2330", "030200", "nvidia", 3);
  const auto after = reader.fingerprint();
  CHECK(after != before);
  CHECK(after == fresh_fingerprint(t));
  CHECK(after->find("drivers/nvidia") != std::string::npos);

  SUBCASE("unbound and groupless before: the same as a dead directory reads, seen at the next fresh look") {
    remove_function(t, "0000:41:00.0", 3);
    t.add("0000:41:00.0", "10de", "2330", "030200", "", -1);
    const auto unbound = reader.fingerprint();
    REQUIRE(unbound == fresh_fingerprint(t));
    remove_function(t, "0000:41:00.0", -1);
    t.add("0000:41:00.0", "10de", "2330", "030200", "vfio-pci", 3);
    unsigned calls = 1;
    auto seen = reader.fingerprint();
    for (; seen == unbound && calls < SysfsReader::kFingerprintFreshEvery; ++calls)
      seen = reader.fingerprint();
    CHECK(seen == fresh_fingerprint(t));
    CHECK(calls <= SysfsReader::kFingerprintFreshEvery);
  }
}

TEST_CASE("the fingerprint of more functions than it holds directories for reads as a fresh one does") {
  Tree t;
  for (int i = 0; i < 80; ++i)
    t.add(fmt::format("0000:{:02x}:00.0", 0x10 + i), "10de", "2330", "030200", i % 2 == 0 ? "vfio-pci" : "",
          i);
  SysfsReader reader(t.root(), {}, nullptr);
  const auto first = reader.fingerprint();
  REQUIRE(first);
  CHECK(std::count(first->begin(), first->end(), '\n') == 80);
  CHECK(reader.fingerprint() == first);
  CHECK(first == fresh_fingerprint(t));
  REQUIRE(fs::remove(t.dev("0000:5e:00.0") / "driver"));  // past those held: read through the bus link
  CHECK(reader.fingerprint() == fresh_fingerprint(t));
  CHECK(reader.fingerprint() != first);
}
