// gpunode/service/shared_reads.hpp: answers of GET units and GET state that the network thread
// gives again, without a hop to the state thread, while nothing they show can have changed.
//
// The state thread builds such an answer once per revision and caller class (NodeService's read
// cache) and keeps it here under the request's identity: its path and query, exactly as sent, and
// its exact Authorization header, over HTTPS only. A state poll that is answered at once is kept
// too: `?after=REV` with the revision past REV (the full answer) and `?after=REV&wait=0s` with
// it at REV (a 304); a poll that waits is never kept. A kept answer is good until the earlier of
// the next term (when the clock itself changes what the node shows) and the token's expiry; the
// state store withdraws every answer when the revision moves, before the answer of the commit
// that moved it goes out, so a client that saw its change acknowledged never reads the state
// before it. New token keys (SIGHUP) withdraw them too. An If-None-Match that matches the kept
// ETag of a 200 is a 304, as the state thread would answer it.
//
// Threads: find() from any thread (the network thread); keep() and withdraw_all() from the state
// thread. One mutex guards the table; it is held for a lookup and a copy of the answer.
// Bounded: at most kMaxAnswers identities; a full table is emptied (the next reads rebuild it).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "gpunode/service/api.hpp"

namespace gpunode::service {

class SharedReads {
 public:
  using TimePoint = std::chrono::system_clock::time_point;
  static constexpr std::size_t kMaxAnswers = 256;

  // The kept answer to this request, if it is a GET over HTTPS without a body, one was kept for its
  // path, query and Authorization header, and `now` is before its end.
  [[nodiscard]] std::optional<ApiResponse> find(const ApiRequest& q, TimePoint now) const;
  // State thread: `answer` (a 200 or a 304, with its ETag) is what `q` gets until `until`.
  // Requests that find() would never match (the admin socket, a body) are not kept.
  void keep(const ApiRequest& q, const ApiResponse& answer, TimePoint until);
  // State thread: the revision moved, or what authenticates callers changed.
  void withdraw_all();
  [[nodiscard]] std::size_t size() const;

 private:
  struct Kept {
    std::shared_ptr<const ApiResponse> answer;
    TimePoint until;
  };
  static bool eligible(const ApiRequest& q);
  static std::string key_of(const ApiRequest& q);

  mutable std::mutex mu_;
  std::unordered_map<std::string, Kept> kept_;  // guarded by mu_
};

}  // namespace gpunode::service
