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

#include "gpunode/text/utf8.hpp"

namespace gpunode::store {
namespace {

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
  return gpunode::text::invalid_utf8(text) == std::string_view::npos;
}

error::Result<std::string> canonical_json(const boost::json::value& value) {
  Writer w;
  std::string path;
  if (!w.write(value, path)) return error::fail(error::Errc::invalid, std::move(w.error));
  return std::move(w.out);
}

error::Result<std::string> canonical_json(const boost::json::object& object,
                                          std::optional<std::string_view> omit_key) {
  Writer w;
  std::string path;
  const std::string_view* omit = omit_key ? &*omit_key : nullptr;
  if (!w.write_object(object, path, omit)) return error::fail(error::Errc::invalid, std::move(w.error));
  return std::move(w.out);
}

}  // namespace gpunode::store
