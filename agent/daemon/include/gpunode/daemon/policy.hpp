// What the parts of the agent take from a checked config: the discovery policy (CONTRACT §2
// `discovery`, `node.unsellable_units`), unit health's settings (§13 `health`), and the service's
// options, which hold both.
#pragma once

#include "gpunode/config/config.hpp"
#include "gpunode/discovery/model.hpp"
#include "gpunode/health/judge.hpp"
#include "gpunode/service/node_service.hpp"

namespace gpunode::daemon {

discovery::Policy policy_from(const config::Config& config);
health::Settings health_settings_from(const config::Config& config);
service::ServiceOptions service_options(const config::Config& config, std::string version);

}  // namespace gpunode::daemon
