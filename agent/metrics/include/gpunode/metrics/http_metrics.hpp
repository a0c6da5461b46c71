// gpunode/metrics/http_metrics.hpp: gpunode_http_requests_total and
// gpunode_http_request_duration_seconds (CONTRACT §6), recorded where requests are answered.
//
// Cardinality is bounded by construction: `route` is one of the route templates below or
// "other" (an unknown path never becomes a label value), `method` one of eight values, `code` an
// HTTP status (100..599, else "other"). No label holds a node id, an org, a reservation id or a
// token's subject.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>
#include <utility>

#include "gpunode/metrics/exposition.hpp"

namespace gpunode::metrics {

// The route template of a request path (no query): "/v1/nodes/{nodeId}/units",
// "/v1/nodes/{nodeId}/reservations/{reservationId}/end", "/healthz", ... or "other". The view
// points to a static string. Whether the node id is this node's does not matter: the template is
// the route's, and the value is never a label.
std::string_view route_template(std::string_view path);
// GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, else "other". Static string.
std::string_view method_label(std::string_view method);

// Upper bounds of the duration buckets, in seconds: a GET answers in well under a millisecond, a
// create waits for an fsync (ms), a long poll up to its wait (120 s max), a termination up to its
// grace (300 s max) and its destroys.
inline constexpr std::array<double, 18> kDurationBuckets = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};

// Thread-safe: record() runs on the network thread as each answer is sent, write() on whichever
// thread renders /metrics. Shared state: `counts_` and `durations_`, guarded by `mu_`.
class HttpMetrics {
 public:
  void record(std::string_view method, std::string_view path, unsigned status, std::chrono::nanoseconds took);
  // Both families, HELP and TYPE included (no sample before the first request).
  void write(Writer& w) const;

 private:
  struct Histogram {
    std::array<std::uint64_t, kDurationBuckets.size() + 1> counts{};
    double sum = 0;
  };
  mutable std::mutex mu_;
  std::map<std::tuple<std::string_view, std::string_view, unsigned>, std::uint64_t>
      counts_;                                                                    // route, method, code
  std::map<std::pair<std::string_view, std::string_view>, Histogram> durations_;  // route, method
};

}  // namespace gpunode::metrics
