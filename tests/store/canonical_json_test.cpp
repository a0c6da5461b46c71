// canonical_json: a table of inputs with the bytes Python's
//   json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
// wrote for them (generated once with Python 3.11 and pasted here; the live cross-check is the
// store.python_hash test), then what it must refuse.
#include "gpunode/store/canonical_json.hpp"

#include <doctest/doctest.h>

#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <string>

namespace json = boost::json;
using gpunode::store::canonical_json;
using gpunode::store::is_valid_utf8;

namespace {

struct Case {
  const char* name;
  const char* input;     // JSON text, parsed by Boost.JSON
  const char* expected;  // Python's output, UTF-8
};

const Case kCases[] = {
    {"empty object", "{}", "{}"},
    {"empty array", "[]", "[]"},
    {"empty string", "\"\"", "\"\""},
    {"top-level scalars: string", "\"abc\"", "\"abc\""},
    {"top-level int", "42", "42"},
    {"true", "true", "true"},
    {"false", "false", "false"},
    {"null", "null", "null"},
    {"whitespace dropped", " { \"a\" : [ 1 , 2 ] , \"b\" : { } } ", "{\"a\":[1,2],\"b\":{}}"},
    {"nested sorting at every level",
     "{\"b\":1,\"a\":{\"d\":[],\"c\":{\"z\":[{\"y\":1,\"x\":2}],\"a\":null}}}",
     "{\"a\":{\"c\":{\"a\":null,\"z\":[{\"x\":2,\"y\":1}]},\"d\":[]},\"b\":1}"},
    {"arrays keep their order", "[3,{\"z\":null,\"y\":true,\"x\":false},[2,1]]",
     "[3,{\"x\":false,\"y\":true,\"z\":null},[2,1]]"},
    {"keys by code point",
     "{\"\\u00e9\":1,\"z\":2,\"Z\":3,\"a\":4,\"\\u00ff\":5,\"\\u0100\":6,\"\\ud83d\\ude00\":7,\"\\uffff\":8,"
     "\"\":9,\"aa\":10,\"a\\u0000\":11,\"a\":12}",
     "{\"\":9,\"Z\":3,\"a\":12,\"a\\u0000\":11,\"aa\":10,\"z\":2,\"\303\251\":1,\"\303\277\":5,\"\304\200\":"
     "6,\"\357\277\277\":8,\"\360\237\230\200\":7}"},
    {"keys needing escapes sort by their raw code point", "{\"\\\\\":3,\"\\\"\":2,\"\\n\":1,\"\\u001f\":0}",
     "{\"\\n\":1,\"\\u001f\":0,\"\\\"\":2,\"\\\\\":3}"},
    {"every control character",
     "\"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\u0008\\u0009\\u000a\\u000b\\u000c\\u000d\\u"
     "000e\\u000f\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019\\u001a\\u001b\\u001c"
     "\\u001d\\u001e\\u001f\"",
     "\"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b\\f\\r\\u000e\\u000f\\u0010\\"
     "u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017\\u0018\\u0019\\u001a\\u001b\\u001c\\u001d\\u001e\\u001f"
     "\""},
    {"quote, backslash, slash", "\"a\\\"b\\\\c\\/d\"", "\"a\\\"b\\\\c/d\""},
    {"DEL stays raw", "\"x\\u007fy\"", "\"x\177y\""},
    {"non-ASCII stays raw", "\"caf\\u00e9 \\u4e2d\\u6587 \\u043f\\u0440\\u0438\"",
     "\"caf\303\251 \344\270\255\346\226\207 \320\277\321\200\320\270\""},
    {"emoji from a surrogate pair", "\"\\ud83d\\ude00\\ud83d\\ude80\"",
     "\"\360\237\230\200\360\237\232\200\""},
    {"emoji raw", "\"\360\237\221\251\342\200\215\360\237\224\254\"",
     "\"\360\237\221\251\342\200\215\360\237\224\254\""},
    {"line and paragraph separators raw", "\"\\u2028\\u2029\"", "\"\342\200\250\342\200\251\""},
    {"edge code points", "\"\\u0080\\u07ff\\u0800\\uffff\\udbff\\udfff\"",
     "\"\302\200\337\277\340\240\200\357\277\277\364\217\277\277\""},
    {"large and negative ints",
     "[0,-1,9223372036854775807,-9223372036854775808,18446744073709551615,1000000]",
     "[0,-1,9223372036854775807,-9223372036854775808,18446744073709551615,1000000]"},
    {"an audit record",
     "{\"id\":\"aud_1\",\"at\":\"2027-01-31T00:00:00Z\",\"actor\":{\"sub\":\"gpunode-agent\",\"org\":null,"
     "\"roles\":[],\"via\":\"agent\"},\"action\":\"reservation.activate\",\"nodeId\":\"node-a\","
     "\"reservationId\":\"rsv_1\",\"unitIds\":[\"u-0000-41-00-0\"],\"vmIds\":[],\"result\":\"ok\",\"detail\":"
     "\"\",\"requestId\":null,\"prevHash\":"
     "\"0000000000000000000000000000000000000000000000000000000000000000\"}",
     "{\"action\":\"reservation.activate\",\"actor\":{\"org\":null,\"roles\":[],\"sub\":\"gpunode-agent\","
     "\"via\":\"agent\"},\"at\":\"2027-01-31T00:00:00Z\",\"detail\":\"\",\"id\":\"aud_1\",\"nodeId\":\"node-"
     "a\",\"prevHash\":\"0000000000000000000000000000000000000000000000000000000000000000\",\"requestId\":"
     "null,\"reservationId\":\"rsv_1\",\"result\":\"ok\",\"unitIds\":[\"u-0000-41-00-0\"],\"vmIds\":[]}"},
};

json::value parse(const char* text) {
  boost::system::error_code ec;
  auto v = json::parse(text, ec);
  REQUIRE_MESSAGE(!ec, "test input does not parse: " << text);
  return v;
}

}  // namespace

