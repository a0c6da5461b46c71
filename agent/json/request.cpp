#include "gpunode/json/request.hpp"

#include <boost/url/encoding_opts.hpp>
#include <boost/url/parse_path.hpp>
#include <boost/url/parse_query.hpp>
#include <boost/url/segments_encoded_view.hpp>

namespace gpunode::json {

std::optional<std::string_view> Request::header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return std::string_view{value};
  }
  return std::nullopt;
}

// Query and path are parsed by Boost.URL (RFC 3986 percent-encoding; in the query '+' is a space,
// as HTML forms and curl --data-urlencode send it).
std::optional<std::string> Request::query_param(std::string_view name) const {
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

std::optional<std::string> Request::target_error() const {
  if (auto p = boost::urls::parse_path(path); !p)
    return "the path is not a valid URL path: " + p.error().message();
  if (auto q = boost::urls::parse_query(query); !q)
    return "the query is not a valid URL query: " + q.error().message();
  return std::nullopt;
}

std::vector<std::string> Request::segments() const {
  std::vector<std::string> out;
  auto parsed = boost::urls::parse_path(path);
  if (!parsed) return out;
  out.reserve(parsed->size());
  for (const auto& s : *parsed) out.push_back(s.decode());
  return out;
}

}  // namespace gpunode::json
