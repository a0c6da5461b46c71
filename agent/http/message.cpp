// Between Beast's messages and the handler's: the Request built, the response filled, the refusals.
#include "message.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <cstdint>
#include <limits>
#include <string_view>

#include "gpunode/text/ascii.hpp"

namespace gpunode::http::detail {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;

bool is_token_char(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view{"!#$%&'*+-.^_`|~"}.find(c) != std::string_view::npos;
}

// A field Beast can hold (its fields keep a name's or a value's size plus 2 in 16 bits, and throw
// beyond) and that cannot split the header: anything else a handler sets is dropped, not sent.
bool valid_header(std::string_view name, std::string_view value) {
  constexpr std::size_t kMaxField = std::numeric_limits<std::uint16_t>::max() - 2;
  if (name.size() > kMaxField || value.size() > kMaxField) return false;
  if (name.empty() || !std::all_of(name.begin(), name.end(), is_token_char)) return false;
  return value.find_first_of(std::string_view{"\r\n\0", 3}) == std::string_view::npos;
}

}  // namespace

Request make_request(BeastRequest&& msg, const Peer& peer) {
  Request req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  if (auto q = req.target.find('?'); q != std::string::npos) {
    req.path = req.target.substr(0, q);
    req.query = req.target.substr(q + 1);
  } else {
    req.path = req.target;
  }
  for (const auto& field : msg) {
    req.headers.emplace_back(text::ascii_lower(field.name_string()), std::string(field.value()));
  }
  req.body = std::move(msg.body());
  req.peer = peer;
  auto id = req.header("x-request-id");
  req.request_id = id && sane_request_id(*id) ? std::string(*id) : generate_request_id();
  return req;
}

bool fill_response(BeastResponse& res, unsigned status, Response&& r, const std::string& request_id) {
  res.result(status);
  bool close = false;
  bool has_type = false;
  for (const auto& [name, value] : r.headers) {
    if (!valid_header(name, value)) continue;
    const auto is = [&name](std::string_view other) { return beast::iequals(name, other); };
    if (is("content-length") || is("transfer-encoding") || is("x-request-id")) continue;
    if (is("connection")) {
      if (beast::iequals(value, "close")) close = true;
      continue;
    }
    if (is("content-type")) has_type = true;
    res.insert(name, value);
  }
  res.set("X-Request-Id", request_id);
  if (status == 204 || status == 304) {
    res.erase(bhttp::field::content_type);
  } else {
    if (!has_type) res.set(bhttp::field::content_type, "application/json");
    res.body() = std::move(r.body);
  }
  return close;
}

Response body_too_large(std::size_t limit) {
  return problem(413, "body-too-large", fmt::format("the request body exceeds {} bytes", limit));
}

Response headers_too_large(std::size_t limit) {
  return problem(431, "headers-too-large", fmt::format("the request headers exceed {} bytes", limit));
}

Response malformed_request(const boost::system::error_code& ec) {
  return problem(400, "invalid-request", fmt::format("the request is not valid HTTP/1.1: {}", ec.message()));
}

bool is_malformed(const boost::system::error_code& ec) {
  return &ec.category() == &bhttp::make_error_code(bhttp::error::bad_method).category() &&
         ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message;
}

}  // namespace gpunode::http::detail
