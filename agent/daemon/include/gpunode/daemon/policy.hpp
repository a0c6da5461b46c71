// The discovery policy (CONTRACT §2 `discovery`, `node.unsellable_units`) from a checked config.
#pragma once

#include "gpunode/config/config.hpp"
#include "gpunode/discovery/model.hpp"

namespace gpunode::daemon {

discovery::Policy policy_from(const config::Config& config);

}  // namespace gpunode::daemon
