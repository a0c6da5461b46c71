// gpunode/text/printable.hpp: text from the agent made safe for a terminal (engineering rule: names,
// reasons and messages are data, never printed raw). What the agent says may carry what a caller
// wrote (a reason, a note, an org id); printed raw, an escape sequence would rewrite the operator's
// screen.
#pragma once

#include <string>
#include <string_view>

namespace gpunode::text {

// `s` with every byte a terminal would act on written as \xNN: C0 controls (tab and newline
// included), DEL, the C1 controls U+0080..U+009F, and bytes that are not UTF-8; a backslash is
// doubled so that the escapes stay unambiguous. Printable UTF-8 passes unchanged.
std::string printable(std::string_view s);

}  // namespace gpunode::text
