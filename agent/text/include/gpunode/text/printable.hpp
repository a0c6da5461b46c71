// gpunode/text/printable.hpp: text from the agent made safe for a terminal (engineering rule: names,
// reasons and messages are data, never printed raw). What the agent says may carry what a caller
// wrote (a reason, a note, an org id); printed raw, an escape sequence would rewrite the operator's
// screen. The one escaping of the agent: the config's problems use it too, with C's escapes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gpunode::text {

// How an escaped byte is written. `hex`: always \xNN. `c_string`: `"` as \", tab, LF and CR as \t,
// \n and \r (the config's problems, which show values in double quotes), every other one as \xNN.
enum class Escapes { hex, c_string };

// `s` with every byte a terminal would act on escaped: C0 controls (tab and newline included),
// DEL, the C1 controls U+0080..U+009F, and bytes that are not UTF-8; a backslash is doubled so
// that the escapes stay unambiguous. Printable UTF-8 passes unchanged.
std::string printable(std::string_view s, Escapes escapes = Escapes::hex);

// The same, appended to `out`, up to the character that crosses `limit` bytes of `s`; returns how
// many bytes of `s` it took (less than s.size() when text was left out).
std::size_t append_printable(std::string& out, std::string_view s, Escapes escapes, std::size_t limit);

}  // namespace gpunode::text
