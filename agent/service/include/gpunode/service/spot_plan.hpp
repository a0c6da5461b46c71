// gpunode/service/spot_plan.hpp: which workloads a terminate-spot or reclaim call stops and which it leaves
// running (CONTRACT §4 terminate-spot, §7 Reach of one VM). Pure: no I/O, no state.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "gpunode/vmctl/vmctl.hpp"

namespace gpunode::service::spot {

// A domain and the node's units its PCI hostdevs are members of.
struct Occupant {
  vmctl::Domain domain;
  std::vector<std::string> unit_ids;  // sorted
};

struct Left {
  const Occupant* vm = nullptr;
  std::vector<std::string> unit_ids;  // only the units the caller reaches
  std::string reason;                 // not-spot | out-of-reach
};

struct Plan {
  std::vector<const Occupant*> terminate;  // spot, active, every unit in reach
  std::vector<Left> left_running;          // active, on a target unit, not terminated
};

// The active workloads on at least one `target` unit: a spot one whose units are all in `reach`
// is terminated; a spot one with a unit outside it is left running (out-of-reach); every other
// one (another tier, or unlabelled) is left running (not-spot). With `whole_node` (an admin or
// the owner asking for the whole node), workloads that occupy no unit are considered too: they
// run on the node, and such a caller reaches all of it. Shut-off definitions occupy nothing and
// are not listed. Order follows `vms`.
Plan plan(const std::vector<Occupant>& vms, const std::set<std::string>& targets,
          const std::set<std::string>& reach, bool whole_node = false);

// The units that carry at least one active spot workload.
std::set<std::string> spot_occupied(const std::vector<Occupant>& vms);

}  // namespace gpunode::service::spot
