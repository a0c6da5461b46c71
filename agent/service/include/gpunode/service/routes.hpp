// gpunode/service/routes.hpp: the one route table. A request's route is decided here, once, from
// one table of (method, path pattern, handler, whether the published snapshot may answer it), read
// by every thread that routes: the daemon's I/O threads (its own routes, GET /metrics and POST
// /v1/admin/reload, and what the metrics listener serves), the network threads' fast path
// (NodeService::read) and the core thread's dispatch (NodeService::handle). Adding a route is
// adding a row; a 405 lists the row's path's methods, so it cannot disagree with the table.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpunode/json/request.hpp"
#include "gpunode/service/node_service.hpp"

namespace gpunode::service {

namespace detail {
struct RouteCall;  // what a route's handler is given on the core thread (private to the service)
struct ReadCall;   // what a read from the snapshot is given on a network thread (the same)
}  // namespace detail

// The ways in a route is served on, as a set.
using Doors = std::uint8_t;
inline constexpr Doors kHttps = 1;            // the API's HTTPS port
inline constexpr Doors kAdminSocket = 2;      // the admin socket
inline constexpr Doors kMetricsListener = 4;  // metrics.listen, plain HTTP
// The door a request came in by, as the server read it off the socket.
Doors door_of(const gpunode::json::Peer& peer);

// What must hold before any route of a path answers, whatever the method: what the caller may not
// see is a 404 byte for byte the 404 of nothing there (CONTRACT §4, §7), never a 405 that would say
// the path is there.
enum class Scope : std::uint8_t {
  none,
  node,         // {nodeId} is this node, and the caller sees it
  reservation,  // node, and {reservationId} is a reservation the caller sees
  org,          // the caller may read {orgId}'s reserved capacity
};

// The daemon's own routes: answered by the daemon on its I/O thread, never by the service.
enum class DaemonRoute : std::uint8_t { none, metrics, reload };

struct Route {
  std::string_view method;
  // "/v1/nodes/{nodeId}/units": literal segments and {parameters}. A pattern without parameters
  // matches the raw path exactly; one with parameters matches the path's percent-decoded segments.
  std::string_view pattern;
  Outcome (*handle)(detail::RouteCall&) = nullptr;  // the core's handler; nullptr: the daemon's own
  // The network thread's answer from the published snapshot: nothing when the snapshot cannot give
  // it (the core then answers). nullptr: the route is never answered from the snapshot.
  std::optional<ApiResponse> (*read)(const detail::ReadCall&) = nullptr;
  Doors doors = 0;
  Scope scope = Scope::none;
  bool authenticated = true;  // false: answered before the request is looked at further (/healthz)
  DaemonRoute daemon = DaemonRoute::none;

  [[nodiscard]] bool from_snapshot() const { return read != nullptr; }
};

// The table, in the order a 405's Allow header lists one path's methods.
std::span<const Route> route_table();

// Where a request goes: its route, or why none.
struct RouteMatch {
  const Route* route = nullptr;  // the row of the path and the method
  const Route* path = nullptr;   // the path's first row, any method; nullptr: no row has the path (404)
  std::vector<std::pair<std::string_view, std::string>> params;  // each {name} and its decoded segment

  [[nodiscard]] std::string_view param(std::string_view name) const;
  // The methods the path takes by this door, "GET, POST": a 405's Allow.
  [[nodiscard]] std::string allow(Doors door) const;
};
// Pure: the table read for the request's door, method and path.
RouteMatch match_route(const gpunode::json::Request& q);

}  // namespace gpunode::service
