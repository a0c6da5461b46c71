// gpunode/text/text_error.hpp: where in a text a reader gave up and why, the one such type: the
// strict JSON parser's refusals (json/strict.hpp) and the config file's binary check
// (config/text.hpp, find_binary) both answer with it.
#pragma once

#include <cstddef>
#include <string>

namespace gpunode::text {

struct TextError {
  std::string what;  // "a key is repeated: \"endsAt\"", "invalid UTF-8", ...
  std::size_t offset = 0;
  std::size_t line = 1, column = 1;  // 1-based; the column counts bytes
  [[nodiscard]] std::string to_string()
      const;  // "line 1, column 25 (byte 24): a key is repeated: \"endsAt\""
};

}  // namespace gpunode::text
