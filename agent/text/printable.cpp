#include "gpunode/text/printable.hpp"

#include <fmt/format.h>

namespace gpunode::text {
namespace {

// The length of the well-formed UTF-8 sequence of 2 to 4 bytes at s[i] (RFC 3629: no overlongs,
// no surrogates, nothing past U+10FFFF), else 0.
std::size_t multibyte_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = b(i);
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xbf;
  if (lead >= 0xc2 && lead <= 0xdf)
    n = 2;
  else if (lead == 0xe0)
    n = 3, lo = 0xa0;
  else if (lead == 0xed)
    n = 3, hi = 0x9f;
  else if (lead >= 0xe1 && lead <= 0xef)
    n = 3;
  else if (lead == 0xf0)
    n = 4, lo = 0x90;
  else if (lead >= 0xf1 && lead <= 0xf3)
    n = 4;
  else if (lead == 0xf4)
    n = 4, hi = 0x8f;
  else
    return 0;
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xbf) return 0;
  }
  return n;
}

}  // namespace

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      if (c == '\\') out.push_back('\\');
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    const std::size_t n = c >= 0x80 ? multibyte_length(s, i) : 0;
    // U+0080..U+009F (C2 80..C2 9F) are the C1 controls: CSI (U+009B) starts an escape sequence.
    const bool c1 = n == 2 && c == 0xc2 && static_cast<unsigned char>(s[i + 1]) <= 0x9f;
    if (n == 0 || c1) {
      for (std::size_t k = 0; k < (c1 ? 2 : 1); ++k)
        out += fmt::format("\\x{:02x}", static_cast<unsigned char>(s[i + k]));
      i += c1 ? 2 : 1;
      continue;
    }
    out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace gpunode::text
