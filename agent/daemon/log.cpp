#include "gpunode/daemon/log.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "gpunode/text/printable.hpp"

namespace gpunode::daemon {
namespace {

int syslog_priority(config::LogLevel level) {
  switch (level) {
    case config::LogLevel::debug:
      return 7;
    case config::LogLevel::info:
      return 6;
    case config::LogLevel::warning:
      return 4;
    case config::LogLevel::error:
      return 3;
  }
  return 6;
}

std::mutex& out_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

void Logger::log(config::LogLevel level, std::string_view message) const {
  if (!enabled(level)) return;
  static const bool journal = std::getenv("JOURNAL_STREAM") != nullptr;
  std::string line;
  if (format_.load() == config::LogFormat::json) {
    const auto now =
        std::chrono::time_point_cast<std::chrono::milliseconds>(std::chrono::system_clock::now());
    line =
        boost::json::serialize(boost::json::object{
            {"at", fmt::format("{:%FT%TZ}", now)}, {"level", config::to_string(level)}, {"msg", message}}) +
        "\n";
  } else if (journal) {
    // One record per line: a message's control characters (which may come from a request, a
    // domain's XML or sysfs) are escaped, so none can end the line or forge the next (CONTRACT §10).
    line = fmt::format("<{}>{}\n", syslog_priority(level), text::printable(message));
  } else {
    const auto now =
        std::chrono::time_point_cast<std::chrono::milliseconds>(std::chrono::system_clock::now());
    line = fmt::format("{:%FT%TZ} {:<7} {}\n", now, config::to_string(level), text::printable(message));
  }
  std::lock_guard lock(out_mutex());
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace gpunode::daemon
