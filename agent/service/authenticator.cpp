#include "authenticator.hpp"

#include <fmt/format.h>

namespace gpunode::service {
namespace {

ApiResponse unauthenticated(std::string_view detail, bool token_sent) {
  auto r = problem(401, "unauthenticated", detail);
  r.headers.emplace_back("WWW-Authenticate", token_sent ? "Bearer error=\"invalid_token\"" : "Bearer");
  return r;
}

}  // namespace

std::expected<detail::Caller, Unauthenticated> Authenticator::authenticate(
    const ApiRequest& q, std::chrono::system_clock::time_point now) {
  if (q.via_admin_socket()) {
    return detail::Caller{
        {fmt::format("local:{}", q.peer.uid.value_or(0)), std::nullopt, {"platform-admin"}, "admin-socket"},
        std::nullopt};
  }
  const std::string_view header = q.header("authorization").value_or("");
  const bool sent = !header.empty();
  std::lock_guard lock(mu_);
  if (!verifier_)
    return std::unexpected(Unauthenticated{unauthenticated("no token keys are configured", sent), {}});
  if (auto hit = cache_.find(header); hit != cache_.end()) {
    const auto& cl = hit->second.claims;
    if (verifier_->in_time(cl, now)) {
      order_.splice(order_.begin(), order_, hit->second.at);
      return detail::Caller{{cl.sub, cl.org, cl.roles, "https"}, verifier_->expires(cl)};
    }
    order_.erase(hit->second.at);
    cache_.erase(hit);
  }
  auto claims = verifier_->verify(header, now);
  if (!claims) {
    std::string why = fmt::format("{} ({})", auth::to_string(claims.error().why), claims.error().detail);
    if (claims.error().why == auth::Rejection::missing && !sent)
      return std::unexpected(
          Unauthenticated{unauthenticated("a bearer token is required", false), std::move(why)});
    return std::unexpected(Unauthenticated{
        unauthenticated(fmt::format("bearer token rejected: {}", auth::to_string(claims.error().why)), sent),
        std::move(why)});
  }
  if (capacity_ == 0)
    return detail::Caller{{claims->sub, claims->org, claims->roles, "https"}, verifier_->expires(*claims)};
  while (cache_.size() >= capacity_) {  // the least recently used token goes, never the whole cache
    cache_.erase(order_.back());
    order_.pop_back();
  }
  order_.emplace_front(header);
  auto& e = cache_.emplace(std::string(header), Entry{*claims, order_.begin()}).first->second;
  return detail::Caller{{e.claims.sub, e.claims.org, e.claims.roles, "https"}, verifier_->expires(e.claims)};
}

void Authenticator::set_verifier(std::shared_ptr<const auth::TokenVerifier> verifier) {
  std::lock_guard lock(mu_);
  verifier_ = std::move(verifier);
  cache_.clear();
  order_.clear();
}

}  // namespace gpunode::service
