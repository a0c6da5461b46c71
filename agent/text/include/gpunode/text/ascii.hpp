// gpunode/text/ascii.hpp: ASCII case, the one lower-casing of the agent (HTTP field names, config
// keys and words, SQLite's answers, the rules' names). What it reads is ASCII by its grammar; any
// other byte passes unchanged, whatever the locale.
#pragma once

#include <string>
#include <string_view>

namespace gpunode::text {

// `s` with A..Z as a..z; every other byte unchanged.
std::string ascii_lower(std::string_view s);

}  // namespace gpunode::text
