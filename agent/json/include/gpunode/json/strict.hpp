// gpunode/json/strict.hpp: JSON text as the agent accepts it from outside (CONTRACT §7 JSON bodies).
//
// RFC 8259 and nothing more (no comments, no trailing commas, UTF-8 only), and also refused:
// a key repeated in one object (Boost.JSON would keep the last; "a" and "\u0061" are the same key),
// a lone surrogate escape, an integer that fits neither int64 nor uint64, a number that overflows
// a double, and nesting deeper than `max_depth`. An error says what and where: the line and column
// (1-based, in bytes) and the byte offset. Request bodies and token parts are parsed here; no other
// JSON from outside is.
#pragma once

#include <boost/json/value.hpp>
#include <cstddef>
#include <expected>
#include <string>
#include <string_view>

namespace gpunode::json {

struct TextError {
  std::string what;  // "a key is repeated: \"endsAt\"", "invalid UTF-8", ...
  std::size_t offset = 0;
  std::size_t line = 1, column = 1;
  [[nodiscard]] std::string to_string()
      const;  // "line 1, column 25 (byte 24): a key is repeated: \"endsAt\""
};

std::expected<boost::json::value, TextError> parse_strict(std::string_view text, std::size_t max_depth = 64);

}  // namespace gpunode::json
