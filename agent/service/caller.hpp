// Who a request comes from (private to gpunode_service): what the Authenticator found and every
// Change records as its actor.
#pragma once

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <optional>
#include <string>

#include "gpunode/reservations/model.hpp"
#include "gpunode/service/reservation_json.hpp"

namespace gpunode::service::detail {

struct Caller {
  reservations::Caller who;
  // Until when the credentials that made it hold (a token's expiry with the leeway), if they
  // expire; nothing on the admin socket.
  std::optional<std::chrono::system_clock::time_point> until{};
  boost::json::object actor() const {
    boost::json::object a;
    a["sub"] = who.sub;
    a["org"] = who.org ? boost::json::value(*who.org) : boost::json::value(nullptr);
    a["roles"] = strings_json(who.roles);
    a["via"] = who.via;
    return a;
  }
  std::string by() const { return who.org ? *who.org : who.sub; }
  // The caller as one value, for what is kept per caller (Idempotency-Keys; CONTRACT §10 "Callers
  // are tuples"): (via, sub, org, roles sorted) as a JSON array. Each claim is quoted and escaped,
  // not joined with a separator it may hold: two distinct callers never have the same key.
  std::string key() const {
    auto roles = who.roles;
    std::sort(roles.begin(), roles.end());
    return boost::json::serialize(boost::json::array{
        boost::json::value(who.via), boost::json::value(who.sub),
        who.org ? boost::json::value(*who.org) : boost::json::value(nullptr), strings_json(roles)});
  }
};

}  // namespace gpunode::service::detail
