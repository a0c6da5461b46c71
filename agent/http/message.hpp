// Between Beast's messages and the handler's Request and Response (private to agent/http).
// Plain functions, no I/O: session.cpp reads and writes, these say what is read and written.
#pragma once

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/system/error_code.hpp>
#include <cstddef>
#include <string>

#include "gpunode/http/server.hpp"

namespace gpunode::http::detail {

using BeastRequest = boost::beast::http::request<boost::beast::http::string_body>;
using BeastResponse = boost::beast::http::response<boost::beast::http::string_body>;

// The handler's Request for a request read whole: the target split at its first '?', field names
// lower-cased (in order), the body moved out, the client's X-Request-Id if sane, else a fresh one.
Request make_request(BeastRequest&& msg, const Peer& peer);

// Writes `r` into `res` with `status` (already checked to be 200..599): the handler's headers
// where valid, less Content-Length, Transfer-Encoding, X-Request-Id and Connection; X-Request-Id
// set to `request_id`; Content-Type defaulted to application/json; no body and no Content-Type for
// 204 and 304. Neither keep-alive nor the payload's size is set here. True when the handler asked
// for `Connection: close`.
bool fill_response(BeastResponse& res, unsigned status, Response&& r, const std::string& request_id);

// The answers the server gives itself.
Response body_too_large(std::size_t limit);                       // 413 body-too-large
Response headers_too_large(std::size_t limit);                    // 431 headers-too-large
Response malformed_request(const boost::system::error_code& ec);  // 400 invalid-request
// Whether a read failed because the request is not valid HTTP/1.1 (not a closed or cut stream).
bool is_malformed(const boost::system::error_code& ec);

}  // namespace gpunode::http::detail
