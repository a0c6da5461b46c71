// tests/fuzz/fuzz_check.hpp: what a fuzz target does when a property fails.
//
// A broken property is a finding like a sanitizer's: the target prints what broke and aborts, so
// libFuzzer (or the replay main of a build without libFuzzer) saves the input and fails.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace gpunode::fuzz {

[[noreturn]] inline void fail(std::string_view what, std::string_view detail = {}) {
  std::fprintf(stderr, "fuzz property failed: %.*s\n", static_cast<int>(what.size()), what.data());
  if (!detail.empty()) std::fprintf(stderr, "  %.*s\n", static_cast<int>(detail.size()), detail.data());
  std::abort();
}

inline void check(bool ok, std::string_view what, std::string_view detail = {}) {
  if (!ok) fail(what, detail);
}

}  // namespace gpunode::fuzz
