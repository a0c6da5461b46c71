// Internal: text helpers for config problems (quoting values, spotting binary input, suggesting
// the key that was meant). Pure functions, no exceptions.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "gpunode/text/text_error.hpp"

namespace gpunode::config::text {

// `s` in double quotes, escaped as gpunode::text::printable does with C's escapes (`"`, `\`, \t,
// \n, \r; \xNN for the other controls and bytes that are not UTF-8); long text is cut to its
// first 60 bytes (at a character boundary) followed by "...". Messages from yaml-cpp, which may
// hold a byte of a multi-byte character, take gpunode::text::printable(s, Escapes::c_string)
// whole.
std::string quote(std::string_view s);

// Where and why a file is not UTF-8 text YAML can hold: invalid UTF-8, or a control character
// other than tab, LF and CR. Line and column are 1-based; the column counts bytes, as
// yaml-cpp's marks do.
std::optional<gpunode::text::TextError> find_binary(std::string_view s);

// Optimal string alignment distance (Levenshtein plus adjacent transpositions).
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate `word` was most likely meant to be, if one is close enough; else empty.
std::string_view closest(std::string_view word, std::span<const std::string_view> candidates);

// Where the first tab in the leading whitespace of 1-based `line` is (1-based column), if any.
std::optional<int> indentation_tab(std::string_view s, int line);

}  // namespace gpunode::config::text
