// What the node keeps per caller is keyed by the caller as a tuple, never a joined string (CONTRACT
// §10 "Callers are tuples"); hidden and missing resources are found the same way (§10 "Hiding
// includes time"); the head's checkpoint asked for on the admin socket (§12).
#include <fmt/format.h>

#include "gpunode/proof/node_key.hpp"
#include "lab.hpp"

using namespace service_test;

namespace {

constexpr const char* U1 = "u-0000-41-00-0";

std::string units_body(const std::string& unit) {
  return fmt::format(R"({{"unitIds":["{}"]}})", unit);
}

std::vector<std::string> reservation_ids_of(Lab& lab, const std::string& token, const std::string& unit) {
  auto r = lab.call("GET", Lab::path("/units"), token);
  REQUIRE_MESSAGE(r.status == 200, r.body);
  std::vector<std::string> out;
  const auto doc = Lab::body(r);
  for (const auto& u : doc.at("units").as_array()) {
    if (u.at("id").as_string() != unit) continue;
    for (const auto& id : u.at("reservationIds").as_array()) out.emplace_back(id.as_string());
  }
  return out;
}

}  // namespace

TEST_CASE("Idempotency-Keys: callers whose sub and org join alike share no key") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  // sub "u|p" of org "q", and sub "u" of org "p|q": once joined as "via|sub|org" the same caller.
  const auto first = lab.token_as("u|p", "q");
  const auto second = lab.token_as("u", "p|q");
  auto x = lab.create(admin, {U1}, {"org-aud"}, {"q", "p|q"});
  const std::string release = Lab::path("/reservations/" + std::string(x.at("id").as_string()) + "/release");
  const std::vector<std::pair<std::string, std::string>> key{{"idempotency-key", "k-1"}};

  auto a = lab.call("POST", release, first, units_body(U1), key);
  REQUIRE_MESSAGE(a.status == 200, a.body);
  // Another body under the same key: the first caller's reuse, but the second caller's own call.
  CHECK(code_of(lab.call("POST", release, first, units_body(U1) + " ", key)) == "idempotency-key-reuse");
  auto b = lab.call("POST", release, second, units_body(U1) + " ", key);
  CHECK_MESSAGE(b.status == 200, b.body);
  CHECK_FALSE(b.header("Idempotent-Replayed"));

  // The same key and body: a replay for the first caller only; the second's call runs.
  const std::string ts = Lab::path("/terminate-spot");
  auto t1 = lab.call("POST", ts, first, "{}", {{"idempotency-key", "t-1"}});
  REQUIRE_MESSAGE(t1.status == 200, t1.body);
  CHECK(lab.call("POST", ts, first, "{}", {{"idempotency-key", "t-1"}}).header("Idempotent-Replayed") ==
        "true");
  auto t2 = lab.call("POST", ts, second, "{}", {{"idempotency-key", "t-1"}});
  CHECK(t2.status == 200);
  CHECK_FALSE(t2.header("Idempotent-Replayed"));

  // Roles are part of the caller too: the same sub and org with another set of roles is another caller.
  const auto one_role = lab.token_as("ops", "org-platform", {"platform-admin"});
  const auto two_roles = lab.token_as("ops", "org-platform", {"platform-admin", "platform-operator"});
  const std::string adm = Lab::path("/admission");
  const std::string q1 = fmt::format(R"({{"orgId":"org-x","tier":"spot","unitIds":["{}"]}})", U1);
  REQUIRE(lab.call("POST", adm, one_role, q1, {{"idempotency-key", "a-1"}}).status == 200);
  CHECK(lab.call("POST", adm, one_role, q1, {{"idempotency-key", "a-1"}}).header("Idempotent-Replayed") ==
        "true");
  auto other_roles = lab.call("POST", adm, two_roles, q1, {{"idempotency-key", "a-1"}});
  CHECK(other_roles.status == 200);
  CHECK_FALSE(other_roles.header("Idempotent-Replayed"));
}

