// Canonical JSON (see the header). One recursive writer; the first refusal stops it.
#include "gpunode/store/canonical_json.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/string.hpp>
#include <charconv>
#include <cstdint>
#include <optional>
#include <vector>

namespace gpunode::store {
namespace {

std::uint8_t byte_at(std::string_view text, std::size_t i) {
  return static_cast<std::uint8_t>(text[i]);
}

// Byte order of UTF-8 equals code point order, which is how Python sorts str keys.
bool key_less(std::string_view a, std::string_view b) {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return static_cast<unsigned char>(x) < static_cast<unsigned char>(y);
  });
}

void append_escaped(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (u < 0x20) {
          out += "\\u00";
          out.push_back(kHex[u >> 4]);
          out.push_back(kHex[u & 0x0f]);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

template <class Int>
void append_integer(std::string& out, Int n) {
  char buf[24];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, n);
  (void)ec;  // 24 bytes hold any 64-bit integer
  out.append(buf, end);
}

class Writer {
 public:
  std::string out;
  std::string error;

  bool write(const boost::json::value& v, std::string& path) {
    switch (v.kind()) {
      case boost::json::kind::null:
        out += "null";
        return true;
      case boost::json::kind::bool_:
        out += v.get_bool() ? "true" : "false";
        return true;
      case boost::json::kind::int64:
        append_integer(out, v.get_int64());
        return true;
      case boost::json::kind::uint64:
        append_integer(out, v.get_uint64());
        return true;
      case boost::json::kind::double_:
        error =
            fmt::format("{}: a floating-point number has no canonical form here (use an integer or a string)",
                        path_or_root(path));
        return false;
      case boost::json::kind::string: {
        const auto s = std::string_view(v.get_string());
        if (!is_valid_utf8(s)) {
          error = fmt::format("{}: string is not valid UTF-8", path_or_root(path));
          return false;
        }
        append_escaped(out, s);
        return true;
      }
      case boost::json::kind::array:
        return write_array(v.get_array(), path);
      case boost::json::kind::object:
        return write_object(v.get_object(), path);
    }
    error = fmt::format("{}: unknown JSON kind", path_or_root(path));
    return false;
  }

  static std::string path_or_root(const std::string& path) {
    return path.empty() ? std::string("$") : "$" + path;
  }

  bool write_array(const boost::json::array& a, std::string& path) {
    out.push_back('[');
    const auto base = path.size();
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (i != 0) out.push_back(',');
      path += fmt::format("[{}]", i);
      if (!write(a[i], path)) return false;
      path.resize(base);
    }
    out.push_back(']');
    return true;
  }

  bool write_object(const boost::json::object& o, std::string& path, const std::string_view* omit = nullptr) {
    std::vector<const boost::json::key_value_pair*> members;
    members.reserve(o.size());
    for (const auto& kv : o) {
      if (omit == nullptr || kv.key() != *omit) members.push_back(&kv);
    }
    for (const auto* kv : members) {
      if (!is_valid_utf8(kv->key())) {
        error = fmt::format("{}: a key is not valid UTF-8", path_or_root(path));
        return false;
      }
    }
    std::sort(members.begin(), members.end(),
              [](const auto* a, const auto* b) { return key_less(a->key(), b->key()); });
    out.push_back('{');
    const auto base = path.size();
    bool first = true;
    for (const auto* kv : members) {
      if (!first) out.push_back(',');
      first = false;
      append_escaped(out, kv->key());
      out.push_back(':');
      path += ".";
      path += kv->key();
      if (!write(kv->value(), path)) return false;
      path.resize(base);
    }
    out.push_back('}');
    return true;
  }
};

}  // namespace

bool is_valid_utf8(std::string_view text) {
  std::size_t i = 0;
  const std::size_t n = text.size();
  while (i < n) {
    const std::uint8_t b0 = byte_at(text, i);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint8_t lo = 0x80;  // allowed range of the second byte (RFC 3629 table 3-7)
    std::uint8_t hi = 0xbf;
    if (b0 >= 0xc2 && b0 <= 0xdf) {
      len = 2;
    } else if (b0 == 0xe0) {
      len = 3;
      lo = 0xa0;
    } else if ((b0 >= 0xe1 && b0 <= 0xec) || b0 == 0xee || b0 == 0xef) {
      len = 3;
    } else if (b0 == 0xed) {
      len = 3;
      hi = 0x9f;  // no UTF-16 surrogates
    } else if (b0 == 0xf0) {
      len = 4;
      lo = 0x90;
    } else if (b0 >= 0xf1 && b0 <= 0xf3) {
      len = 4;
    } else if (b0 == 0xf4) {
      len = 4;
      hi = 0x8f;  // at most U+10FFFF
    } else {
      return false;  // continuation byte, 0xc0/0xc1 (overlong) or 0xf5..0xff
    }
    if (n - i < len) return false;
    const std::uint8_t b1 = byte_at(text, i + 1);
    if (b1 < lo || b1 > hi) return false;
    for (std::size_t k = 2; k < len; ++k) {
      const std::uint8_t bk = byte_at(text, i + k);
      if (bk < 0x80 || bk > 0xbf) return false;
    }
    i += len;
  }
  return true;
}

std::expected<std::string, std::string> canonical_json(const boost::json::value& value) {
  Writer w;
  std::string path;
  if (!w.write(value, path)) return std::unexpected(std::move(w.error));
  return std::move(w.out);
}

std::expected<std::string, std::string> canonical_json(const boost::json::object& object,
                                                       std::optional<std::string_view> omit_key) {
  Writer w;
  std::string path;
  const std::string_view* omit = omit_key ? &*omit_key : nullptr;
  if (!w.write_object(object, path, omit)) return std::unexpected(std::move(w.error));
  return std::move(w.out);
}

}  // namespace gpunode::store
