// Pure planning of spot terminations. See spot_plan.hpp.
#include "gpunode/service/spot_plan.hpp"

#include <algorithm>

namespace gpunode::service::spot {
namespace {

bool is_spot(const vmctl::Domain& d) {
  return d.label && d.label->tier == vmctl::Tier::spot;
}

}  // namespace

Plan plan(const std::vector<Occupant>& vms, const std::set<std::string>& targets,
          const std::set<std::string>& reach, bool whole_node) {
  Plan out;
  for (const auto& vm : vms) {
    if (!vm.domain.active()) continue;
    if (!(whole_node && vm.unit_ids.empty()) &&
        std::none_of(vm.unit_ids.begin(), vm.unit_ids.end(),
                     [&](const std::string& u) { return targets.contains(u); }))
      continue;
    std::vector<std::string> reached;
    for (const auto& u : vm.unit_ids) {
      if (reach.contains(u)) reached.push_back(u);
    }
    if (!is_spot(vm.domain)) {
      out.left_running.push_back(Left{&vm, std::move(reached), "not-spot"});
    } else if (reached.size() != vm.unit_ids.size()) {
      out.left_running.push_back(Left{&vm, std::move(reached), "out-of-reach"});
    } else {
      out.terminate.push_back(&vm);
    }
  }
  return out;
}

std::set<std::string> spot_occupied(const std::vector<Occupant>& vms) {
  std::set<std::string> out;
  for (const auto& vm : vms) {
    if (vm.domain.active() && is_spot(vm.domain)) out.insert(vm.unit_ids.begin(), vm.unit_ids.end());
  }
  return out;
}

}  // namespace gpunode::service::spot