TEST_CASE("renderings: kept per class of caller as a tuple, so a crafted claim gets its own answer") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  const auto now = lab.now_;
  auto mine = lab.create(admin, {U1}, {"org-aud"}, {"m"}, iso(now), iso(now + std::chrono::hours(1)));
  lab.create(admin, {U1}, {"org-other"}, {"z"}, iso(now + std::chrono::hours(2)),
             iso(now + std::chrono::hours(3)));
  // An operator of org m with a second role, and a manager of org m whose one role is those two
  // joined by the separator the rendering's key once used: the same joined key, not the same caller.
  const auto operator_m = lab.token_as("op", "m", {"a", "platform-operator"});
  const auto manager_m = lab.token_as("mgr", "m", {"a\x1eplatform-operator"});
  CHECK(reservation_ids_of(lab, operator_m, U1).size() == 2);
  CHECK(reservation_ids_of(lab, manager_m, U1) ==
        std::vector<std::string>{std::string(mine.at("id").as_string())});

  std::vector<std::string> s1, s2;
  gpunode::reservations::Caller a{"s", std::string("x\x1f"), {}, "https"};
  gpunode::reservations::Caller b{"s", std::string("x"), {"\x1f"}, "https"};
  const auto ka = detail::AnswerClass::of("units", a, s1);
  const auto kb = detail::AnswerClass::of("units", b, s2);
  CHECK(detail::compare(ka, kb) != 0);
  CHECK(detail::compare(ka, ka) == 0);
  gpunode::reservations::Caller c{"t", std::nullopt, {"z", "a"}, "https"};
  gpunode::reservations::Caller d{"u", std::nullopt, {"a", "z"}, "https"};
  CHECK(detail::compare(detail::AnswerClass::of("units", c, s1), detail::AnswerClass::of("units", d, s2)) ==
        0);
}

TEST_CASE("a reservation hidden from the caller and one that is not there get the same 404") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  auto live = lab.create(admin, {U1}, {"org-aud"}, {});
  auto gone = lab.create(admin, {"u-0000-42-00-0"}, {"org-aud2"}, {});
  const std::string gone_id(gone.at("id").as_string());
  REQUIRE(lab.call("POST", Lab::path("/reservations/" + gone_id + "/end"), admin, "").status == 200);
  const auto outsider = lab.token("org-aud");  // sees the node through its own reservation only
  const auto missing = lab.call("GET", Lab::path("/reservations/rsv_00000000000000000000000000"), outsider);
  CHECK(missing.status == 404);
  auto own = lab.call("GET", Lab::path("/reservations/" + std::string(live.at("id").as_string())), outsider);
  CHECK(own.status == 200);
  auto hidden = lab.call("GET", Lab::path("/reservations/" + gone_id), outsider);
  CHECK(hidden.status == 404);
  CHECK(hidden.body == missing.body);
  const auto nobody = lab.token("org-nobody");
  CHECK(lab.call("GET", Lab::path("/units"), nobody).body ==
        lab.call("GET", "/v1/nodes/not-this-node/units", nobody).body);
}

TEST_CASE("POST /v1/admin/audit/checkpoint: the head signed now, or the checkpoint that signs it already") {
  Lab lab;
  const std::string route = "/v1/admin/audit/checkpoint";
  CHECK(code_of(lab.call("POST", route, "admin-socket")) == "audit-signing-unavailable");  // no key yet
  auto key = gpunode::proof::NodeKey::generate();
  REQUIRE(key.has_value());
  lab.service_->set_audit_key(std::make_shared<const gpunode::proof::NodeKey>(*key));
  auto empty = lab.call("POST", route, "admin-socket");
  CHECK(empty.status == 409);
  CHECK(code_of(empty) == "audit-empty");

  const auto admin = lab.token("org-platform", {"platform-admin"});
  lab.create(admin, {U1}, {"org-aud"}, {});
  const auto events_before = lab.events("audit.checkpoint").size();
  auto first = lab.call("POST", route, "admin-socket");
  REQUIRE_MESSAGE(first.status == 200, first.body);
  const auto cp = Lab::body(first).as_object();
  CHECK(cp.at("seq").as_int64() == 1);
  CHECK(cp.at("keyId").as_string() == key->key_id());
  CHECK(lab.events("audit.checkpoint").size() == events_before + 1);
  // Asked again with no record since: the same checkpoint, no new one.
  auto again = lab.call("POST", route, "admin-socket");
  CHECK(again.body == first.body);
  CHECK(lab.events("audit.checkpoint").size() == events_before + 1);
  lab.create(admin, {"u-0000-42-00-0"}, {"org-aud"}, {});
  auto moved = lab.call("POST", route, "admin-socket");
  CHECK(Lab::body(moved).at("seq").as_int64() == 2);
  CHECK(lab.events("audit.checkpoint").size() == events_before + 2);
  CHECK(Lab::body(lab.call("GET", Lab::path("/audit/checkpoints"), admin))
            .at("checkpoints")
            .as_array()
            .size() == 2);

  CHECK(lab.call("GET", route, "admin-socket").status == 405);
  CHECK(lab.call("POST", route, admin).status == 404);  // the admin socket's only
}
