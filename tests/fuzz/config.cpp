// Fuzz target: the config loader (gpunode::config::load_string) over agent.yaml text.
//
// Properties: loading never throws and never ends in the loader's catch-alls (an exception that
// escaped a yaml-cpp call is a bug, reported as "internal error" or "cannot parse"); every problem
// has a 1-based line and column within the text and a printable message; a text valid for `run` is
// valid for `discover` (run asks for more), and the config it gives needs no restart to become
// itself.
#include "gpunode/config/config.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"

namespace {

using gpunode::fuzz::check;
namespace config = gpunode::config;

void check_problems(const config::LoadResult& result, std::string_view text) {
  int lines = 1;
  for (char c : text)
    if (c == '\n') ++lines;
  for (const auto& p : result.problems) {
    const std::string line = p.to_string();
    check(p.file == "agent.yaml", "a problem names another file", line);
    check(p.line >= 1 && p.column >= 1, "a problem without a position", line);
    check(p.line <= lines + 1, "a problem past the end of the text", line);
    check(!p.message.starts_with("internal error"), "an exception escaped while reading the config", line);
    check(!p.message.starts_with("cannot parse"), "an exception escaped from the YAML parser", line);
    for (char c : p.message) {
      const auto u = static_cast<unsigned char>(c);
      check(u >= 0x20 && u != 0x7f, "a problem's message holds a control character", line);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto run = config::load_string(text, "agent.yaml", config::Purpose::run);
  check_problems(run, text);
  const auto discover = config::load_string(text, "agent.yaml", config::Purpose::discover);
  check_problems(discover, text);
  if (run.ok()) {
    check(discover.ok(), "valid for run but not for discover");
    check(config::keys_needing_restart(run.config, run.config).empty(), "a config differs from itself");
  }
  return 0;
}
