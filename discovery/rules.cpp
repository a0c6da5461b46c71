// The discovery rules of CONTRACT §3 over plain device records. No I/O.
#include "gpunode/discovery/rules.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "gpunode/text/ascii.hpp"

namespace gpunode::discovery {
namespace {

constexpr std::uint32_t class16(std::uint32_t class_code) {
  return class_code >> 8;
}

bool is_companion_class(std::uint32_t class_code) {
  const auto c = class16(class_code);
  return c == 0x0403 || c == 0x0c03 || c == 0x0c80;  // audio, USB, UCSI
}

bool is_gpu(const DeviceRecord& d, const Policy& policy) {
  return is_gpu_candidate(d, policy) && !d.is_virtual_function;
}

// How a member's driver counts for the unit's class.
enum class DriverKind { vfio, stub, unbound, host_gpu, other, unknown };

DriverKind driver_kind(const DeviceRecord& d) {
  if (!d.driver_known) return DriverKind::unknown;
  if (!d.driver) return DriverKind::unbound;
  const std::string& name = *d.driver;
  if (name == "pci-stub") return DriverKind::stub;
  if (name.find("vfio") != std::string::npos) return DriverKind::vfio;
  if (name == "nvidia" || name == "amdgpu") return DriverKind::host_gpu;
  return DriverKind::other;
}

std::string driver_text(const DeviceRecord& d) {
  if (!d.driver_known) {
    const Fault* f = d.fault("driver");
    return f ? fmt::format("an unreadable driver ({})", f->message) : std::string("an unreadable driver");
  }
  return d.driver ? *d.driver : std::string("no driver");
}

// Collects reasons, one entry per code, in the contract's order, with the details joined.
class Reasons {
 public:
  void add(std::string_view code, std::string message) {
    details_[std::string(code)].push_back(std::move(message));
  }
  [[nodiscard]] bool has(std::string_view code) const { return details_.contains(std::string(code)); }
  [[nodiscard]] bool empty() const { return details_.empty(); }

  std::vector<Reason> take() {
    static constexpr std::string_view kOrder[] = {
        "iommu-disabled",       "driver-unbound", "mixed-drivers", "foreign-device",
        "host-boot-display",    "sriov-enabled",  "vgpu-parent",   "acs-override",
        "class-not-reservable", "not-sellable",   "absent"};
    // health's failing codes (apply_health) go after these, before `absent` in an absent unit's JSON
    std::vector<Reason> out;
    for (std::string_view code : kOrder) {
      auto it = details_.find(std::string(code));
      if (it == details_.end()) continue;
      out.push_back({std::string(code), fmt::format("{}", fmt::join(it->second, "; "))});
    }
    return out;
  }

