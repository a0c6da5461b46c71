// gpunode/service/api.hpp: the API as plain data, independent of any transport.
#pragma once

#include <boost/json/fwd.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "gpunode/json/problem.hpp"

namespace gpunode::service {

struct WorkloadListing;  // gpunode/service/node_service.hpp

struct ApiRequest {
  enum class Via { https, admin_socket };
  std::string method;
  std::string path;                                          // without the query
  std::string query;                                         // without '?'
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-case
  std::string body;
  Via via = Via::https;
  std::optional<std::uint32_t> peer_uid;  // SO_PEERCRED on the admin socket
  std::string request_id;
  // When the request arrived: a long poll's deadline is counted from here, also when it is
  // handled again after a change.
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
  // Set by the driver when a parked long poll's deadline has come: it is answered now (304).
  bool wait_over = false;
  // The domains as listed for this request, off the state thread (set when the service asked for
  // them with NeedsWorkloads).
  std::shared_ptr<const WorkloadListing> workloads;

  [[nodiscard]] std::optional<std::string_view> header(std::string_view lower_name) const;
  // The decoded value of a query parameter (first occurrence); nothing when absent or when the
  // query is malformed (target_error says so).
  [[nodiscard]] std::optional<std::string> query_param(std::string_view name) const;
  // What is wrong with the path or the query (bad percent-encoding, a character URLs may not
  // hold), or nothing.
  [[nodiscard]] std::optional<std::string> target_error() const;
  // The path's segments, percent-decoded: "/v1/nodes/n%2D1/units" -> v1, nodes, n-1, units. A
  // trailing slash gives an empty last segment.
  [[nodiscard]] std::vector<std::string> segments() const;
};

using ApiResponse = gpunode::json::Response;  // one answer type for the transport and the API

using FieldProblem = gpunode::json::FieldError;  // a field of the body or query and what is wrong with it

using gpunode::json::problem;  // application/problem+json with every key of CONTRACT §4/§7
using gpunode::json::status_title;

// 200 (or `status`) with a JSON body.
ApiResponse json_response(const boost::json::value& body, unsigned status = 200);

// Whether an If-None-Match header (a list of entity tags, or *) matches `etag`, by the weak
// comparison (RFC 9110 §13.1.2).
bool etag_matches(std::string_view if_none_match, std::string_view etag);

}  // namespace gpunode::service
