// gpunode/json/strict.hpp: JSON text as the agent accepts it from outside (CONTRACT §7 JSON bodies).
//
// RFC 8259 and nothing more (no comments, no trailing commas, UTF-8 only), and also refused:
// a key repeated in one object (Boost.JSON would keep the last; "a" and "\u0061" are the same key),
// a lone surrogate escape, an integer that fits neither int64 nor uint64, a number that overflows
// a double, and nesting deeper than `max_depth`. An error says what and where: the line and column
// (1-based, in bytes) and the byte offset, as a text::TextError. Request bodies and token parts are parsed
// here; no other JSON from outside is.
#pragma once

#include <boost/json/value.hpp>
#include <cstddef>
#include <expected>
#include <string>
#include <string_view>

#include "gpunode/text/text_error.hpp"

namespace gpunode::json {

std::expected<boost::json::value, text::TextError> parse_strict(std::string_view text,
                                                                std::size_t max_depth = 64);

}  // namespace gpunode::json
