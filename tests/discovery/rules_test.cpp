// The discovery rules (CONTRACT §3) as tables of cases over plain device records.
#include "gpunode/discovery/rules.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <set>

using namespace gpunode::discovery;

namespace {

PciAddress addr(std::string_view text) {
  auto a = PciAddress::parse(text);
  REQUIRE_MESSAGE(a.has_value(), text);
  return *a;
}

// A device in a group; driver "" means no driver.
DeviceRecord dev(std::string_view address, std::uint16_t vendor, std::uint32_t cls, std::string driver,
                 std::optional<int> group, int numa = 0) {
  DeviceRecord d;
  d.address = addr(address);
  d.vendor_id = vendor;
  d.device_id = 0x1234;
  d.class_code = cls;
  if (!driver.empty()) d.driver = driver;
  d.iommu_group = group;
  if (numa >= 0) d.numa_node = numa;
  return d;
}

DeviceRecord gpu(std::string_view address, std::string driver, std::optional<int> group, int numa = 0) {
  return dev(address, 0x10de, 0x030200, std::move(driver), group, numa);
}

std::string fmt_addr(std::size_t i) {
  return i == 0 ? "0000:10:00.0" : "0000:11:00.0";
}

HostSnapshot host(std::vector<DeviceRecord> devices, bool iommu = true) {
  HostSnapshot h;
  h.iommu_groups_present = iommu;
  std::sort(devices.begin(), devices.end(), [](auto& a, auto& b) { return a.address < b.address; });
  h.devices = std::move(devices);
  return h;
}

std::set<std::string> codes(const Unit& u) {
  std::set<std::string> out;
  for (const auto& r : u.reasons) out.insert(r.code);
  return out;
}

Unit only(std::vector<Unit> units) {
  REQUIRE(units.size() == 1);
  return units.front();
}

Role role_in(const Unit& u, std::string_view address) {
  for (const auto& m : u.devices) {
    if (m.device.address == addr(address)) return m.role;
  }
  FAIL("no member ", address);
  return Role::foreign;
}

}  // namespace

TEST_CASE("gpu classes and vendors") {
  struct Case {
    std::uint16_t vendor;
    std::uint32_t cls;
    bool gpu;
  } cases[] = {
      {0x10de, 0x030000, true},  {0x10de, 0x030200, true},  {0x1002, 0x038000, true},
      {0x1002, 0x120000, true},  {0x10de, 0x040300, false}, {0x8086, 0x030000, false},
      {0x1a03, 0x030000, false}, {0x10de, 0x068000, false}, {0x10de, 0x030100, false},
  };
  Policy policy;
  for (const auto& c : cases) {
    DeviceRecord d = dev("0000:01:00.0", c.vendor, c.cls, "", 1);
    CAPTURE(c.vendor);
    CAPTURE(c.cls);
    CHECK(is_gpu_candidate(d, policy) == c.gpu);
  }
}

TEST_CASE("unit ids come from the lowest gpu address, never the group number") {
  CHECK(unit_id_for(addr("0000:41:00.0")) == "u-0000-41-00-0");
  CHECK(unit_id_for(addr("000a:c1:1f.7")) == "u-000a-c1-1f-7");
  auto units =
      build_units(host({gpu("0000:b4:00.0", "vfio-pci", 9), gpu("0000:a3:00.0", "vfio-pci", 9)}), {});
  const Unit& u = only(units);
  CHECK(u.id == "u-0000-a3-00-0");
  CHECK(u.iommu_group == 9);
  CHECK(u.gpu_count() == 2);
}

TEST_CASE("roles within a group") {
  auto g = gpu("0000:41:00.0", "vfio-pci", 5);
  g.consumers.push_back(addr("0000:42:00.0"));
  auto units = build_units(host({g, dev("0000:41:00.1", 0x10de, 0x040300, "vfio-pci", 5),  // audio, same slot
                                 dev("0000:41:00.2", 0x10de, 0x0c0330, "vfio-pci", 5),     // USB
                                 dev("0000:41:00.3", 0x10de, 0x0c8000, "vfio-pci", 5),     // UCSI
                                 dev("0000:42:00.0", 0x10de, 0x0c0500, "vfio-pci", 5),     // consumer link
                                 dev("0000:40:00.0", 0x10b5, 0x060400, "pcieport", 5),     // bridge
                                 dev("0000:43:00.0", 0x10de, 0x068000, "vfio-pci", 5),     // NVSwitch
                                 dev("0000:44:00.0", 0x15b3, 0x020000, "mlx5_core", 5)}),  // NIC
                           {});
  const Unit& u = only(units);
  CHECK(role_in(u, "0000:41:00.0") == Role::gpu);
  CHECK(role_in(u, "0000:41:00.1") == Role::companion);
  CHECK(role_in(u, "0000:41:00.2") == Role::companion);
  CHECK(role_in(u, "0000:41:00.3") == Role::companion);
  CHECK(role_in(u, "0000:42:00.0") == Role::companion);
  CHECK(role_in(u, "0000:40:00.0") == Role::bridge);
  CHECK(role_in(u, "0000:43:00.0") == Role::nvswitch);
  CHECK(role_in(u, "0000:44:00.0") == Role::foreign);
  CHECK(codes(u) == std::set<std::string>{"foreign-device"});
  CHECK(u.cls == UnitClass::vfio_group);
  CHECK(u.devices.front().device.address == addr("0000:40:00.0"));  // sorted by address
}

