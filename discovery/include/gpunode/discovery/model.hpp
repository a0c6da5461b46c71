// gpunode/discovery/model.hpp: plain data of discovery (CONTRACT §3). No I/O here.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpunode::discovery {

// A PCI function address, DDDD:BB:SS.F.
struct PciAddress {
  std::uint32_t domain = 0;
  std::uint8_t bus = 0;
  std::uint8_t slot = 0;
  std::uint8_t function = 0;

  // Strict: exactly "dddd:bb:ss.f" in hex (any case), slot <= 0x1f, function <= 7.
  static std::optional<PciAddress> parse(std::string_view text);
  [[nodiscard]] std::string to_string() const;  // "0000:41:00.0", lower case
  [[nodiscard]] bool same_slot(const PciAddress& other) const {
    return domain == other.domain && bus == other.bus && slot == other.slot;
  }
  auto operator<=>(const PciAddress&) const = default;
};

// A file of one device that could not be read or made sense of.
struct Fault {
  std::string attribute;  // "class", "boot_vga", "driver", ...
  std::string message;    // what went wrong, for logs and reason messages
};

// What the host says about one PCI function. Facts that were not read are nullopt; facts that
// could not be read are nullopt *and* have a Fault. Only devices that can matter to a unit (GPU
// candidates and the members of their groups) carry the deeper facts.
struct DeviceRecord {
  PciAddress address;
  std::optional<std::uint16_t> vendor_id;
  std::optional<std::uint16_t> device_id;
  std::optional<std::uint32_t> class_code;  // 24 bits, as in the `class` file
  std::optional<std::uint8_t> header_type;  // low 7 bits of config byte 0x0e; read only where it matters
  std::optional<std::string> driver;        // nullopt: no driver bound (or unknown, see driver_known)
  bool driver_known = true;                 // false: the `driver` link exists but cannot be read
  std::optional<int> numa_node;             // nullopt: no NUMA affinity (-1) or unreadable
  std::optional<bool> boot_vga = false;     // nullopt: the file exists but cannot be read
  std::optional<int> sriov_numvfs = 0;      // nullopt: the file exists but cannot be read
  bool is_virtual_function = false;         // has a `physfn` link
  bool mdev_parent = false;                 // has `mdev_supported_types`
  std::vector<PciAddress> consumers;        // from `consumer:pci:*` device links
  std::optional<int> iommu_group;           // nullopt: in no group
  std::optional<std::string> name;          // pci.ids device name (looked up for GPUs only)
  std::vector<Fault> faults;

  [[nodiscard]] const Fault* fault(std::string_view attribute) const;
};

// A whole host as read at one moment.
struct HostSnapshot {
  bool iommu_groups_present = false;  // /sys/kernel/iommu_groups holds at least one group
  bool acs_override = false;          // pcie_acs_override on /proc/cmdline
  std::vector<DeviceRecord> devices;  // sorted by address, unique
  std::vector<std::string> warnings;  // things the reader could not make sense of, for the log
};

enum class Role { gpu, companion, bridge, nvswitch, foreign };
enum class UnitClass { vfio_group, device_request, none };

std::string_view to_string(Role role);
std::string_view to_string(UnitClass cls);
std::optional<UnitClass> parse_unit_class(std::string_view text);

// What the config says about selling: CONTRACT §2 `discovery` and `node.unsellable_units`.
struct Policy {
  std::vector<std::uint16_t> gpu_vendors{0x10de, 0x1002};
  std::vector<UnitClass> reservable_classes{UnitClass::vfio_group, UnitClass::device_request};
  std::vector<std::string> unsellable;  // unit ids ("u-0000-41-00-0") or GPU PCI addresses
};

struct Reason {
  std::string code;     // CONTRACT §3 reason code
  std::string message;  // for people: which member, which file, what value
};

struct UnitDevice {
  DeviceRecord device;
  Role role = Role::foreign;
};

// CONTRACT §13: a unit's health as the agent judged it. Discovery only carries it (the judge is
// gpunode::health, the state the service's); a unit nobody judged is ok with no reasons.
enum class HealthState { ok, warning, failing };
std::string_view to_string(HealthState state);

struct HealthReason {
  std::string code;         // pcie-fatal-error, ..., aer-not-monitored
  std::string pci_address;  // the function it was seen on: a member, or a member's upstream port
  std::string detail;       // what was seen when it first applied (names the device and the counts)
  std::string since;        // RFC 3339 UTC: when it first applied
  bool failing = false;     // a failing code not turned into a warning by health.ignore
  bool operator==(const HealthReason&) const = default;
};

struct UnitHealth {
  std::vector<HealthReason> reasons;  // sorted by code, then address
  [[nodiscard]] HealthState state() const;
  bool operator==(const UnitHealth&) const = default;
};

struct Unit {
  std::string id;                  // u-DDDD-BB-SS-F of the lowest gpu address
  std::optional<int> iommu_group;  // nullopt without IOMMU groups
  UnitClass cls = UnitClass::none;
  std::vector<UnitDevice> devices;  // every member, sorted by address
  std::vector<int> numa_nodes;      // sorted, unique, of the gpus
  std::vector<Reason> reasons;      // empty exactly when reservable (health's failing codes included)
  bool sellable = false;
  bool reservable = false;
  UnitHealth health;  // set by discovery::apply_health (rules.hpp)

  [[nodiscard]] int gpu_count() const;
};

}  // namespace gpunode::discovery
