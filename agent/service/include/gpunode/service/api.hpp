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
#include "gpunode/json/request.hpp"

namespace gpunode::service {

struct WorkloadListing;  // gpunode/service/node_service.hpp

// A request as the API takes it: the transport's request (gpunode/json/request.hpp) held by value
// as its base, and the service's own per-request fields, no other. The server's request is moved
// in whole (ApiRequest(std::move(request))), so no field is copied by hand and none is written
// twice: the way in and the peer's uid are its `peer` (via_admin_socket(), peer.uid). A base rather
// than a member, so that the routes read q.path and q.header() as the transport wrote them. The
// service stays transport-free: json::Request is plain data, with no Boost.Beast or Asio behind it.
struct ApiRequest : json::Request {
  ApiRequest() = default;
  explicit ApiRequest(json::Request request) : json::Request(std::move(request)) {}

  // When the request arrived: a long poll's deadline is counted from here, also when it is
  // handled again after a change.
  std::chrono::steady_clock::time_point received = std::chrono::steady_clock::now();
  // Set by the driver when a parked long poll's deadline has come: it is answered now (304).
  bool wait_over = false;
  // The domains as listed for this request, off the state thread (set when the service asked for
  // them with NeedsWorkloads).
  std::shared_ptr<const WorkloadListing> workloads;
};

using ApiResponse = gpunode::json::Response;  // one answer type for the transport and the API

using gpunode::json::internal_error;      // the one 500
using gpunode::json::method_not_allowed;  // the one 405
using gpunode::json::not_found;           // the one 404: every hidden thing's, byte for byte
using gpunode::json::problem;             // application/problem+json with every key of CONTRACT §4/§7
using gpunode::json::status_title;

// 200 (or `status`) with a JSON body.
ApiResponse json_response(const boost::json::value& body, unsigned status = 200);

// The one ETag format: a strong entity tag, `"VALUE"` (a reservation's version, the state's revision,
// a body digest's prefix). A number is written in decimal.
std::string entity_tag(std::string_view value);
inline std::string entity_tag(std::int64_t number) {
  return entity_tag(std::to_string(number));
}

// Whether an If-None-Match header (a list of entity tags, or *) matches `etag`, by the weak
// comparison (RFC 9110 §13.1.2).
bool etag_matches(std::string_view if_none_match, std::string_view etag);

}  // namespace gpunode::service