TEST_CASE("canonical_json matches Python byte for byte") {
  for (const auto& c : kCases) {
    CAPTURE(c.name);
    auto got = canonical_json(parse(c.input));
    REQUIRE_MESSAGE(got.has_value(), (got ? "" : got.error().detail));
    CHECK(*got == std::string(c.expected));
  }
}

TEST_CASE("canonical_json: escapes of each control character, one at a time") {
  // Python: \b \t \n \f \r by name, every other control as \u00xx in lower-case hex.
  const char* const expected[0x20] = {
      "\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005", "\\u0006", "\\u0007",
      "\\b",     "\\t",     "\\n",     "\\u000b", "\\f",     "\\r",     "\\u000e", "\\u000f",
      "\\u0010", "\\u0011", "\\u0012", "\\u0013", "\\u0014", "\\u0015", "\\u0016", "\\u0017",
      "\\u0018", "\\u0019", "\\u001a", "\\u001b", "\\u001c", "\\u001d", "\\u001e", "\\u001f"};
  for (int c = 0; c < 0x20; ++c) {
    CAPTURE(c);
    const std::string s(1, static_cast<char>(c));
    auto got = canonical_json(json::value(json::string(s)));
    REQUIRE(got.has_value());
    CHECK(*got == "\"" + std::string(expected[c]) + "\"");
  }
}

TEST_CASE("canonical_json: key order does not depend on insertion order") {
  json::object a;
  a["b"] = 1;
  a["a"] = json::object{{"y", 1}, {"x", 2}};
  json::object b;
  b["a"] = json::object{{"x", 2}, {"y", 1}};
  b["b"] = 1;
  auto ca = canonical_json(json::value(a));
  auto cb = canonical_json(json::value(b));
  REQUIRE(ca.has_value());
  REQUIRE(cb.has_value());
  CHECK(*ca == *cb);
  CHECK(*ca == R"({"a":{"x":2,"y":1},"b":1})");
}

