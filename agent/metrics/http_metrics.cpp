#include "gpunode/metrics/http_metrics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

namespace gpunode::metrics {

namespace {

// The path's first segments, raw (not decoded: a percent-encoded route name is simply "other"):
// up to 9, so a longer path reads as one of more than any route has. Asked on every answer, so it
// allocates nothing.
class Segments {
 public:
  explicit Segments(std::string_view path) {
    if (!path.starts_with('/')) return;
    path.remove_prefix(1);
    for (;;) {
      const auto slash = path.find('/');
      at_[n_++] = path.substr(0, slash);
      if (slash == std::string_view::npos || n_ == at_.size()) return;
      path.remove_prefix(slash + 1);
    }
  }
  std::size_t size() const { return n_; }
  std::string_view operator[](std::size_t i) const { return at_[i]; }

 private:
  std::array<std::string_view, 9> at_{};
  std::size_t n_ = 0;
};

constexpr std::string_view kOther = "other";

std::string_view node_route(const Segments& s) {
  // s: v1 nodes {nodeId} ...
  static constexpr std::array<std::string_view, 8> kLeaves = {
      "units", "reservations", "audit", "state", "workloads", "capacity", "admission", "terminate-spot"};
  static constexpr std::array<std::string_view, 8> kLeafRoutes = {
      "/v1/nodes/{nodeId}/units",     "/v1/nodes/{nodeId}/reservations",  "/v1/nodes/{nodeId}/audit",
      "/v1/nodes/{nodeId}/state",     "/v1/nodes/{nodeId}/workloads",     "/v1/nodes/{nodeId}/capacity",
      "/v1/nodes/{nodeId}/admission", "/v1/nodes/{nodeId}/terminate-spot"};
  if (s.size() == 4) {
    for (std::size_t i = 0; i < kLeaves.size(); ++i) {
      if (s[3] == kLeaves[i]) return kLeafRoutes[i];
    }
    return kOther;
  }
  if (s.size() == 5 && s[3] == "audit" && s[4] == "checkpoints")
    return "/v1/nodes/{nodeId}/audit/checkpoints";
  if (s[3] != "reservations" || s[4].empty()) return kOther;
  if (s.size() == 5) return "/v1/nodes/{nodeId}/reservations/{reservationId}";
  if (s.size() == 6) {
    if (s[5] == "end") return "/v1/nodes/{nodeId}/reservations/{reservationId}/end";
    if (s[5] == "release") return "/v1/nodes/{nodeId}/reservations/{reservationId}/release";
    if (s[5] == "reclaim") return "/v1/nodes/{nodeId}/reservations/{reservationId}/reclaim";
  }
  return kOther;
}

}  // namespace

std::string_view route_template(std::string_view path) {
  if (path == "/healthz") return "/healthz";
  if (path == "/metrics") return "/metrics";
  if (path == "/v1/admin/rescan") return "/v1/admin/rescan";
  if (path == "/v1/admin/domain-admission") return "/v1/admin/domain-admission";
  if (path == "/v1/admin/reload") return "/v1/admin/reload";
  if (path == "/v1/admin/unentitled") return "/v1/admin/unentitled";
  const Segments s(path);
  if (s.size() < 4 || s[0] != "v1" || s[2].empty()) return kOther;
  if (s[1] == "orgs")
    return s.size() == 4 && s[3] == "reserved-capacity" ? "/v1/orgs/{orgId}/reserved-capacity" : kOther;
  if (s[1] == "nodes" && s.size() <= 6) return node_route(s);
  return kOther;
}

std::string_view method_label(std::string_view method) {
  static constexpr std::array<std::string_view, 7> kMethods = {"GET",   "HEAD",   "POST",   "PUT",
                                                               "PATCH", "DELETE", "OPTIONS"};
  for (auto m : kMethods) {
    if (m == method) return m;
  }
  return kOther;
}

void HttpMetrics::record(std::string_view method, std::string_view path, unsigned status,
                         std::chrono::nanoseconds took) {
  const auto route = route_template(path);
  const auto m = method_label(method);
  const unsigned code = status >= 100 && status <= 599 ? status : 0;  // 0: "other"
  const double seconds =
      std::chrono::duration<double>(std::max(took, std::chrono::nanoseconds::zero())).count();
  const auto bucket = static_cast<std::size_t>(
      std::lower_bound(kDurationBuckets.begin(), kDurationBuckets.end(), seconds) - kDurationBuckets.begin());
  std::lock_guard lock(mu_);
  ++counts_[{route, m, code}];
  auto& h = durations_[{route, m}];
  ++h.counts[bucket];
  h.sum += seconds;
}

void HttpMetrics::write(Writer& w) const {
  std::lock_guard lock(mu_);
  w.family("gpunode_http_requests_total", "counter",
           "HTTP requests answered, by route template, method and status code (HTTPS, admin socket and "
           "metrics.listen)");
  for (const auto& [key, n] : counts_) {
    const auto& [route, method, code] = key;
    const std::string c = code ? std::to_string(code) : std::string(kOther);
    w.sample("gpunode_http_requests_total", {{"route", route}, {"method", method}, {"code", c}}, n);
  }
  w.family("gpunode_http_request_duration_seconds", "histogram",
           "Time from a request read whole to its answer queued for writing, by route template and method");
  for (const auto& [key, h] : durations_) {
    w.histogram("gpunode_http_request_duration_seconds", {{"route", key.first}, {"method", key.second}},
                kDurationBuckets, h.counts, h.sum);
  }
}

}  // namespace gpunode::metrics
