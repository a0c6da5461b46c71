#include "gpunode/text/printable.hpp"

#include <fmt/format.h>

#include "gpunode/text/utf8.hpp"

namespace gpunode::text {
namespace {

void append_escape(std::string& out, unsigned char b, Escapes escapes) {
  if (escapes == Escapes::c_string) {
    switch (b) {
      case '\n':
        out += "\\n";
        return;
      case '\t':
        out += "\\t";
        return;
      case '\r':
        out += "\\r";
        return;
      default:
        break;
    }
  }
  out += fmt::format("\\x{:02x}", b);
}

}  // namespace

std::size_t append_printable(std::string& out, std::string_view s, Escapes escapes, std::size_t limit) {
  std::size_t i = 0;
  while (i < s.size() && i < limit) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      if (c == '\\' || (c == '"' && escapes == Escapes::c_string)) out.push_back('\\');
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    const std::size_t n = c >= 0x80 ? utf8_sequence(s, i) : 0;
    // U+0080..U+009F (C2 80..C2 9F) are the C1 controls: CSI (U+009B) starts an escape sequence.
    // Their lead byte is escaped here, the byte after it as the stray continuation byte it becomes.
    const bool c1 = n == 2 && c == 0xc2 && static_cast<unsigned char>(s[i + 1]) <= 0x9f;
    if (n == 0 || c1) {
      append_escape(out, c, escapes);
      ++i;
      continue;
    }
    out.append(s.substr(i, n));
    i += n;
  }
  return i;
}

std::string printable(std::string_view s, Escapes escapes) {
  std::string out;
  out.reserve(s.size());
  append_printable(out, s, escapes, s.size());
  return out;
}

}  // namespace gpunode::text
