// Vocabularies of workloads (CONTRACT §5, §7).
#include <array>

#include "gpunode/vmctl/vmctl.hpp"

namespace gpunode::vmctl {

std::string_view state_name(int libvirt_state) {
  // virDomainState: NOSTATE 0, RUNNING 1, BLOCKED 2, PAUSED 3, SHUTDOWN 4, SHUTOFF 5, CRASHED 6,
  // PMSUSPENDED 7.
  static constexpr std::array<std::string_view, 8> names{"nostate",  "running", "blocked", "paused",
                                                         "shutdown", "shutoff", "crashed", "pmsuspended"};
  if (libvirt_state < 0 || libvirt_state >= static_cast<int>(names.size())) return "nostate";
  return names[static_cast<std::size_t>(libvirt_state)];
}

bool state_active(std::string_view state) {
  return state == "running" || state == "blocked" || state == "paused" || state == "shutdown" ||
         state == "pmsuspended";
}

}  // namespace gpunode::vmctl
