// Strict JSON text (CONTRACT §7 JSON bodies): what is refused, and that the error says where.
#include "gpunode/json/strict.hpp"

#include <doctest/doctest.h>

#include <string>

using gpunode::json::parse_strict;

namespace {

std::string error_of(std::string_view text, std::size_t depth = 64) {
  auto v = parse_strict(text, depth);
  return v ? std::string("ok") : v.error().to_string();
}

}  // namespace

TEST_CASE("strict JSON: valid text parses") {
  auto v =
      parse_strict(R"({"a":[1,-2,3.5e10,18446744073709551615],"b":{"c":"\u00e9\ud83d\ude00"},"d":null})");
  REQUIRE(v);
  CHECK(v->at("b").at("c").as_string() == "\xC3\xA9\xF0\x9F\x98\x80");
}

TEST_CASE("strict JSON: refused, with line, column and byte offset") {
  CHECK(error_of(R"({"endsAt":"A","endsAt":"B"})") ==
        R"(line 1, column 22 (byte 21): a key is repeated in one object: "endsAt")");
  CHECK(error_of("{\"a\":\"x\",\n \"\\u0061\":1}").find("line 2") !=
        std::string::npos);                                 // the same key once unescaped
  CHECK(error_of(R"({"a":{"k":1},"b":{"k":1}})") == "ok");  // one key per object, not per document
  CHECK(error_of(R"([{"k":1},{"k":2}])") == "ok");
  CHECK(error_of("{\"a\":\"\xff\"}") == "line 1, column 7 (byte 6): invalid UTF-8");
  CHECK(error_of("{\"a\":\"\xc0\xaf\"}").find("invalid UTF-8") != std::string::npos);  // overlong
  CHECK(error_of("{\"a\":\"\xed\xa0\x80\"}").find("invalid UTF-8") !=
        std::string::npos);  // an encoded surrogate
  CHECK(error_of(R"({"a":"\ud800"})").find("lone surrogate") != std::string::npos);
  CHECK(error_of(R"({"a":"\udc00x"})").find("lone surrogate") != std::string::npos);
  CHECK(error_of(R"({"a":"\ud800\u0041"})").find("lone surrogate") != std::string::npos);
  CHECK(error_of(R"({"a":"x\\ud800"})") == "ok");  // an escaped backslash, then text
  CHECK(error_of(R"({"n":123456789012345678901234567890})").find("out of range") != std::string::npos);
  CHECK(error_of(R"({"n":1e400})").find("out of range") != std::string::npos);
  CHECK(error_of(R"({"n":-1e400})").find("out of range") != std::string::npos);
  CHECK(error_of(std::string(65, '[') + std::string(65, ']')).find("too deep") != std::string::npos);
  CHECK(error_of(std::string(64, '[') + std::string(64, ']')) == "ok");
  CHECK(error_of("{\"a\":1,}").find("syntax error") != std::string::npos);
  CHECK(error_of("{\"a\":1} x").find("text after") != std::string::npos);
  CHECK(error_of("{\"a\":\n  tru").find("line 2") != std::string::npos);
  CHECK(error_of("{\"a\":1 /* c */}").find("syntax") != std::string::npos);
}
