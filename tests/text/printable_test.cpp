// text::printable: what reaches an operator's terminal from the agent is never a control sequence.
#include "gpunode/text/printable.hpp"

#include <doctest/doctest.h>

#include <string>

using gpunode::text::Escapes;
using gpunode::text::printable;

TEST_CASE("printable: printable ASCII and UTF-8 pass; a backslash is doubled") {
  CHECK(printable("capacity-reclaim") == "capacity-reclaim");
  CHECK(printable("Grüße, 東京, 🙂") == "Grüße, 東京, 🙂");
  CHECK(printable("a\\b") == "a\\\\b");
  CHECK(printable("") == "");
}

TEST_CASE("printable: C0, DEL and C1 controls, and bytes that are not UTF-8, become \\xNN") {
  CHECK(printable("\x1b[2J\x1b[1;1Hforged") == "\\x1b[2J\\x1b[1;1Hforged");
  CHECK(printable("line\nnext\r\t") == "line\\x0anext\\x0d\\x09");
  CHECK(printable(std::string("a\0b", 3)) == "a\\x00b");
  CHECK(printable("\x7f") == "\\x7f");
  CHECK(printable("\xc2\x9b"
                  "31m") == "\\xc2\\x9b31m");  // CSI as U+009B
  CHECK(printable("\xc2\xa0") == "\xc2\xa0");  // U+00A0 is not a control
  CHECK(printable("\xff\xfe") == "\\xff\\xfe");
  CHECK(printable("\xc0\xaf") == "\\xc0\\xaf");           // an overlong '/'
  CHECK(printable("\xed\xa0\x80") == "\\xed\\xa0\\x80");  // a surrogate
  CHECK(printable("\xe6\x9d") == "\\xe6\\x9d");           // cut short
}

TEST_CASE("printable with C's escapes: the config's style, for text shown in double quotes") {
  CHECK(printable("a\"b\\c\tx\ny\rz", Escapes::c_string) == "a\\\"b\\\\c\\tx\\ny\\rz");
  CHECK(printable("\x01\x7f\xff", Escapes::c_string) == "\\x01\\x7f\\xff");
  CHECK(printable("\xc2\x85\xc2\xa0", Escapes::c_string) == "\\xc2\\x85\xc2\xa0");  // NEL escaped, NBSP not
  CHECK(printable("a\"b") == "a\"b");  // a quote is escaped only in the C style
}

TEST_CASE("append_printable stops at the character that crosses the limit and says how far it read") {
  std::string out;
  CHECK(gpunode::text::append_printable(out,
                                        "ab\xc3\xa9"
                                        "cd",
                                        Escapes::hex, 3) == 4);
  CHECK(out == "ab\xc3\xa9");
  out.clear();
  CHECK(gpunode::text::append_printable(out, "ab", Escapes::hex, 10) == 2);
  CHECK(out == "ab");
}
