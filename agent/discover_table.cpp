#include "discover_table.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace gpunode::agent {

std::string discover_table(const std::string& node_id, const std::string& host_root,
                           const discovery::HostSnapshot& snapshot,
                           const std::vector<discovery::Unit>& units) {
  using discovery::Role;
  std::string out = fmt::format("node {} (host root {}): {} unit(s), IOMMU groups {}{}\n\n", node_id,
                                host_root, units.size(), snapshot.iommu_groups_present ? "on" : "OFF",
                                snapshot.acs_override ? ", ACS override ON" : "");
  if (units.empty()) {
    out += "no GPU units found\n";
    return out;
  }
  out += fmt::format("{:<16} {:>5} {:<14} {:>4} {:<6} {:<10} {}\n", "UNIT", "GROUP", "CLASS", "GPUS", "NUMA",
                     "RESERVABLE", "GPUS / WHY NOT");
  int reservable = 0;
  for (const auto& u : units) {
    reservable += u.reservable ? 1 : 0;
    std::vector<std::string> models;
    for (const auto& m : u.devices) {
      if (m.role != Role::gpu) continue;
      const auto& d = m.device;
      models.push_back(fmt::format("{} {} [{}]", d.address.to_string(), d.name.value_or("unknown model"),
                                   d.driver.value_or("no driver")));
    }
    std::string numa = u.numa_nodes.empty() ? "-" : fmt::format("{}", fmt::join(u.numa_nodes, ","));
    std::string group = u.iommu_group ? std::to_string(*u.iommu_group) : "-";
    out += fmt::format("{:<16} {:>5} {:<14} {:>4} {:<6} {:<10} {}\n", u.id, group,
                       discovery::to_string(u.cls), u.gpu_count(), numa,
                       u.reservable ? "yes" : (u.sellable ? "no (sell)" : "no"), fmt::join(models, ", "));
    for (const auto& r : u.reasons) out += fmt::format("{:<61}  - {}: {}\n", "", r.code, r.message);
  }
  out += fmt::format("\n{} of {} unit(s) reservable\n", reservable, units.size());
  return out;
}

}  // namespace gpunode::agent
