// Workloads as the service tests see them (workloads_test.cpp, terminate_test.cpp,
// admission_test.cpp): domains built for the fake hypervisor, two units' ids, and readers of the
// lists the API answers.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lab.hpp"

namespace service_test {

inline gpunode::vmctl::Domain vm(std::string name, std::string uuid, std::vector<std::string> addresses,
                                 std::optional<gpunode::vmctl::WorkloadLabel> label,
                                 std::string state = "running") {
  gpunode::vmctl::Domain d;
  d.name = std::move(name);
  d.uuid = std::move(uuid);
  d.pci_addresses = std::move(addresses);
  d.label = std::move(label);
  d.state = std::move(state);
  return d;
}

using gpunode::vmctl::Tier;
using gpunode::vmctl::WorkloadLabel;
inline constexpr const char* U1 = "u-0000-41-00-0";
inline constexpr const char* U2 = "u-0000-42-00-0";

inline std::vector<std::string> names_of(const json::value& list) {
  std::vector<std::string> out;
  for (const auto& x : list.as_array()) out.emplace_back(x.at("name").as_string());
  return out;
}

// spot-a on U1 (org-b) and spot-b on U2 (org-c), both running.
inline std::vector<gpunode::vmctl::Domain> two_spot_vms() {
  return {vm("spot-a", "uuid-a", {"0000:41:00.0"}, WorkloadLabel{"vm-a", "org-b", Tier::spot}),
          vm("spot-b", "uuid-b", {"0000:42:00.0"}, WorkloadLabel{"vm-b", "org-c", Tier::spot})};
}

// A spot VM on each of U1 and U2, and a reserved VM of the audience beside the one on U2.
inline std::vector<gpunode::vmctl::Domain> spot_market_vms() {
  return {vm("spot-a", "uuid-a", {"0000:41:00.0"}, WorkloadLabel{"vm-a", "org-b", Tier::spot}),
          vm("spot-b", "uuid-b", {"0000:42:00.0"}, WorkloadLabel{"vm-b", "org-c", Tier::spot}),
          vm("od-b", "uuid-odb", {"0000:42:00.0"}, WorkloadLabel{"vm-odb", "org-aud", Tier::reserved})};
}

inline const json::object* entry(const json::value& list, const std::string& name) {
  for (const auto& x : list.as_array()) {
    if (x.at("name").as_string() == name) return &x.as_object();
  }
  return nullptr;
}

}  // namespace service_test
