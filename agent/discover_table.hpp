// The human-readable table of `gpunode-agent discover`.
#pragma once

#include <string>
#include <vector>

#include "gpunode/discovery/model.hpp"

namespace gpunode::agent {

std::string discover_table(const std::string& node_id, const std::string& host_root,
                           const discovery::HostSnapshot& snapshot,
                           const std::vector<discovery::Unit>& units);

}  // namespace gpunode::agent
