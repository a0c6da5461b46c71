// gpunode/store/canonical_json.hpp: the one serialization the audit hash is taken over (CONTRACT §4).
//
// canonical_json(v) is byte for byte what Python writes for
//   json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
// keys sorted by Unicode code point at every level (for valid UTF-8 that is plain byte order), no
// whitespace, strings escaped as Python escapes them (\" \\ \n \r \t \b \f, every other control
// below 0x20 as \u00xx in lower-case hex, everything else, DEL and non-ASCII included, as raw UTF-8),
// integers in decimal, true/false/null.
//
// It refuses, with a message naming the JSON path, what it cannot promise to match: a double
// (Python's float repr is not reproduced here; audit records never hold one) and a string or key
// that is not valid UTF-8 (overlong forms, surrogates and code points past U+10FFFF included).
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <expected>
#include <optional>
#include <string>
#include <string_view>

#include "gpunode/error/error.hpp"

namespace gpunode::store {

error::Result<std::string> canonical_json(const boost::json::value& value);

// The same for an object, without copying it; `omit_key`, when given, is left out at the top level
// (the audit hash is taken over the record without its "hash").
error::Result<std::string> canonical_json(const boost::json::object& object,
                                          std::optional<std::string_view> omit_key = std::nullopt);

// True when `text` is well-formed UTF-8 (RFC 3629: no overlongs, no surrogates, at most U+10FFFF).
bool is_valid_utf8(std::string_view text);

}  // namespace gpunode::store
