#include "gpunode/daemon/policy.hpp"

#include <charconv>

namespace gpunode::daemon {

discovery::Policy policy_from(const config::Config& config) {
  discovery::Policy policy;
  policy.gpu_vendors.clear();
  for (const auto& v : config.discovery.gpu_vendors) {  // validated by config: 4 hex digits
    std::uint16_t id = 0;
    auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), id, 16);
    if (ec == std::errc{} && ptr == v.data() + v.size()) policy.gpu_vendors.push_back(id);
  }
  policy.reservable_classes.clear();
  for (const auto& c : config.discovery.reservable_classes) {
    if (auto cls = discovery::parse_unit_class(c)) policy.reservable_classes.push_back(*cls);
  }
  policy.unsellable = config.node.unsellable_units;
  return policy;
}

health::Settings health_settings_from(const config::Config& config) {
  return health::Settings{config.health.nonfatal_threshold,
                          std::chrono::duration_cast<std::chrono::seconds>(config.health.recovery),
                          config.health.ignore};
}

service::ServiceOptions service_options(const config::Config& c, std::string version) {
  return service::ServiceOptions{c.node.id,
                                 c.node.owner_org,
                                 policy_from(c),
                                 c.discovery.host_root,
                                 c.state.dir,
                                 std::move(version),
                                 std::chrono::duration_cast<std::chrono::seconds>(c.libvirt.shutdown_grace),
                                 c.enforcement.mode,
                                 {c.health.enabled, c.health.interval, health_settings_from(c)}};
}

}  // namespace gpunode::daemon
