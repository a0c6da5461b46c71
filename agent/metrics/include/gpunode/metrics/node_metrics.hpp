// gpunode/metrics/node_metrics.hpp: every metric of CONTRACT §6 as plain data, and the /metrics
// body. Pure: the daemon gathers the values (the node's on the core thread, delivery's from the
// reporter, HTTP's from HttpMetrics) and render() writes them.
//
// Label sets that always exist are written even at 0 (each unit class x reservable, each
// reservation state, both termination results, each admission result, each delivery failure
// reason), so dashboards and alerts have a series from the first scrape.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpunode/metrics/http_metrics.hpp"

namespace gpunode::metrics {

// Label values, in the order of the arrays below.
inline constexpr std::array<std::string_view, 3> kUnitClasses = {"vfio-group", "device-request", "none"};
inline constexpr std::array<std::string_view, 3> kReservationStates = {"scheduled", "active", "ended"};
inline constexpr std::array<std::string_view, 3> kAdmissionResults = {"allowed", "refused", "audit-refused"};
inline constexpr std::array<std::string_view, 4> kFailureReasons = {"transport", "5xx", "429", "4xx"};

// The index of `value` in `labels`, or nothing.
template <std::size_t N>
constexpr std::optional<std::size_t> index_of(const std::array<std::string_view, N>& labels,
                                              std::string_view value) {
  for (std::size_t i = 0; i < N; ++i) {
    if (labels[i] == value) return i;
  }
  return std::nullopt;
}

// gpunode_domain_admissions_total's results (CONTRACT §9: refused in enforce mode, audit-refused
// in audit mode).
enum class Admission { allowed, refused, audit_refused };

// What the NodeService knows, read on its thread.
struct NodeGauges {
  std::array<std::array<std::int64_t, 2>, kUnitClasses.size()>
      units{};  // [class][reservable: 0 false, 1 true]
  std::array<std::int64_t, kReservationStates.size()> reservations{};
  std::int64_t revision = 0;
  double discovery_seconds = 0;           // the last scan (read and rules)
  std::int64_t unentitled_workloads = 0;  // active domains on units they are not entitled to (CONTRACT §9)
  // Counters since the agent started.
  std::uint64_t terminations_ok = 0;
  std::uint64_t terminations_failed = 0;
  std::array<std::uint64_t, kAdmissionResults.size()> admissions{};
  // Unit health (CONTRACT §13): each unit and whether it is failing; the PCIe errors this agent saw
  // rise on each function a unit is judged on, by severity (fatal, nonfatal, correctable).
  std::vector<std::pair<std::string, bool>> unit_failing;
  struct PcieErrors {
    std::string unit, pci_address;
    std::array<std::uint64_t, 3> counts{};
  };
  std::vector<PcieErrors> pcie_errors;

  void count_admission(Admission a) { ++admissions[static_cast<std::size_t>(a)]; }
};

// The outbox and delivery to the central API.
struct Delivery {
  std::int64_t outbox_events = 0;
  double oldest_undelivered_age_seconds = 0;  // 0 when the outbox is empty
  std::int64_t acked_seq = 0;
  std::array<std::uint64_t, kFailureReasons.size()> failures{};
};

struct Snapshot {
  std::string version;
  NodeGauges node;
  Delivery delivery;
  bool libvirt_connected = false;
};

// The whole exposition (Content-Type kContentType).
std::string render(const Snapshot& s, const HttpMetrics& http);

}  // namespace gpunode::metrics
