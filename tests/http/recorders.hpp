// The logger and the observer a test server is made with, each appending what it is given to the
// test's vectors under the test's mutex (the server's I/O threads write, the test reads). Shared by
// the session harness and the server fixture.
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "gpunode/http/server.hpp"

namespace gpunode::http::testing {

// An answer as the observer saw it: method, path, status and the door it came through.
using Seen = std::tuple<std::string, std::string, unsigned, Peer::Kind>;

inline auto log_into(std::mutex& mu, std::vector<std::string>& logs) {
  return [&mu, &logs](std::string_view m) {
    std::lock_guard lock(mu);
    logs.emplace_back(m);
  };
}

inline auto answers_into(std::mutex& mu, std::vector<Seen>& answered) {
  return [&mu, &answered](const Answered& a) {
    std::lock_guard lock(mu);
    answered.emplace_back(std::string(a.method), std::string(a.path), a.status, a.via);
  };
}

}  // namespace gpunode::http::testing