TEST_CASE("a same-slot function of another class is foreign; a type-1 header makes a bridge") {
  auto other = dev("0000:41:00.1", 0x10de, 0x0c0500, "vfio-pci", 5);  // SMBus, not a companion class
  auto typed_bridge = dev("0000:40:00.0", 0x1234, 0x068000, "", 5);
  typed_bridge.header_type = 1;
  auto units = build_units(host({gpu("0000:41:00.0", "vfio-pci", 5), other, typed_bridge}), {});
  const Unit& u = only(units);
  CHECK(role_in(u, "0000:41:00.1") == Role::foreign);
  CHECK(role_in(u, "0000:40:00.0") == Role::bridge);
}

TEST_CASE("every bridge class is a bridge: AMD's dummy host bridge in a GPU's group is not foreign") {
  // CONTRACT §3: class 0x06xx other than an NVSwitch, or a header type other than 0. A Milan or
  // Genoa host puts a driverless "PCIe Dummy Host Bridge" (1022:1482, class 0x0600, header type 0)
  // in the IOMMU group of the root port a GPU hangs off (kata-containers issue 6663).
  struct Case {
    const char* name;
    std::uint16_t vendor;
    std::uint32_t cls;
    std::string driver;
    Role role;
  } cases[] = {
      {"AMD dummy host bridge 0x0600, no driver", 0x1022, 0x060000, "", Role::bridge},
      {"AMD root port 0x0604 on pcieport", 0x1022, 0x060400, "pcieport", Role::bridge},
      {"ISA bridge 0x0601", 0x8086, 0x060100, "", Role::bridge},
      {"other bridge 0x0680 of another vendor", 0x1022, 0x068000, "", Role::bridge},
      {"PCI-to-PCI subtractive 0x0604 01", 0x8086, 0x060401, "", Role::bridge},
      {"NVSwitch 10de 0x0680", 0x10de, 0x068000, "", Role::nvswitch},
      {"a NIC 0x0200", 0x15b3, 0x020000, "mlx5_core", Role::foreign},
      {"an NVMe drive 0x0108", 0x144d, 0x010802, "nvme", Role::foreign},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    auto other = dev("0000:40:00.3", c.vendor, c.cls, c.driver, 4);
    other.header_type = 0;
    const Unit u = only(build_units(host({gpu("0000:41:00.0", "vfio-pci", 4), other}), {}));
    CHECK(role_in(u, "0000:40:00.3") == c.role);
    CHECK(u.cls == UnitClass::vfio_group);
    CHECK(u.reservable == (c.role != Role::foreign));
    CHECK(codes(u) ==
          (c.role == Role::foreign ? std::set<std::string>{"foreign-device"} : std::set<std::string>{}));
  }
}

TEST_CASE("a virtual function is never a gpu of its own") {
  auto vf = gpu("0000:41:00.4", "vfio-pci", 7);
  vf.is_virtual_function = true;
  CHECK(build_units(host({vf}), {}).empty());
}

