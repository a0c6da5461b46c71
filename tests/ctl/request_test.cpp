// gpunodectl's pure parts: times (+30d), id lists, percent-encoding, the request of each command.
#include "gpunode/ctl/request.hpp"

#include <doctest/doctest.h>

#include <boost/json/parse.hpp>

#include "gpunode/ctl/socket_path.hpp"

using namespace gpunode::ctl;
using namespace std::chrono_literals;
namespace json = boost::json;

namespace {
const Time kNow = std::chrono::sys_days{std::chrono::year{2027} / 1 / 5} + 10h + 30min;

json::value body_of(const Request& r) {
  return json::parse(r.body);
}
}  // namespace

TEST_CASE("times: + a duration from now, or RFC 3339") {
  CHECK(parse_when("+30d", kNow).value() == kNow + std::chrono::days(30));
  CHECK(parse_when("+12h", kNow).value() == kNow + 12h);
  CHECK(parse_when("+90m", kNow).value() == kNow + 90min);
  CHECK(parse_when("+2w", kNow).value() == kNow + std::chrono::days(14));
  CHECK(parse_when("+1d12h", kNow).value() == kNow + 36h);
  CHECK(parse_when("+45s", kNow).value() == kNow + 45s);
  CHECK(format_time(parse_when("2027-01-31T00:00:00Z", kNow).value()) == "2027-01-31T00:00:00Z");
  CHECK(format_time(parse_when("2027-01-31T02:00:00+02:00", kNow).value()) == "2027-01-31T00:00:00Z");
  CHECK(format_time(parse_when("2027-01-31T00:00:00.750Z", kNow).value()) == "2027-01-31T00:00:00Z");
  CHECK(format_time(kNow) == "2027-01-05T10:30:00Z");
}

TEST_CASE("times: what is wrong is said") {
  CHECK(parse_when("+", kNow).error().detail.find("missing") != std::string::npos);
  CHECK(parse_when("+30", kNow).error().detail.find("needs a unit") != std::string::npos);
  CHECK(parse_when("+30x", kNow).error().detail.find("unknown unit 'x'") != std::string::npos);
  CHECK(parse_when("+1h1d", kNow).error().detail.find("largest to smallest") != std::string::npos);
  CHECK(parse_when("+1d1d", kNow).error().detail.find("largest to smallest") != std::string::npos);
  CHECK(parse_when("+d", kNow).error().detail.find("expected a number") != std::string::npos);
  CHECK(parse_when("+-3d", kNow).error().detail.find("expected a number") != std::string::npos);
  CHECK(parse_when("+99999999999999999999d", kNow).error().detail.find("too large") != std::string::npos);
  CHECK(parse_when("+40000w", kNow).error().detail.find("too large") != std::string::npos);
  CHECK(parse_when("tomorrow", kNow).error().detail.find("is not a time") != std::string::npos);
  CHECK(parse_when("2027-02-30T00:00:00Z", kNow).error().detail.find("is not a time") != std::string::npos);
  CHECK(!parse_when("2027-01-31", kNow));
}

TEST_CASE("id lists: comma-separated, no empty entries, no repeats") {
  CHECK(parse_ids("u-1").value() == std::vector<std::string>{"u-1"});
  CHECK(parse_ids("u-1,u-2").value() == std::vector<std::string>{"u-1", "u-2"});
  CHECK(parse_ids("u-1, u-2").value() == std::vector<std::string>{"u-1", "u-2"});
  CHECK(parse_ids("").error().detail.find("empty entry") != std::string::npos);
  CHECK(parse_ids("u-1,,u-2").error().detail.find("empty entry") != std::string::npos);
  CHECK(parse_ids("u-1,").error().detail.find("empty entry") != std::string::npos);
  CHECK(parse_ids("u-1,u-1").error().detail == "\"u-1\" is named twice");
}

TEST_CASE("percent-encoding of path segments and query values") {
  CHECK(encode_component("rsv_01hx-Az.~") == "rsv_01hx-Az.~");
  CHECK(encode_component("../x") == "..%2Fx");
  CHECK(encode_component("a b&c=d?#") == "a%20b%26c%3Dd%3F%23");
  CHECK(encode_component("é") == "%C3%A9");
}

