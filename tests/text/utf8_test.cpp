// gpunode::text::utf8_sequence and invalid_utf8: RFC 3629's table, the one decoder of the agent.
#include "gpunode/text/utf8.hpp"

#include <doctest/doctest.h>

#include <string_view>

using gpunode::text::invalid_utf8;
using gpunode::text::utf8_sequence;

TEST_CASE("utf8_sequence: the length of a well-formed sequence, 0 for anything else") {
  CHECK(utf8_sequence("a", 0) == 1);
  CHECK(utf8_sequence("\xc3\xa9", 0) == 2);          // é
  CHECK(utf8_sequence("\xe2\x82\xac", 0) == 3);      // €
  CHECK(utf8_sequence("\xf0\x9f\x98\x80", 0) == 4);  // U+1F600
  CHECK(utf8_sequence("\xf4\x8f\xbf\xbf", 0) == 4);  // U+10FFFF
  CHECK(utf8_sequence("\x80", 0) == 0);              // a stray continuation byte
  CHECK(utf8_sequence("\xc0\xaf", 0) == 0);          // overlong '/'
  CHECK(utf8_sequence("\xe0\x80\xaf", 0) == 0);      // overlong '/'
  CHECK(utf8_sequence("\xed\xa0\x80", 0) == 0);      // a UTF-16 surrogate
  CHECK(utf8_sequence("\xf4\x90\x80\x80", 0) == 0);  // past U+10FFFF
  CHECK(utf8_sequence("\xf5\x80\x80\x80", 0) == 0);
  CHECK(utf8_sequence("\xe2\x82", 0) == 0);  // truncated
}

TEST_CASE("invalid_utf8: the offset of the first bad byte, or npos") {
  CHECK(invalid_utf8("plain \xc3\xa9t\xc3\xa9") == std::string_view::npos);
  CHECK(invalid_utf8("ab\xff") == 2);
  CHECK(invalid_utf8("\xe2\x82\xac\xe2\x82") == 3);
}
