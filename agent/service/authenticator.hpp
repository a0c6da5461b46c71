// The authenticator: who a request comes from (CONTRACT §4 Authentication), private to
// gpunode_service. On the admin socket the peer was admitted by the transport (SO_PEERCRED) and
// acts as platform-admin; over HTTPS the bearer token is verified against auth.keys.
//
// A token whose signature was verified once is not verified again (an Ed25519 verify costs about
// 100 µs): its claims are kept in a cache of at most `capacity` tokens, least recently used out
// first, and its times are checked again on every use. The cache goes with the keys on reload.
// Thread-safe: the core thread and the network threads (NodeService::read) share one; a mutex
// guards the keys and the cache.
#pragma once

#include <chrono>
#include <cstddef>
#include <expected>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "caller.hpp"
#include "gpunode/auth/token_verifier.hpp"
#include "gpunode/reservations/rules.hpp"
#include "gpunode/service/api.hpp"

namespace gpunode::service {

// A request the authenticator refuses: the 401 to answer and, for the log, why a token that was
// sent is refused (`why` is empty when no token was checked).
struct Unauthenticated {
  ApiResponse answer;
  std::string why;
};

class Authenticator {
 public:
  static constexpr std::size_t kDefaultCapacity = 4096;
  explicit Authenticator(std::shared_ptr<const auth::TokenVerifier> verifier,
                         std::size_t capacity = kDefaultCapacity)
      : verifier_(std::move(verifier)), capacity_(capacity) {}

  // The caller, or the 401 to answer (WWW-Authenticate: `Bearer` when no token was sent, with
  // error="invalid_token" when one was and it is refused; RFC 6750 §3.1), with the reason of the
  // refusal for the log.
  std::expected<detail::Caller, Unauthenticated> authenticate(const ApiRequest& q,
                                                              std::chrono::system_clock::time_point now);
  void set_verifier(std::shared_ptr<const auth::TokenVerifier> verifier);
  [[nodiscard]] std::size_t cached() const {
    std::lock_guard lock(mu_);
    return cache_.size();
  }

 private:
  using Order = std::list<std::string>;  // most recently used first
  struct Entry {
    auth::Claims claims;
    Order::iterator at;
  };
  mutable std::mutex mu_;
  std::shared_ptr<const auth::TokenVerifier> verifier_;  // guarded by mu_
  std::size_t capacity_;
  Order order_;  // guarded by mu_
  // Looked up by the request's header itself (a string_view): a hit copies nothing.
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, Entry, Hash, std::equal_to<>> cache_;  // guarded by mu_
};

}  // namespace gpunode::service
