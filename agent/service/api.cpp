#include "gpunode/service/api.hpp"

#include <boost/json.hpp>
#include <boost/url/encoding_opts.hpp>
#include <boost/url/parse_path.hpp>
#include <boost/url/parse_query.hpp>
#include <boost/url/segments_encoded_view.hpp>

#include "gpunode/json/problem.hpp"

namespace gpunode::service {
std::optional<std::string_view> ApiRequest::header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers) {
    if (k == lower_name) return std::string_view(v);
  }
  return std::nullopt;
}

// Query and path are parsed by Boost.URL (RFC 3986 percent-encoding; in the query '+' is a space,
// as HTML forms and curl --data-urlencode send it).
std::optional<std::string> ApiRequest::query_param(std::string_view name) const {
  auto parsed = boost::urls::parse_query(query);
  if (!parsed) return std::nullopt;
  boost::urls::encoding_opts opts;
  opts.space_as_plus = true;
  for (const auto& p : *parsed) {
    if (p.key.decode(opts) != name) continue;
    return p.has_value ? p.value.decode(opts) : std::string();
  }
  return std::nullopt;
}

std::optional<std::string> ApiRequest::target_error() const {
  if (auto p = boost::urls::parse_path(path); !p)
    return "the path is not a valid URL path: " + p.error().message();
  if (auto q = boost::urls::parse_query(query); !q)
    return "the query is not a valid URL query: " + q.error().message();
  return std::nullopt;
}

std::vector<std::string> ApiRequest::segments() const {
  std::vector<std::string> out;
  auto parsed = boost::urls::parse_path(path);
  if (!parsed) return out;
  for (const auto& s : *parsed) out.push_back(s.decode());
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
