#include "gpunode/text/text_error.hpp"

#include <fmt/format.h>

namespace gpunode::text {

std::string TextError::to_string() const {
  return fmt::format("line {}, column {} (byte {}): {}", line, column, offset, what);
}

}  // namespace gpunode::text
