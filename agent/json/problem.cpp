// An answer and problem+json bodies (see problem.hpp).
#include "gpunode/json/problem.hpp"

#include <boost/json.hpp>

namespace gpunode::json {

std::optional<std::string_view> Response::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return std::string_view(v);
  }
  return std::nullopt;
}

std::string_view status_title(unsigned status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 409:
      return "Conflict";
    case 412:
      return "Precondition Failed";
    case 413:
      return "Content Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Content";
    case 428:
      return "Precondition Required";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

Response problem(unsigned status, std::string_view code, std::string_view detail,
                 const std::vector<FieldError>& errors, const boost::json::object* extra) {
  boost::json::object o;
  o["type"] = "urn:gpunode:problem:" + std::string(code);
  o["title"] = status_title(status);
  o["status"] = status;
  o["detail"] = detail;
  o["code"] = code;
  boost::json::array list;
  for (const auto& e : errors)
    list.emplace_back(boost::json::object{{"field", e.field}, {"message", e.message}});
  o["errors"] = std::move(list);
  if (extra != nullptr) {
    for (const auto& kv : *extra) o[kv.key()] = kv.value();
  }
  Response r;
  r.status = status;
  r.headers.emplace_back("Content-Type", "application/problem+json");
  r.body = boost::json::serialize(o);
  return r;
}

Response not_found() {
  return problem(404, "not-found", "no such resource");
}

Response method_not_allowed(std::string_view allow) {
  auto r = problem(405, "method-not-allowed", "allowed: " + std::string(allow));
  r.headers.emplace_back("Allow", allow);
  return r;
}

Response internal_error(std::string_view detail) {
  return problem(500, "internal", detail);
}

}  // namespace gpunode::json
