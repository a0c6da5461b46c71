#include "gpunode/json/strict.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/parse.hpp>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "gpunode/text/utf8.hpp"

namespace gpunode::json {
namespace {

namespace bj = boost::json;

// The first pass: sees every key as the parser unescapes it and every number as written.
class Checker {
 public:
  static constexpr std::size_t max_object_size = std::size_t(-1);
  static constexpr std::size_t max_array_size = std::size_t(-1);
  static constexpr std::size_t max_key_size = std::size_t(-1);
  static constexpr std::size_t max_string_size = std::size_t(-1);

  std::string problem;  // set when this handler stopped the parse

  bool on_document_begin(bj::error_code&) { return true; }
  bool on_document_end(bj::error_code&) { return true; }
  bool on_array_begin(bj::error_code&) {
    scopes_.emplace_back();
    return true;
  }
  bool on_array_end(std::size_t, bj::error_code&) {
    scopes_.pop_back();
    return true;
  }
  bool on_object_begin(bj::error_code&) {
    scopes_.emplace_back();
    return true;
  }
  bool on_object_end(std::size_t, bj::error_code&) {
    scopes_.pop_back();
    return true;
  }
  bool on_string_part(bj::string_view, std::size_t, bj::error_code&) { return true; }
  bool on_string(bj::string_view, std::size_t, bj::error_code&) { return true; }
  bool on_key_part(bj::string_view s, std::size_t, bj::error_code&) {
    key_.append(s.data(), s.size());
    return true;
  }
  bool on_key(bj::string_view s, std::size_t, bj::error_code& ec) {
    key_.append(s.data(), s.size());
    const bool fresh = scopes_.back().insert(key_).second;
    if (!fresh) return fail(ec, fmt::format("a key is repeated in one object: \"{}\"", key_));
    key_.clear();
    return true;
  }
  bool on_number_part(bj::string_view, bj::error_code&) { return true; }
  bool on_int64(std::int64_t, bj::string_view, bj::error_code&) { return true; }
  bool on_uint64(std::uint64_t, bj::string_view, bj::error_code&) { return true; }
  bool on_double(double d, bj::string_view text, bj::error_code& ec) {
    const std::string_view t(text.data(), text.size());
    if (t.find_first_of(".eE") == std::string_view::npos)
      return fail(ec, fmt::format("the integer {} is out of range", t));
    if (!std::isfinite(d)) return fail(ec, fmt::format("the number {} is out of range", t));
    return true;
  }
  bool on_bool(bool, bj::error_code&) { return true; }
  bool on_null(bj::error_code&) { return true; }
  bool on_comment_part(bj::string_view, bj::error_code&) { return true; }
  bool on_comment(bj::string_view, bj::error_code&) { return true; }

 private:
  bool fail(bj::error_code& ec, std::string why) {
    problem = std::move(why);
    ec = bj::make_error_code(bj::error::syntax);
    return false;
  }
  std::vector<std::set<std::string>> scopes_;  // arrays push an empty set that is never used
  std::string key_;
};

std::string describe(const bj::error_code& ec) {
  using E = bj::error;
  if (ec == E::exponent_overflow) return "a number is out of range";
  if (ec == E::too_deep) return "nesting is too deep";
  if (ec == E::syntax || ec == E::extra_data)
    return ec == E::extra_data ? "text after the JSON value" : "syntax error";
  if (ec == E::incomplete) return "the text ends inside a value";
  if (ec == E::illegal_leading_surrogate || ec == E::illegal_trailing_surrogate)
    return "a lone surrogate escape (\\uD800-\\uDFFF)";
  if (ec == E::expected_hex_digit) return "an invalid escape in a string";
  return ec.message();
}

text::TextError at(std::string_view text, std::size_t offset, std::string what) {
  text::TextError e{std::move(what), offset, 1, 1};
  for (std::size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++e.line;
      e.column = 1;
    } else {
      ++e.column;
    }
  }
  return e;
}

int hex4(std::string_view s, std::size_t at) {
  if (at + 4 > s.size()) return -1;
  int v = 0;
  for (std::size_t k = at; k < at + 4; ++k) {
    const char c = s[k];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

// The offset of a \u escape that is half of a surrogate pair without its other half, or npos.
// Boost.JSON 1.81 turns such an escape into U+FFFD, which would make it look like valid text.
// Runs on text the parser accepted, so strings and escapes are well formed.
std::size_t lone_surrogate(std::string_view t) {
  bool in_string = false;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (!in_string) {
      in_string = c == '"';
      continue;
    }
    if (c == '"') {
      in_string = false;
    } else if (c == '\\') {
      if (i + 1 < t.size() && t[i + 1] == 'u') {
        const int h = hex4(t, i + 2);
        if (h >= 0xDC00 && h <= 0xDFFF) return i;
        if (h >= 0xD800 && h <= 0xDBFF) {
          const bool paired = i + 7 < t.size() && t[i + 6] == '\\' && t[i + 7] == 'u' &&
                              hex4(t, i + 8) >= 0xDC00 && hex4(t, i + 8) <= 0xDFFF;
          if (!paired) return i;
          i += 6;
        }
        i += 5;
      } else {
        ++i;
      }
    }
  }
  return std::string_view::npos;
}

constexpr const char* kLone = "a lone surrogate escape (\\uD800-\\uDFFF without its pair)";

}  // namespace

std::expected<bj::value, text::TextError> parse_strict(std::string_view text, std::size_t max_depth) {
  if (auto bad = gpunode::text::invalid_utf8(text); bad != std::string_view::npos)
    return std::unexpected(at(text, bad, "invalid UTF-8"));
  bj::parse_options opt;
  opt.max_depth = max_depth;
  {
    bj::basic_parser<Checker> scanner(opt);
    bj::error_code ec;
    const std::size_t used = scanner.write_some(false, text.data(), text.size(), ec);
    if (ec && scanner.handler().problem.empty()) {
      // Boost.JSON calls a lone leading surrogate before a closing quote a syntax error: say what it is.
      if (auto lone = lone_surrogate(text.substr(0, std::min(text.size(), used + 1)));
          lone != std::string_view::npos) {
        return std::unexpected(at(text, lone, kLone));
      }
    }
    if (ec)
      return std::unexpected(
          at(text, used, scanner.handler().problem.empty() ? describe(ec) : scanner.handler().problem));
    if (used != text.size()) return std::unexpected(at(text, used, "text after the JSON value"));
  }
  if (auto lone = lone_surrogate(text); lone != std::string_view::npos) {
    return std::unexpected(at(text, lone, kLone));
  }
  bj::error_code ec;
  bj::value v = bj::parse(bj::string_view(text.data(), text.size()), ec, {}, opt);
  if (ec) return std::unexpected(at(text, 0, describe(ec)));
  return v;
}

}  // namespace gpunode::json