TEST_CASE("class and reasons from drivers") {
  struct Case {
    const char* name;
    std::vector<std::string> gpu_drivers;
    std::vector<std::string> companion_drivers;
    UnitClass cls;
    std::set<std::string> reasons;
  } cases[] = {
      {"vfio gpu", {"vfio-pci"}, {}, UnitClass::vfio_group, {}},
      {"vfio variant", {"nvgrace_gpu_vfio_pci"}, {}, UnitClass::vfio_group, {}},
      {"vfio gpu, stub and unbound companions", {"vfio-pci"}, {"pci-stub", ""}, UnitClass::vfio_group, {}},
      {"vfio pair with one unbound gpu", {"vfio-pci", ""}, {}, UnitClass::vfio_group, {"driver-unbound"}},
      {"nvidia", {"nvidia"}, {"snd_hda_intel"}, UnitClass::device_request, {}},
      {"amdgpu pair", {"amdgpu", "amdgpu"}, {}, UnitClass::device_request, {}},
      {"vfio gpu, audio on host driver",
       {"vfio-pci"},
       {"snd_hda_intel"},
       UnitClass::none,
       {"mixed-drivers", "class-not-reservable"}},
      {"gpus disagree",
       {"vfio-pci", "nvidia"},
       {},
       UnitClass::none,
       {"mixed-drivers", "class-not-reservable"}},
      {"unbound gpu", {""}, {}, UnitClass::none, {"driver-unbound", "class-not-reservable"}},
      // pci-stub is a driver, and a gpu parked on it is passed through as it is (libvirt's managed
      // hostdevs rebind it to vfio-pci at start): vfio-group, as vfio-pci would be.
      {"pci-stub gpu", {"pci-stub"}, {}, UnitClass::vfio_group, {}},
      {"pci-stub pair", {"pci-stub", "pci-stub"}, {}, UnitClass::vfio_group, {}},
      {"pci-stub gpu, stub and unbound companions",
       {"pci-stub"},
       {"pci-stub", ""},
       UnitClass::vfio_group,
       {}},
      {"vfio and pci-stub gpus", {"vfio-pci", "pci-stub"}, {}, UnitClass::vfio_group, {}},
      {"pci-stub pair with one unbound gpu", {"pci-stub", ""}, {}, UnitClass::vfio_group, {"driver-unbound"}},
      {"pci-stub gpu, audio on host driver",
       {"pci-stub"},
       {"snd_hda_intel"},
       UnitClass::none,
       {"mixed-drivers", "class-not-reservable"}},
      {"pci-stub and nvidia gpus",
       {"pci-stub", "nvidia"},
       {},
       UnitClass::none,
       {"mixed-drivers", "class-not-reservable"}},
      {"nouveau", {"nouveau"}, {}, UnitClass::none, {"mixed-drivers", "class-not-reservable"}},
      {"nvidia and unbound", {"nvidia", ""}, {}, UnitClass::none, {"driver-unbound", "class-not-reservable"}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    std::vector<DeviceRecord> devices;
    for (std::size_t i = 0; i < c.gpu_drivers.size(); ++i) {
      devices.push_back(gpu(fmt_addr(i), c.gpu_drivers[i], 3));
    }
    for (std::size_t i = 0; i < c.companion_drivers.size(); ++i) {
      auto comp = dev("0000:10:00.0", 0x10de, 0x040300, c.companion_drivers[i], 3);
      comp.address.function = static_cast<std::uint8_t>(i + 1);
      devices.push_back(comp);
    }
    const Unit& u = only(build_units(host(devices), {}));
    CHECK(u.cls == c.cls);
    CHECK(codes(u) == c.reasons);
    CHECK(u.reservable == c.reasons.empty());
  }
}

TEST_CASE("reasons other than drivers") {
  SUBCASE("boot display on any member, or unreadable boot_vga") {
    auto g = gpu("0000:41:00.0", "vfio-pci", 2);
    g.boot_vga = true;
    CHECK(codes(only(build_units(host({g}), {}))) == std::set<std::string>{"host-boot-display"});
    g.boot_vga = std::nullopt;
    g.faults.push_back({"boot_vga", "unparsable value \"x\""});
    const Unit& u = only(build_units(host({g}), {}));
    CHECK(codes(u) == std::set<std::string>{"host-boot-display"});
    CHECK(u.reasons.front().message.find("unparsable") != std::string::npos);
  }
  SUBCASE("sr-iov enabled, or unreadable") {
    auto g = gpu("0000:41:00.0", "vfio-pci", 2);
    g.sriov_numvfs = 4;
    CHECK(codes(only(build_units(host({g}), {}))) == std::set<std::string>{"sriov-enabled"});
    g.sriov_numvfs = std::nullopt;
    CHECK(codes(only(build_units(host({g}), {}))) == std::set<std::string>{"sriov-enabled"});
    g.sriov_numvfs = 0;
    CHECK(codes(only(build_units(host({g}), {}))).empty());
  }
  SUBCASE("vgpu parent") {
    auto g = gpu("0000:41:00.0", "nvidia", 2);
    g.mdev_parent = true;
    CHECK(codes(only(build_units(host({g}), {}))) == std::set<std::string>{"vgpu-parent"});
  }
  SUBCASE("acs override marks every unit") {
    auto h = host({gpu("0000:41:00.0", "vfio-pci", 2), gpu("0000:42:00.0", "nvidia", 3)});
    h.acs_override = true;
    auto units = build_units(h, {});
    REQUIRE(units.size() == 2);
    for (const auto& u : units) {
      CHECK(codes(u) == std::set<std::string>{"acs-override"});
      CHECK_FALSE(u.sellable);
    }
  }
  SUBCASE("a member that cannot be identified is foreign") {
    DeviceRecord ghost;
    ghost.address = addr("0000:41:00.1");
    ghost.iommu_group = 2;
    ghost.faults.push_back({"class", "No such file or directory"});
    const Unit& u = only(build_units(host({gpu("0000:41:00.0", "vfio-pci", 2), ghost}), {}));
    CHECK(role_in(u, "0000:41:00.1") == Role::foreign);
    CHECK(codes(u) == std::set<std::string>{"foreign-device"});
    CHECK(u.reasons.front().message.find("No such file") != std::string::npos);
  }
  SUBCASE("an unreadable driver link") {
    auto g = gpu("0000:41:00.0", "", 2);
    g.driver_known = false;
    const Unit& u = only(build_units(host({g}), {}));
    CHECK(u.cls == UnitClass::none);
    CHECK(codes(u) == std::set<std::string>{"mixed-drivers", "class-not-reservable"});
  }
}

TEST_CASE("without IOMMU groups a gpu and its slot are a unit") {
  auto h = host({gpu("0000:41:00.0", "vfio-pci", std::nullopt),
                 dev("0000:41:00.1", 0x10de, 0x040300, "vfio-pci", std::nullopt),
                 dev("0000:42:00.0", 0x15b3, 0x020000, "mlx5_core", std::nullopt),
                 gpu("0000:43:00.0", "nvidia", std::nullopt, 1)},
                false);
  auto units = build_units(h, {});
  REQUIRE(units.size() == 2);
  CHECK(units[0].id == "u-0000-41-00-0");
  CHECK_FALSE(units[0].iommu_group.has_value());
  CHECK(units[0].devices.size() == 2);
  CHECK(codes(units[0]) == std::set<std::string>{"iommu-disabled"});
  CHECK(units[1].cls == UnitClass::device_request);
  CHECK(codes(units[1]).empty());
  CHECK(units[1].numa_nodes == std::vector<int>{1});
}

TEST_CASE("policy: reservable classes and unsellable units") {
  auto h = host({gpu("0000:41:00.0", "vfio-pci", 2), gpu("0000:42:00.0", "nvidia", 3),
                 gpu("0000:43:00.0", "nvidia", 4)});
  Policy policy;
  policy.reservable_classes = {UnitClass::vfio_group};
  policy.unsellable = {"u-0000-41-00-0", "0000:43:00.0"};
  auto units = build_units(h, policy);
  REQUIRE(units.size() == 3);
  CHECK(codes(units[0]) == std::set<std::string>{"not-sellable"});
  CHECK_FALSE(units[0].sellable);
  CHECK(codes(units[1]) == std::set<std::string>{"class-not-reservable"});
  CHECK(units[1].sellable);  // can still be sold on demand
  CHECK_FALSE(units[1].reservable);
  CHECK(codes(units[2]) == std::set<std::string>{"class-not-reservable", "not-sellable"});
  CHECK_FALSE(units[2].sellable);

  policy.gpu_vendors = {0x1002};  // NVIDIA devices are then not GPUs at all
  CHECK(build_units(h, policy).empty());
}

TEST_CASE("numa nodes are the gpus', sorted and unique; unknown is left out") {
  auto h = host({gpu("0000:41:00.0", "vfio-pci", 2, 1), gpu("0000:42:00.0", "vfio-pci", 2, 0),
                 gpu("0000:43:00.0", "vfio-pci", 2, 1), gpu("0000:44:00.0", "vfio-pci", 2, -1)});
  const Unit& u = only(build_units(h, {}));
  CHECK(u.numa_nodes == std::vector<int>{0, 1});
  CHECK(u.gpu_count() == 4);
}

TEST_CASE("units in several PCI domains: ids and order compare the domain first") {
  // A GB200 tray: four GPUs, one per PCI domain, the lowest bus number in the highest domain.
  auto units = build_units(host({gpu("0018:01:00.0", "vfio-pci", 40), gpu("0008:01:00.0", "vfio-pci", 10),
                                 gpu("0009:01:00.0", "vfio-pci", 20), gpu("0019:01:00.0", "vfio-pci", 50),
                                 gpu("0000:f1:00.0", "vfio-pci", 1)}),
                           {});
  REQUIRE(units.size() == 5);
  CHECK(units[0].id == "u-0000-f1-00-0");
  CHECK(units[1].id == "u-0008-01-00-0");
  CHECK(units[2].id == "u-0009-01-00-0");
  CHECK(units[3].id == "u-0018-01-00-0");
  CHECK(units[4].id == "u-0019-01-00-0");
  CHECK(units[2].iommu_group == 20);
}

TEST_CASE("units are sorted by id, not by group") {
  auto units = build_units(host({gpu("0000:a3:00.0", "vfio-pci", 7), gpu("0000:43:00.0", "vfio-pci", 31),
                                 gpu("0000:44:00.0", "vfio-pci", 18)}),
                           {});
  REQUIRE(units.size() == 3);
  CHECK(units[0].id == "u-0000-43-00-0");
  CHECK(units[1].id == "u-0000-44-00-0");
  CHECK(units[2].id == "u-0000-a3-00-0");
}
