#include "gpunode/service/api.hpp"

#include <boost/json.hpp>

namespace gpunode::service {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding of a query component ('+' is a space); nullopt on a bad escape.
std::optional<std::string> decode_component(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out.push_back(' ');
    } else if (s[i] == '%') {
      if (i + 2 >= s.size()) return std::nullopt;
      const int hi = hex_value(s[i + 1]);
      const int lo = hex_value(s[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace

std::optional<std::string_view> ApiRequest::header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers) {
    if (k == lower_name) return std::string_view(v);
  }
  return std::nullopt;
}

std::optional<std::string> ApiRequest::query_param(std::string_view name) const {
  std::string_view q = query;
  while (!q.empty()) {
    const auto amp = q.find('&');
    std::string_view part = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view{} : q.substr(amp + 1);
    const auto eq = part.find('=');
    auto key = decode_component(part.substr(0, eq));
    if (!key || *key != name) continue;
    if (eq == std::string_view::npos) return std::string();
    return decode_component(part.substr(eq + 1));
  }
  return std::nullopt;
}

std::optional<std::string_view> ApiResponse::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return std::string_view(v);
  }
  return std::nullopt;
}

std::string_view status_title(unsigned status) {
  switch (status) {
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 412: return "Precondition Failed";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Content";
    case 428: return "Precondition Required";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

ApiResponse problem(unsigned status, std::string_view code, std::string_view detail,
                    const std::vector<FieldProblem>& errors, const boost::json::object* extra) {
  boost::json::object o;
  o["type"] = "urn:gpunode:problem:" + std::string(code);
  o["title"] = status_title(status);
  o["status"] = status;
  o["detail"] = detail;
  o["code"] = code;
  boost::json::array list;
  for (const auto& e : errors) list.emplace_back(boost::json::object{{"field", e.field}, {"message", e.message}});
  o["errors"] = std::move(list);
  if (extra != nullptr) {
    for (const auto& kv : *extra) o[kv.key()] = kv.value();
  }
  ApiResponse r;
  r.status = status;
  r.headers.emplace_back("Content-Type", "application/problem+json");
  r.body = boost::json::serialize(o);
  return r;
}

ApiResponse json_response(const boost::json::value& body, unsigned status) {
  ApiResponse r;
  r.status = status;
  r.headers.emplace_back("Content-Type", "application/json");
  r.body = boost::json::serialize(body);
  return r;
}

}  // namespace gpunode::service
