// gpunode/discovery/rules.hpp: how a host's devices become units (CONTRACT §3). Pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/discovery/model.hpp"

namespace gpunode::discovery {

// Device classes that make a GPU (0x0300, 0x0302, 0x0380, 0x1200), from the 24-bit class code.
bool is_gpu_class(std::uint32_t class_code);

// Could this device be a GPU? Used by the reader to decide which devices deserve a deeper look.
bool is_gpu_candidate(const DeviceRecord& device, const Policy& policy);

// The role of `device` among `members` (the devices of its IOMMU group, or its slot without
// IOMMU). `device` must be one of `members`.
Role role_of(const DeviceRecord& device, const std::vector<const DeviceRecord*>& members,
             const Policy& policy);

// "u-0000-41-00-0" for 0000:41:00.0.
std::string unit_id_for(const PciAddress& gpu);

// Every unit of the host, sorted by id, with class, reasons, sellable and reservable decided.
std::vector<Unit> build_units(const HostSnapshot& host, const Policy& policy);

// CONTRACT §13's failing codes, in the order notReservableReasons lists them (after §3's own).
inline constexpr std::array<std::string_view, 4> kHealthFailingCodes = {
    "pcie-fatal-error", "pcie-uncorrectable-errors", "device-unresponsive", "link-degraded"};
bool is_health_code(std::string_view code);

// Gives `unit` its judged health: the failing reasons (those of `health` marked failing) replace
// the health codes among its reasons, one entry per code with each device's address and detail
// joined ("0000:41:00.0: fatal PCIe errors rose from 0 to 1 (aer_dev_fatal)"), and sellable
// and reservable follow (CONTRACT §3 with §13's codes added). Idempotent.
void apply_health(Unit& unit, UnitHealth health);

}  // namespace gpunode::discovery
