// gpunode/json/request.hpp: a request as plain data, one type for the transport and the API. The
// HTTP layer builds it (http::Request is this Request) and the service takes it as the base of its
// ApiRequest, which adds only the service's own per-request fields (gpunode/service/api.hpp).
//
// It lives here, beside the shared Response, and not in agent/http: the service takes the
// transport's request whole (no field copied by hand) yet stays transport-free, for this header
// is plain data and Boost.URL behind it, no Boost.Beast and no Asio (gpunode/http/server.hpp
// includes Asio).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpunode::json {

// Who sent a request, as the server read it off the socket.
struct Peer {
  // tcp: the HTTPS listener; unix_socket: the admin socket; plain_tcp: a plain-HTTP listener
  // (listen_plain: metrics.listen), which the handler limits to what it may serve there.
  enum class Kind { tcp, unix_socket, plain_tcp } kind = Kind::tcp;
  std::string address;       // "ip:port" ("[v6]:port") on TCP; the socket's path on the admin socket
  std::optional<uid_t> uid;  // SO_PEERCRED, admin socket only
  std::optional<gid_t> gid;  // the peer's effective (primary) group
  std::optional<pid_t> pid;
  // SO_PEERGROUPS, admin socket only: the peer's supplementary groups as the kernel holds them
  // (its credentials when it connected), in the kernel's order. Empty on TCP, or when the kernel
  // cannot say (then logged): a filter must not read that as anything but "no groups".
  std::vector<gid_t> groups;
};

struct Request {
  std::string method;
  std::string target;                                        // raw path?query
  std::string path;                                          // without the query
  std::string query;                                         // after '?', raw (not decoded); empty when none
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, in order
  std::string body;
  Peer peer;
  std::string request_id;  // the client's X-Request-Id if sane (1..128 printable chars), else generated

  // The first header of that (lower-case) name.
  [[nodiscard]] std::optional<std::string_view> header(std::string_view lower_name) const;
  // Whether it came over the admin socket (CONTRACT §7); HTTPS and the plain listener are not.
  [[nodiscard]] bool via_admin_socket() const { return peer.kind == Peer::Kind::unix_socket; }
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

}  // namespace gpunode::json
