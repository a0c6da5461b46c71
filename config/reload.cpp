// What a SIGHUP cannot change (CONTRACT §2).
#include "gpunode/config/config.hpp"

namespace gpunode::config {

std::vector<std::string> keys_needing_restart(const Config& a, const Config& b) {
  std::vector<std::string> out;
  auto check = [&](bool same, const char* key) {
    if (!same) out.emplace_back(key);
  };
  check(a.node.id == b.node.id, "node.id");
  check(a.node.owner_org == b.node.owner_org, "node.owner_org");
  check(a.discovery.host_root == b.discovery.host_root, "discovery.host_root");
  check(a.discovery.gpu_vendors == b.discovery.gpu_vendors, "discovery.gpu_vendors");
  check(a.discovery.reservable_classes == b.discovery.reservable_classes, "discovery.reservable_classes");
  check(a.discovery.rescan_interval == b.discovery.rescan_interval, "discovery.rescan_interval");
  check(a.api.listen == b.api.listen, "api.listen");
  check(a.api.max_connections == b.api.max_connections, "api.max_connections");
  check(a.api.max_connections_per_client == b.api.max_connections_per_client,
        "api.max_connections_per_client");
  check(a.admin.max_connections == b.admin.max_connections, "admin.max_connections");
  check(a.admin.socket == b.admin.socket, "admin.socket");
  check(a.libvirt.uri == b.libvirt.uri, "libvirt.uri");
  check(a.libvirt.shutdown_grace == b.libvirt.shutdown_grace, "libvirt.shutdown_grace");
  check(a.central.url == b.central.url, "central.url");
  check(a.central.heartbeat_interval == b.central.heartbeat_interval, "central.heartbeat_interval");
  check(a.metrics.listen == b.metrics.listen, "metrics.listen");
  check(a.metrics.allow_remote == b.metrics.allow_remote, "metrics.allow_remote");
  check(a.audit.checkpoint_interval == b.audit.checkpoint_interval, "audit.checkpoint_interval");
  check(a.audit.signing_key == b.audit.signing_key, "audit.signing_key");
  check(a.health.enabled == b.health.enabled, "health.enabled");
  check(a.health.interval == b.health.interval, "health.interval");
  check(a.health.recovery == b.health.recovery, "health.recovery");
  check(a.health.nonfatal_threshold == b.health.nonfatal_threshold, "health.nonfatal_threshold");
  check(a.health.ignore == b.health.ignore, "health.ignore");
  check(a.state.dir == b.state.dir, "state.dir");
  return out;
}

}  // namespace gpunode::config
