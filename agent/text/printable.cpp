#include "gpunode/text/printable.hpp"

#include <fmt/format.h>

#include "gpunode/text/utf8.hpp"

namespace gpunode::text {

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
    const std::size_t n = c >= 0x80 ? utf8_sequence(s, i) : 0;
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