 private:
  std::map<std::string, std::vector<std::string>> details_;
};

// The class of a unit from its members' drivers, and why it is `none` if it is.
UnitClass decide_class(const std::vector<UnitDevice>& members, Reasons& reasons) {
  std::vector<const DeviceRecord*> gpus, companions;
  for (const auto& m : members) {
    if (m.role == Role::gpu) gpus.push_back(&m.device);
    if (m.role == Role::companion) companions.push_back(&m.device);
  }
  auto kind_is = [](const DeviceRecord* d, std::initializer_list<DriverKind> kinds) {
    return std::find(kinds.begin(), kinds.end(), driver_kind(*d)) != kinds.end();
  };
  // A gpu parked on pci-stub is passed through as it is: libvirt's managed hostdevs rebind it to
  // vfio-pci when the VM starts (CONTRACT §3). So it counts toward vfio-group as vfio-pci does.
  const bool any_gpu_vfio = std::any_of(gpus.begin(), gpus.end(), [&](auto* d) {
    return kind_is(d, {DriverKind::vfio, DriverKind::stub});
  });
  const bool vfio_members_ok =
      std::all_of(gpus.begin(), gpus.end(),
                  [&](auto* d) {
                    return kind_is(d, {DriverKind::vfio, DriverKind::stub, DriverKind::unbound});
                  }) &&
      std::all_of(companions.begin(), companions.end(), [&](auto* d) {
        return kind_is(d, {DriverKind::vfio, DriverKind::stub, DriverKind::unbound});
      });
  if (any_gpu_vfio && vfio_members_ok) return UnitClass::vfio_group;
  if (std::all_of(gpus.begin(), gpus.end(), [&](auto* d) { return kind_is(d, {DriverKind::host_gpu}); })) {
    return UnitClass::device_request;
  }

  // `none`: say why (an unbound gpu is named in every class, see make_unit; pci-stub is a driver).
  for (const auto* g : gpus) {
    if (kind_is(g, {DriverKind::other, DriverKind::unknown})) {
      reasons.add("mixed-drivers",
                  fmt::format("gpu {} is on {}, neither a VFIO driver nor a host GPU driver (nvidia, amdgpu)",
                              g->address.to_string(), driver_text(*g)));
    }
  }
  const bool any_gpu_host =
      std::any_of(gpus.begin(), gpus.end(), [&](auto* d) { return kind_is(d, {DriverKind::host_gpu}); });
  if (any_gpu_host) {
    for (const auto* g : gpus) {
      if (kind_is(g, {DriverKind::vfio, DriverKind::stub})) {
        reasons.add("mixed-drivers",
                    fmt::format("gpu {} is on {} while another gpu of the group is on a host GPU driver",
                                g->address.to_string(), driver_text(*g)));
      }
    }
  }
  if (any_gpu_vfio) {
    for (const auto* c : companions) {
      if (kind_is(c, {DriverKind::host_gpu, DriverKind::other, DriverKind::unknown})) {
        reasons.add("mixed-drivers",
                    fmt::format("gpu is on a VFIO driver or pci-stub but its companion {} is on {}",
                                c->address.to_string(), driver_text(*c)));
      }
    }
  }
  const bool any_gpu_unbound =
      std::any_of(gpus.begin(), gpus.end(), [&](auto* d) { return kind_is(d, {DriverKind::unbound}); });
  if (!any_gpu_unbound && !reasons.has("driver-unbound") && !reasons.has("mixed-drivers")) {
    reasons.add("mixed-drivers", "the members' drivers do not agree on one class");
  }
  return UnitClass::none;
}

bool contains(const std::vector<std::string>& list, const std::string& value) {
  return std::find(list.begin(), list.end(), value) != list.end();
}

std::string normalized(std::string_view s) {
  return text::ascii_lower(s);
}

// The unit's members with their roles, by address.
std::vector<UnitDevice> members_with_roles(const std::vector<const DeviceRecord*>& members,
                                           const Policy& policy) {
  std::vector<UnitDevice> devices;
  for (const auto* d : members) devices.push_back({*d, role_of(*d, members, policy)});
  std::sort(devices.begin(), devices.end(),
            [](const UnitDevice& a, const UnitDevice& b) { return a.device.address < b.device.address; });
  return devices;
}

std::vector<const DeviceRecord*> gpus_of(const std::vector<UnitDevice>& devices) {
  std::vector<const DeviceRecord*> gpus;
  for (const auto& m : devices) {
    if (m.role == Role::gpu) gpus.push_back(&m.device);
  }
  return gpus;
}

std::vector<int> numa_nodes_of(const std::vector<const DeviceRecord*>& gpus) {
  std::set<int> numa;
  for (const auto* g : gpus) {
    if (g->numa_node) numa.insert(*g->numa_node);
  }
  return {numa.begin(), numa.end()};
}

// driver-unbound and iommu-disabled: what the gpus' drivers say whatever the unit's class.
void add_driver_reasons(const std::vector<const DeviceRecord*>& gpus, std::optional<int> group,
                        const HostSnapshot& host, Reasons& reasons) {
  // A gpu without a driver cannot be handed to a VM or a pod, whatever the unit's class: a
  // vfio-group pair with one unbound gpu could not be sold whole.
  for (const auto* g : gpus) {
    if (driver_kind(*g) == DriverKind::unbound) {
      reasons.add("driver-unbound", fmt::format("gpu {} has no driver", g->address.to_string()));
    }
  }

  for (const auto* g : gpus) {
    if (driver_kind(*g) == DriverKind::vfio && !group) {
      reasons.add(
          "iommu-disabled",
          host.iommu_groups_present
              ? fmt::format("gpu {} is on {} but is in no IOMMU group", g->address.to_string(), *g->driver)
              : fmt::format("gpu {} is on {} but the host has no IOMMU groups (IOMMU off)",
                            g->address.to_string(), *g->driver));
    }
  }
}

// Why a foreign member is named in foreign-device: what could not be read of it, or what it is.
std::string foreign_detail(const DeviceRecord& d, const std::string& addr) {
  const Fault* f = d.fault("class") ? d.fault("class") : d.fault("vendor");
  return f ? fmt::format("{} cannot be identified ({})", addr, f->message)
           : fmt::format("{} ({}:{} class {:06x}) shares the group", addr,
                         d.vendor_id ? fmt::format("{:04x}", *d.vendor_id) : "?",
                         d.device_id ? fmt::format("{:04x}", *d.device_id) : "?", d.class_code.value_or(0));
}

// foreign-device and host-boot-display: what any member may bring to the unit.
void add_member_reasons(const std::vector<UnitDevice>& devices, Reasons& reasons) {
  for (const auto& m : devices) {
    const DeviceRecord& d = m.device;
    const std::string addr = d.address.to_string();
    if (m.role == Role::foreign) reasons.add("foreign-device", foreign_detail(d, addr));
    if (!d.boot_vga.has_value()) {
      const Fault* f = d.fault("boot_vga");
      reasons.add("host-boot-display",
                  fmt::format("{}: boot_vga cannot be read ({}); it may be the boot display", addr,
                              f ? f->message : "unknown"));
    } else if (*d.boot_vga) {
      reasons.add("host-boot-display", fmt::format("{} is the host's boot display (boot_vga 1)", addr));
    }
  }
}

// sriov-enabled and vgpu-parent: a gpu shared out in parts cannot be handed over whole.
void add_sharing_reasons(const std::vector<const DeviceRecord*>& gpus, Reasons& reasons) {
  for (const auto* g : gpus) {
    const std::string addr = g->address.to_string();
    if (!g->sriov_numvfs.has_value()) {
      const Fault* f = g->fault("sriov_numvfs");
      reasons.add("sriov-enabled",
                  fmt::format("gpu {}: sriov_numvfs cannot be read ({})", addr, f ? f->message : "unknown"));
    } else if (*g->sriov_numvfs > 0) {
      reasons.add("sriov-enabled",
                  fmt::format("gpu {} has {} virtual functions enabled", addr, *g->sriov_numvfs));
    }
    if (g->mdev_parent)
      reasons.add("vgpu-parent", fmt::format("gpu {} is a mediated-device (vGPU) parent", addr));
  }
}

// not-sellable: the unit, or one of its gpus, is listed in node.unsellable_units.
void add_unsellable_reasons(const Unit& unit, const std::vector<const DeviceRecord*>& gpus,
                            const Policy& policy, Reasons& reasons) {
  std::vector<std::string> unsellable;
  for (const auto& u : policy.unsellable) unsellable.push_back(normalized(u));
  if (contains(unsellable, unit.id)) {
    reasons.add("not-sellable", fmt::format("{} is listed in node.unsellable_units", unit.id));
  } else {
    for (const auto* g : gpus) {
      if (contains(unsellable, g->address.to_string())) {
        reasons.add("not-sellable",
                    fmt::format("gpu {} is listed in node.unsellable_units", g->address.to_string()));
      }
    }
  }
}

// acs-override, class-not-reservable and not-sellable: what the host and the operator say.
void add_host_and_policy_reasons(const Unit& unit, const std::vector<const DeviceRecord*>& gpus,
                                 const HostSnapshot& host, const Policy& policy, Reasons& reasons) {
  if (host.acs_override) {
    reasons.add("acs-override",
                "pcie_acs_override is on the kernel command line: IOMMU groups cannot be trusted");
  }
  if (std::find(policy.reservable_classes.begin(), policy.reservable_classes.end(), unit.cls) ==
      policy.reservable_classes.end()) {
    reasons.add("class-not-reservable",
                fmt::format("class {} is not in discovery.reservable_classes", to_string(unit.cls)));
  }
  add_unsellable_reasons(unit, gpus, policy, reasons);
}

// CONTRACT §3: reservable exactly when no reason applies; sellable when none but class-not-reservable.
void decide_selling(Unit& unit) {
  unit.reservable = unit.reasons.empty();
  unit.sellable = std::all_of(unit.reasons.begin(), unit.reasons.end(),
                              [](const Reason& r) { return r.code == "class-not-reservable"; });
}

Unit make_unit(const std::vector<const DeviceRecord*>& members, std::optional<int> group,
               const HostSnapshot& host, const Policy& policy) {
  Unit unit;
  unit.iommu_group = group;
  unit.devices = members_with_roles(members, policy);
  const std::vector<const DeviceRecord*> gpus = gpus_of(unit.devices);
  unit.id = unit_id_for(gpus.front()->address);  // devices are sorted: the first gpu is the lowest
  unit.numa_nodes = numa_nodes_of(gpus);

  Reasons reasons;
  unit.cls = decide_class(unit.devices, reasons);
  add_driver_reasons(gpus, group, host, reasons);
  add_member_reasons(unit.devices, reasons);
  add_sharing_reasons(gpus, reasons);
  add_host_and_policy_reasons(unit, gpus, host, policy, reasons);

  unit.reasons = reasons.take();
  decide_selling(unit);
  return unit;
}

}  // namespace

bool is_health_code(std::string_view code) {
  return std::find(kHealthFailingCodes.begin(), kHealthFailingCodes.end(), code) != kHealthFailingCodes.end();
}

void apply_health(Unit& unit, UnitHealth health) {
  std::erase_if(unit.reasons, [](const Reason& r) { return is_health_code(r.code); });
  for (std::string_view code : kHealthFailingCodes) {
    std::vector<std::string> details;
    for (const auto& h : health.reasons) {
      if (h.failing && h.code == code) details.push_back(fmt::format("{}: {}", h.pci_address, h.detail));
    }
    if (!details.empty())
      unit.reasons.push_back({std::string(code), fmt::format("{}", fmt::join(details, "; "))});
  }
  unit.health = std::move(health);
  decide_selling(unit);
}

bool is_gpu_class(std::uint32_t class_code) {
  const auto c = class16(class_code);
  return c == 0x0300 || c == 0x0302 || c == 0x0380 || c == 0x1200;
}

bool is_gpu_candidate(const DeviceRecord& device, const Policy& policy) {
  if (!device.vendor_id || !device.class_code || !is_gpu_class(*device.class_code)) return false;
  return std::find(policy.gpu_vendors.begin(), policy.gpu_vendors.end(), *device.vendor_id) !=
         policy.gpu_vendors.end();
}

Role role_of(const DeviceRecord& device, const std::vector<const DeviceRecord*>& members,
             const Policy& policy) {
  if (is_gpu(device, policy)) return Role::gpu;
  if (!device.vendor_id || !device.class_code) return Role::foreign;  // cannot be identified
  const auto c = class16(*device.class_code);
  if (*device.vendor_id == 0x10de && c == 0x0680) return Role::nvswitch;
  // Every bridge class (0x06xx: host, ISA, PCI-to-PCI, other): AMD platforms put a driverless
  // "PCIe Dummy Host Bridge" (class 0x0600, e.g. 1022:1482) in the group of a GPU's root port.
  if ((c >> 8) == 0x06) return Role::bridge;
  for (const auto* m : members) {
    if (m == &device || !is_gpu(*m, policy)) continue;
    if (m->address.same_slot(device.address) && is_companion_class(*device.class_code))
      return Role::companion;
    if (std::find(m->consumers.begin(), m->consumers.end(), device.address) != m->consumers.end()) {
      return Role::companion;
    }
  }
  if (device.header_type && *device.header_type != 0) return Role::bridge;
  return Role::foreign;
}

std::string unit_id_for(const PciAddress& gpu) {
  return fmt::format("u-{:04x}-{:02x}-{:02x}-{:x}", gpu.domain, gpu.bus, gpu.slot, gpu.function);
}

std::vector<Unit> build_units(const HostSnapshot& host, const Policy& policy) {
  std::vector<Unit> units;
  // Members of each unit: the IOMMU group, or (without one) the slot.
  std::map<int, std::vector<const DeviceRecord*>> groups;
  using SlotKey = std::tuple<std::uint32_t, std::uint8_t, std::uint8_t>;
  std::map<SlotKey, std::vector<const DeviceRecord*>> slots;  // devices without a group
  for (const auto& d : host.devices) {
    if (d.iommu_group) {
      groups[*d.iommu_group].push_back(&d);
    } else {
      slots[{d.address.domain, d.address.bus, d.address.slot}].push_back(&d);
    }
  }
  auto has_gpu = [&](const std::vector<const DeviceRecord*>& members) {
    return std::any_of(members.begin(), members.end(), [&](auto* d) { return is_gpu(*d, policy); });
  };
  for (const auto& [group, members] : groups) {
    if (has_gpu(members)) units.push_back(make_unit(members, group, host, policy));
  }
  for (const auto& [slot, members] : slots) {
    if (has_gpu(members)) units.push_back(make_unit(members, std::nullopt, host, policy));
  }
  // By id: its text orders as the address it names, domain first (PciAddress takes four hex
  // digits of domain, so every id has the same width up to the bus).
  std::sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) { return a.id < b.id; });
  return units;
}

}  // namespace gpunode::discovery
