// The answers (or failures) of the admin socket that the hook's and reload's verdicts are tested on.
#pragma once

#include <expected>
#include <string>
#include <utility>

#include "gpunode/ctl/client.hpp"

namespace gpunode::test {

inline std::expected<ctl::Response, ctl::TransportError> answer(unsigned status, std::string body) {
  return ctl::Response{status, {{"content-type", "application/json"}}, std::move(body)};
}

inline std::expected<ctl::Response, ctl::TransportError> failure(ctl::TransportError::Kind kind,
                                                                 std::string detail = "") {
  return std::unexpected(ctl::TransportError{kind, "/run/gpunode/admin.sock", std::move(detail)});
}

}  // namespace gpunode::test
