#include "gpunode/metrics/node_metrics.hpp"

namespace gpunode::metrics {

std::string render(const Snapshot& s, const HttpMetrics& http) {
  Writer w;
  w.family("gpunode_build_info", "gauge", "Always 1; the agent's version as a label");
  w.sample("gpunode_build_info", {{"version", s.version}}, std::int64_t{1});

  w.family("gpunode_units", "gauge",
           "Units (IOMMU groups holding a GPU) as GET units lists them, absent ones included, by class and "
           "reservable");
  for (std::size_t c = 0; c < kUnitClasses.size(); ++c) {
    for (std::size_t r = 0; r < 2; ++r) {
      w.sample("gpunode_units", {{"class", kUnitClasses[c]}, {"reservable", r ? "true" : "false"}},
               s.node.units[c][r]);
    }
  }
  w.family("gpunode_reservations", "gauge", "Reservations held by this node, by state");
  for (std::size_t i = 0; i < kReservationStates.size(); ++i) {
    w.sample("gpunode_reservations", {{"state", kReservationStates[i]}}, s.node.reservations[i]);
  }

  http.write(w);

  w.family("gpunode_terminations_total", "counter",
           "Spot VM terminations whose outcome was recorded since the agent started, by result");
  w.sample("gpunode_terminations_total", {{"result", "ok"}}, s.node.terminations_ok);
  w.sample("gpunode_terminations_total", {{"result", "failed"}}, s.node.terminations_failed);

  w.family("gpunode_outbox_events", "gauge", "Events in the outbox not yet acknowledged by the central API");
  w.sample("gpunode_outbox_events", {}, s.delivery.outbox_events);
  w.family("gpunode_outbox_oldest_undelivered_age_seconds", "gauge",
           "Age of the oldest undelivered event; 0 when the outbox is empty");
  w.sample("gpunode_outbox_oldest_undelivered_age_seconds", {}, s.delivery.oldest_undelivered_age_seconds);
  w.family("gpunode_central_acked_seq", "gauge", "The highest event seq the central API has acknowledged");
  w.sample("gpunode_central_acked_seq", {}, s.delivery.acked_seq);
  w.family("gpunode_central_delivery_failures_total", "counter",
           "Failed event deliveries to the central API since the agent started, by reason");
  for (std::size_t i = 0; i < kFailureReasons.size(); ++i) {
    w.sample("gpunode_central_delivery_failures_total", {{"reason", kFailureReasons[i]}},
             s.delivery.failures[i]);
  }

  w.family("gpunode_libvirt_connected", "gauge",
           "1 when the agent holds a working connection to libvirt, else 0");
  w.sample("gpunode_libvirt_connected", {}, std::int64_t{s.libvirt_connected ? 1 : 0});
  w.family("gpunode_state_revision", "gauge", "The node's state revision (GET state's revision)");
  w.sample("gpunode_state_revision", {}, s.node.revision);
  w.family("gpunode_unentitled_workloads", "gauge",
           "Active domains on units they are not entitled to, as the last listing found them");
  w.sample("gpunode_unentitled_workloads", {}, s.node.unentitled_workloads);
  w.family("gpunode_discovery_duration_seconds", "gauge", "How long the last discovery scan took");
  w.sample("gpunode_discovery_duration_seconds", {}, s.node.discovery_seconds);
  w.family("gpunode_domain_admissions_total", "counter",
           "libvirt hook domain admissions decided since the agent started, by result");
  for (std::size_t i = 0; i < kAdmissionResults.size(); ++i) {
    w.sample("gpunode_domain_admissions_total", {{"result", kAdmissionResults[i]}}, s.node.admissions[i]);
  }
  w.family("gpunode_unit_failing", "gauge",
           "1 when the unit's health is failing (a GPU or its link), else 0");
  for (const auto& [unit, failing] : s.node.unit_failing)
    w.sample("gpunode_unit_failing", {{"unit", unit}}, std::int64_t{failing ? 1 : 0});
  w.family("gpunode_pcie_errors_total", "counter",
           "PCIe AER errors seen to rise by this agent on the functions a unit is judged on, by severity");
  static constexpr std::array<std::string_view, 3> kSeverities = {"fatal", "nonfatal", "correctable"};
  for (const auto& e : s.node.pcie_errors) {
    for (std::size_t i = 0; i < kSeverities.size(); ++i) {
      w.sample("gpunode_pcie_errors_total",
               {{"unit", e.unit}, {"pci_address", e.pci_address}, {"severity", kSeverities[i]}}, e.counts[i]);
    }
  }
  return w.take();
}

}  // namespace gpunode::metrics
