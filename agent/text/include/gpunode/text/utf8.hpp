// gpunode/text/utf8.hpp: the one UTF-8 decoder (RFC 3629: no overlong forms, no UTF-16 surrogates,
// nothing above U+10FFFF), shared by the strict JSON parser, canonical JSON, the sysfs reader's
// text, printable() and the config file's checks.
#pragma once

#include <cstddef>
#include <string_view>

namespace gpunode::text {

// The length (1 to 4) of the well-formed UTF-8 sequence that starts at text[at], or 0 if none does
// (a stray continuation byte, 0xC0/0xC1, 0xF5..0xFF, a truncated or malformed sequence).
std::size_t utf8_sequence(std::string_view text, std::size_t at);

// The offset of the first byte that is not part of well-formed UTF-8, or npos.
std::size_t invalid_utf8(std::string_view text);

}  // namespace gpunode::text