TEST_CASE("requests: reads") {
  CHECK(healthz_request().target == "/healthz");
  CHECK(units_request("node-1").target == "/v1/nodes/node-1/units");
  CHECK(units_request("node-1").method == "GET");
  CHECK(reservation_request("n", "rsv_1/../x").target == "/v1/nodes/n/reservations/rsv_1%2F..%2Fx");
  CHECK(capacity_request("n", "org a").target == "/v1/nodes/n/capacity?org=org%20a");
  CHECK(reservations_page("n", std::nullopt, 500, std::nullopt).target ==
        "/v1/nodes/n/reservations?limit=500");
  CHECK(reservations_page("n", "active", 500, "rsv_x").target ==
        "/v1/nodes/n/reservations?limit=500&state=active&pageToken=rsv_x");
  CHECK(audit_page("n", "aud_3", 2, std::nullopt).target == "/v1/nodes/n/audit?limit=2&after=aud_3");
  CHECK(audit_page("n", std::nullopt, 500, "aud_9").target == "/v1/nodes/n/audit?limit=500&pageToken=aud_9");
  CHECK(rescan_request().method == "POST");
  CHECK(rescan_request().target == "/v1/admin/rescan");
  CHECK(units_request("n").timeout == 30s);
}

TEST_CASE("requests: reserve") {
  ReserveArgs a{{"u-1", "u-2"}, {"org-a"}, {}, std::nullopt, kNow + std::chrono::days(30), std::nullopt};
  auto r = reserve_request("n", a);
  CHECK(r.method == "POST");
  CHECK(r.target == "/v1/nodes/n/reservations");
  CHECK(r.content_type == "application/json");
  CHECK(
      body_of(r) ==
      json::parse(
          R"({"unitIds":["u-1","u-2"],"audienceOrgIds":["org-a"],"managingOrgIds":[],"endsAt":"2027-02-04T10:30:00Z"})"));
  a.starts = kNow + 1h;
  a.note = "for \"training\"";
  a.managers = {"org-m"};
  CHECK(
      body_of(reserve_request("n", a)) ==
      json::parse(
          R"({"unitIds":["u-1","u-2"],"audienceOrgIds":["org-a"],"managingOrgIds":["org-m"],"endsAt":"2027-02-04T10:30:00Z",
                        "startsAt":"2027-01-05T11:30:00Z","note":"for \"training\""})"));
}

TEST_CASE("requests: amend is a merge patch of what is given, If-Match quoted") {
  AmendArgs a;
  a.note = "";
  a.ends = kNow + 12h;
  a.if_match = "3";
  auto r = amend_request("n", "rsv_1", a);
  CHECK(r.method == "PATCH");
  CHECK(r.target == "/v1/nodes/n/reservations/rsv_1");
  CHECK(r.content_type == "application/merge-patch+json");
  CHECK(body_of(r) == json::parse(R"({"endsAt":"2027-01-05T22:30:00Z","note":""})"));
  REQUIRE(r.headers.size() == 1);
  CHECK(r.headers[0] == std::pair<std::string, std::string>{"If-Match", "\"3\""});
  a.if_match = "\"4\"";
  CHECK(amend_request("n", "rsv_1", a).headers[0].second == "\"4\"");
}

