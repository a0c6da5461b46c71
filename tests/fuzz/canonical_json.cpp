// Fuzz target: the canonical JSON serializer (gpunode::store::canonical_json) over JSON text as
// the agent takes it from outside (gpunode::json::parse_strict).
//
// Properties, for every input the strict parser accepts:
// - canonical_json refuses only a value holding a double (strict text is valid UTF-8);
// - parse -> canonical -> parse is the identity, and canonical is a fixed point
//   (canonical(parse(canonical(v))) == canonical(v));
// - every object of the canonical text has its keys in strictly increasing byte order, and the
//   text holds no whitespace outside strings.
#include "gpunode/store/canonical_json.hpp"

#include <boost/json/value.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "gpunode/json/strict.hpp"

namespace {

namespace bj = boost::json;
using gpunode::fuzz::check;

bool holds_double(const bj::value& v) {
  switch (v.kind()) {
    case bj::kind::double_:
      return true;
    case bj::kind::array:
      for (const auto& e : v.get_array())
        if (holds_double(e)) return true;
      return false;
    case bj::kind::object:
      for (const auto& kv : v.get_object())
        if (holds_double(kv.value())) return true;
      return false;
    default:
      return false;
  }
}

bool byte_less(std::string_view a, std::string_view b) {
  const std::size_t n = a.size() < b.size() ? a.size() : b.size();
  for (std::size_t i = 0; i < n; ++i) {
    const auto x = static_cast<unsigned char>(a[i]);
    const auto y = static_cast<unsigned char>(b[i]);
    if (x != y) return x < y;
  }
  return a.size() < b.size();
}

void check_sorted(const bj::value& v) {
  if (v.is_array()) {
    for (const auto& e : v.get_array()) check_sorted(e);
  } else if (v.is_object()) {
    const bj::object& o = v.get_object();
    std::string_view previous;
    bool first = true;
    for (const auto& kv : o) {
      check(first || byte_less(previous, kv.key()),
            "canonical keys are not in strictly increasing byte order", kv.key());
      first = false;
      previous = kv.key();
      check_sorted(kv.value());
    }
  }
}

void check_no_whitespace(std::string_view text) {
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      check(static_cast<unsigned char>(c) >= 0x20, "a raw control character inside a canonical string");
    } else if (c == '"') {
      in_string = true;
    } else {
      check(c != ' ' && c != '\n' && c != '\t' && c != '\r', "whitespace outside strings in canonical text",
            text);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = gpunode::json::parse_strict(text);
  if (!parsed) {
    check(!parsed.error().what.empty(), "a refusal without a message");
    return 0;
  }
  auto canonical = gpunode::store::canonical_json(*parsed);
  if (!canonical) {
    check(holds_double(*parsed), "canonical_json refused a value without a double", canonical.error().detail);
    return 0;
  }
  check(!holds_double(*parsed), "canonical_json accepted a double");
  check(gpunode::store::is_valid_utf8(*canonical), "canonical text is not valid UTF-8", *canonical);
  check_no_whitespace(*canonical);

  auto again = gpunode::json::parse_strict(*canonical);
  check(again.has_value(), "the strict parser refuses canonical text",
        again ? std::string_view{} : std::string_view{again.error().what});
  check(*again == *parsed, "parse -> canonical -> parse is not the identity", *canonical);
  check_sorted(*again);

  auto twice = gpunode::store::canonical_json(*again);
  check(twice.has_value() && *twice == *canonical, "canonical_json is not a fixed point", *canonical);
  return 0;
}
