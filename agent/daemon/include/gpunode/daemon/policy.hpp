// The discovery policy (CONTRACT §2 `discovery`, `node.unsellable_units`) and unit health's
// settings (§13 `health`) from a checked config.
#pragma once

#include "gpunode/config/config.hpp"
#include "gpunode/discovery/model.hpp"
#include "gpunode/health/judge.hpp"

namespace gpunode::daemon {

discovery::Policy policy_from(const config::Config& config);
health::Settings health_settings_from(const config::Config& config);

}  // namespace gpunode::daemon
