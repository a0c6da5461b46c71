// Text helpers for config problems.
#include "text.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "gpunode/text/ascii.hpp"
#include "gpunode/text/printable.hpp"
#include "gpunode/text/utf8.hpp"

namespace gpunode::config::text {
namespace {

constexpr std::size_t kQuoteLimit = 60;

unsigned char byte_at(std::string_view s, std::size_t i) {
  return static_cast<unsigned char>(s[i]);
}

// C0 controls other than tab, LF and CR; DEL; C1 controls other than NEL (U+0085). YAML allows
// none of them in a stream.
bool is_forbidden_control(std::string_view s, std::size_t i, std::size_t length) {
  const unsigned char b = byte_at(s, i);
  if (length == 1) return (b < 0x20 && b != '\t' && b != '\n' && b != '\r') || b == 0x7f;
  if (length == 2 && b == 0xc2) {
    const unsigned char next = byte_at(s, i + 1);
    return next >= 0x80 && next <= 0x9f && next != 0x85;
  }
  return false;
}

}  // namespace

std::string quote(std::string_view s) {
  std::string out = "\"";
  const std::size_t taken =
      gpunode::text::append_printable(out, s, gpunode::text::Escapes::c_string, kQuoteLimit);
  out += '"';
  if (taken < s.size()) out += "...";
  return out;
}

std::optional<gpunode::text::TextError> find_binary(std::string_view s) {
  std::size_t line = 1;
  std::size_t column = 1;
  std::size_t i = s.starts_with("\xef\xbb\xbf") ? 3 : 0;  // yaml-cpp's columns do not count a BOM
  while (i < s.size()) {
    const std::size_t length = gpunode::text::utf8_sequence(s, i);
    if (length == 0) {
      return gpunode::text::TextError{
          fmt::format("invalid UTF-8 (byte 0x{:02x}): a config file must be UTF-8 text", byte_at(s, i)), i,
          line, column};
    }
    if (is_forbidden_control(s, i, length)) {
      const unsigned code = length == 1 ? byte_at(s, i) : byte_at(s, i + 1);
      return gpunode::text::TextError{fmt::format("control character U+{:04X} is not allowed in YAML", code),
                                      i, line, column};
    }
    if (s[i] == '\n') {
      ++line;
      column = 1;
    } else {
      column += length;
    }
    i += length;
  }
  return std::nullopt;
}

std::size_t edit_distance(std::string_view a, std::string_view b) {
  const std::size_t width = b.size() + 1;
  std::vector<std::size_t> d((a.size() + 1) * width);
  auto at = [&](std::size_t i, std::size_t j) -> std::size_t& { return d[i * width + j]; };
  for (std::size_t i = 0; i <= a.size(); ++i) at(i, 0) = i;
  for (std::size_t j = 0; j <= b.size(); ++j) at(0, j) = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      at(i, j) = std::min({at(i - 1, j) + 1, at(i, j - 1) + 1, at(i - 1, j - 1) + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        at(i, j) = std::min(at(i, j), at(i - 2, j - 2) + 1);
      }
    }
  }
  return at(a.size(), b.size());
}

std::string_view closest(std::string_view word, std::span<const std::string_view> candidates) {
  if (word.size() > 64) return {};
  const std::string wanted = gpunode::text::ascii_lower(word);
  std::string_view best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (std::string_view candidate : candidates) {
    const std::size_t limit = candidate.size() <= 3 ? 1 : 2;
    const std::size_t distance = edit_distance(wanted, candidate);
    if (distance <= limit && distance < best_distance) {
      best = candidate;
      best_distance = distance;
    }
  }
  return best;
}

std::optional<int> indentation_tab(std::string_view s, int line) {
  std::size_t start = 0;
  for (int current = 1; current < line; ++current) {
    start = s.find('\n', start);
    if (start == std::string_view::npos) return std::nullopt;
    ++start;
  }
  for (std::size_t i = start; i < s.size() && (s[i] == ' ' || s[i] == '\t'); ++i) {
    if (s[i] == '\t') return static_cast<int>(i - start) + 1;
  }
  return std::nullopt;
}

}  // namespace gpunode::config::text