TEST_CASE("canonical_json: the object overload can leave one top-level key out") {
  json::object r{{"hash", "abc"}, {"id", "aud_1"}, {"inner", json::object{{"hash", 1}}}};
  auto without = canonical_json(r, std::string_view("hash"));
  REQUIRE(without.has_value());
  CHECK(*without == R"({"id":"aud_1","inner":{"hash":1}})");
  auto with = canonical_json(r);
  REQUIRE(with.has_value());
  CHECK(*with == R"({"hash":"abc","id":"aud_1","inner":{"hash":1}})");
}

TEST_CASE("canonical_json refuses doubles, naming where") {
  auto top = canonical_json(json::value(1.5));
  REQUIRE_FALSE(top.has_value());
  CHECK(top.error().detail.find("$:") == 0);
  CHECK(top.error().detail.find("floating-point") != std::string::npos);

  auto nested = canonical_json(parse(R"({"a":[1,{"b":2.0}]})"));
  REQUIRE_FALSE(nested.has_value());
  CHECK(nested.error().detail.find("$.a[1].b") == 0);

  // 1e3 and 1.0 are doubles to Boost.JSON: refused rather than guessed (Python would print 1000.0).
  CHECK_FALSE(canonical_json(parse("[1e3]")).has_value());
  CHECK_FALSE(canonical_json(parse("[-0.0]")).has_value());
}

TEST_CASE("canonical_json refuses invalid UTF-8 in values and keys") {
  const char* const bad[] = {
      "\xff",              // never valid
      "\x80",              // lone continuation byte
      "\xc0\x80",          // overlong NUL
      "\xc1\xbf",          // overlong
      "\xe0\x80\xaf",      // overlong 3-byte
      "\xed\xa0\x80",      // UTF-16 surrogate D800
      "\xed\xbf\xbf",      // surrogate DFFF
      "\xf0\x80\x80\x80",  // overlong 4-byte
      "\xf4\x90\x80\x80",  // past U+10FFFF
      "\xf5\x80\x80\x80",  // lead byte past F4
      "\xe2\x82",          // truncated
      "ok\xe2",            // truncated at the end
      "\xe2\x28\xa1",      // bad continuation
  };
  for (const char* b : bad) {
    const std::string s(b);
    CAPTURE(s.size());
    CHECK_FALSE(is_valid_utf8(s));
    auto as_value = canonical_json(json::value(json::array{json::string(s)}));
    REQUIRE_FALSE(as_value.has_value());
    CHECK(as_value.error().detail.find("$[0]: string is not valid UTF-8") == 0);
    json::object o;
    o[s] = 1;
    auto as_key = canonical_json(json::value(json::object{{"outer", o}}));
    REQUIRE_FALSE(as_key.has_value());
    CHECK(as_key.error().detail.find("$.outer: a key is not valid UTF-8") == 0);
  }
}

TEST_CASE("is_valid_utf8 accepts every boundary of well-formed UTF-8") {
  const char* const good[] = {"",
                              "plain ASCII \x7f",
                              "\xc2\x80",
                              "\xdf\xbf",
                              "\xe0\xa0\x80",
                              "\xec\xbf\xbf",
                              "\xed\x9f\xbf" /* U+D7FF */,
                              "\xee\x80\x80" /* U+E000 */,
                              "\xef\xbf\xbf",
                              "\xf0\x90\x80\x80",
                              "\xf3\xbf\xbf\xbf",
                              "\xf4\x8f\xbf\xbf" /* U+10FFFF */};
  for (const char* g : good) {
    CAPTURE(std::string(g));
    CHECK(is_valid_utf8(g));
  }
  CHECK(is_valid_utf8(std::string_view("nul \0 inside", 12)));
}