TEST_CASE("requests: end, release, reclaim, terminate-spot") {
  CHECK(end_request("n", "rsv_1", std::nullopt).body == "{}");
  CHECK(end_request("n", "rsv_1", "done").target == "/v1/nodes/n/reservations/rsv_1/end");
  CHECK(body_of(end_request("n", "rsv_1", "done")) == json::parse(R"({"reason":"done"})"));
  CHECK(body_of(release_request("n", "rsv_1", {"u-1"})) == json::parse(R"({"unitIds":["u-1"]})"));
  CHECK(release_request("n", "rsv_1", {"u-1"}).target == "/v1/nodes/n/reservations/rsv_1/release");
  auto rc = reclaim_request("n", "rsv_1", {"u-1"}, true);
  CHECK(body_of(rc) == json::parse(R"({"unitIds":["u-1"],"terminateSpot":true})"));
  CHECK(rc.timeout == 360s);  // the agent's grace may be up to 300 s
  CHECK(reclaim_request("n", "rsv_1", {"u-1"}, false).timeout == 30s);
  TerminateArgs t;
  CHECK(terminate_spot_request("n", t).body == "{}");
  CHECK(terminate_spot_request("n", t).timeout == 360s);
  t.units = {"u-1"};
  t.reservation = "rsv_1";
  t.grace_seconds = 10;
  t.reason = "maintenance";
  auto r = terminate_spot_request("n", t);
  CHECK(r.target == "/v1/nodes/n/terminate-spot");
  CHECK(body_of(r) ==
        json::parse(
            R"({"unitIds":["u-1"],"reservationId":"rsv_1","gracePeriodSeconds":10,"reason":"maintenance"})"));
  CHECK(r.timeout == 70s);
}

TEST_CASE("admin.socket of agent.yaml, read by the agent's own loader") {
  auto sock = [](std::string_view text) { return admin_socket_from_yaml(text, "agent.yaml"); };
  CHECK(sock("node:\n  id: n\nadmin:\n  socket: /run/x.sock\n  allowed_uids: [0]\n").value() ==
        "/run/x.sock");
  CHECK(sock("admin:\n  allowed_uids: [0]\n  socket: \"/run/a b.sock\"  # quoted\n").value() ==
        "/run/a b.sock");
  CHECK(sock("admin:\n    socket: '/run/it''s.sock'\n").value() == "/run/it's.sock");
  CHECK(sock("admin: {socket: /run/f.sock, allowed_uids: [0, 1]}\n").value() == "/run/f.sock");
  CHECK(sock("admin: {allowed_uids: [0, 1], socket: \"/run/g,h.sock\"}\n").value() == "/run/g,h.sock");
  CHECK(sock("# comment\n---\nstate:\n  dir: /x\nadmin:   \n  # socket: /no\n  socket: /yes # trailing\n")
            .value() == "/yes");
  CHECK(sock("admin:\n  allowed_uids: [0]\n").value() == std::nullopt);
  CHECK(sock("admin:\n  socket: /run/gpunode/admin.sock\n").value() == std::nullopt);  // the default
  CHECK(sock("").value() == std::nullopt);
  // What the agent refuses, gpunodectl refuses, saying where.
  CHECK(sock("admin:\n  socket: \"/unterminated\n").error().detail.starts_with("agent.yaml:"));
  CHECK(sock("admin:\n  nested:\n    socket: /x\n").error().detail.starts_with("agent.yaml:2:3:"));
  CHECK(sock("admin: /x\n").error().detail.starts_with("agent.yaml:1:"));
}

TEST_CASE("which socket: --socket, else the config's admin.socket, else the default") {
  CHECK(choose_socket("/tmp/s", kDefaultConfig, "admin:\n  socket: /cfg\n")->path == "/tmp/s");
  CHECK(choose_socket(std::nullopt, kDefaultConfig, "admin:\n  socket: /cfg\n")->path == "/cfg");
  CHECK(choose_socket(std::nullopt, kDefaultConfig, "admin:\n  socket: /cfg\n")->source ==
        "admin.socket of /etc/gpunode/agent.yaml");
  CHECK(choose_socket(std::nullopt, kDefaultConfig, "node:\n  id: x\n")->path == "/run/gpunode/admin.sock");
  CHECK(choose_socket(std::nullopt, kDefaultConfig, std::nullopt)->path == "/run/gpunode/admin.sock");
  const auto bad = choose_socket(std::nullopt, kDefaultConfig, "admin: /x\n");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().detail.starts_with("cannot read admin.socket: /etc/gpunode/agent.yaml:1:"));
  CHECK(bad.error().detail.ends_with("; pass --socket PATH"));
}
