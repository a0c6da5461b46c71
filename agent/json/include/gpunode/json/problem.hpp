// gpunode/json/problem.hpp: an answer as plain data, and the body of every error answer,
// application/problem+json (RFC 9457) with every key of CONTRACT §4/§7. One type and one builder
// for the transport (413, 431, 400 before a request reaches the API), the daemon's own routes and
// the API itself: http::Response and service::ApiResponse are this Response.
#pragma once

#include <boost/json/fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpunode/json/field_error.hpp"

namespace gpunode::json {

// An answer: its status, headers (in order) and body.
struct Response {
  unsigned status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  // The first header of that name, as written.
  [[nodiscard]] std::optional<std::string_view> header(std::string_view name) const;
};

// The status's reason phrase (RFC 9110), the problem's title: "Not Found", "Content Too Large".
std::string_view status_title(unsigned status);

// {"type":"urn:gpunode:problem:CODE","title","status","detail","code","errors":[{"field","message"}]}
// with `extra`'s members merged in, as application/problem+json.
Response problem(unsigned status, std::string_view code, std::string_view detail,
                 const std::vector<FieldError>& errors = {}, const boost::json::object* extra = nullptr);

// The three answers every layer gives alike, each built here and nowhere else:
// 404 `not-found` "no such resource". It holds nothing from the request, so that every 404 for a
// node the caller does not see is byte for byte the 404 of a node that is not there (CONTRACT §4,
// §7): a security property, kept by there being one of it.
Response not_found();
// 405 `method-not-allowed` "allowed: ALLOW" with `Allow: ALLOW` (e.g. "GET, POST").
Response method_not_allowed(std::string_view allow);
// 500 `internal`: what could not be done, in words that name nothing private.
Response internal_error(std::string_view detail = "the request could not be handled");

}  // namespace gpunode::json
