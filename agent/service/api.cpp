#include "gpunode/service/api.hpp"

#include <boost/json.hpp>

#include "gpunode/json/problem.hpp"

namespace gpunode::service {

std::string entity_tag(std::string_view value) {
  std::string out;
  out.reserve(value.size() + 2);
  out += '"';
  out += value;
  out += '"';
  return out;
}

bool etag_matches(std::string_view header, std::string_view etag) {
  std::string_view h = header;
  while (!h.empty()) {
    const auto comma = h.find(',');
    std::string_view t = h.substr(0, comma);
    while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
    while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
    if (t.starts_with("W/")) t.remove_prefix(2);
    if (t == "*" || t == etag) return true;
    h = comma == std::string_view::npos ? std::string_view{} : h.substr(comma + 1);
  }
  return false;
}

ApiResponse json_response(const boost::json::value& body, unsigned status) {
  ApiResponse r;
  r.status = status;
  r.headers.emplace_back("Content-Type", "application/json");
  r.body = boost::json::serialize(body);
  return r;
}

}  // namespace gpunode::service
