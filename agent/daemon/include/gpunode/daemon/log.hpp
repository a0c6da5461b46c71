// The agent's log: one line per event on stderr, `KEY=value` fields in the text, journald
// priority prefixes (<3>..<7>) when stderr is the journal, or one JSON object per line.
#pragma once

#include <atomic>
#include <string_view>

#include "gpunode/config/config.hpp"

namespace gpunode::daemon {

class Logger {
 public:
  void configure(config::LogLevel level, config::LogFormat format) {
    level_.store(level);
    format_.store(format);
  }
  [[nodiscard]] bool enabled(config::LogLevel level) const { return level >= level_.load(); }
  void log(config::LogLevel level, std::string_view message) const;

 private:
  std::atomic<config::LogLevel> level_{config::LogLevel::info};
  std::atomic<config::LogFormat> format_{config::LogFormat::text};
};

}  // namespace gpunode::daemon
