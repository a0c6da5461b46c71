// gpunode/discovery/rules.hpp: how a host's devices become units (CONTRACT §3). Pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
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

}  // namespace gpunode::discovery
