#include "gpunode/text/utf8.hpp"

namespace gpunode::text {

std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  std::size_t n = 0;              // continuation bytes
  unsigned lo = 0x80, hi = 0xBF;  // the allowed range of the second byte (RFC 3629 table)
  if (c >= 0xC2 && c <= 0xDF)
    n = 1;
  else if (c == 0xE0)
    n = 2, lo = 0xA0;  // no overlong forms
  else if (c == 0xED)
    n = 2, hi = 0x9F;  // no UTF-16 surrogates
  else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
    n = 2;
  else if (c == 0xF0)
    n = 3, lo = 0x90;
  else if (c >= 0xF1 && c <= 0xF3)
    n = 3;
  else if (c == 0xF4)
    n = 3, hi = 0x8F;  // at most U+10FFFF
  else
    return 0;
  for (std::size_t k = 1; k <= n; ++k) {
    if (i + k >= s.size()) return 0;
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
  }
  return n + 1;
}

std::size_t invalid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto n = utf8_sequence(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

}  // namespace gpunode::text
