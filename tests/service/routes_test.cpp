// The one route table (gpunode/service/routes.hpp): it is docs/openapi.yaml's paths and methods,
// both ways; each row is matched by its own paths and by no other row's; a 405 lists exactly the
// table's methods for the path; the rows the snapshot answers are GETs behind the node's 404.
#include "gpunode/service/routes.hpp"

#include <fmt/format.h>

#include <cctype>
#include <fstream>
#include <regex>
#include <set>

#include "lab.hpp"

using namespace service_test;

namespace {

constexpr const char* U1 = "u-0000-41-00-0";

using MethodPath = std::pair<std::string, std::string>;

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// The (METHOD, path) pairs under docs/openapi.yaml's `paths:`.
std::set<MethodPath> openapi_routes() {
  std::ifstream in(GPUNODE_OPENAPI);
  REQUIRE_MESSAGE(in, "cannot read " GPUNODE_OPENAPI);
  const std::regex path_line(R"(^  (/[^:]*):\s*$)");
  const std::regex method_line(R"(^    (get|put|post|patch|delete|head|options):\s*$)");
  std::set<MethodPath> out;
  bool in_paths = false;
  std::string path;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != ' ' && line[0] != '#') in_paths = line.starts_with("paths:");
    std::smatch m;
    if (!in_paths) continue;
    if (std::regex_match(line, m, path_line)) {
      path = m[1];
    } else if (!path.empty() && std::regex_match(line, m, method_line)) {
      out.emplace(upper(m[1]), path);
    }
  }
  return out;
}

// A path for a pattern: each {parameter} as a value of its own.
std::string path_of(std::string_view pattern) {
  return std::regex_replace(std::string(pattern), std::regex(R"(\{([A-Za-z]+)\})"), "$1-7");
}

gpunode::json::Request request(std::string method, std::string path, Doors door) {
  gpunode::json::Request q;
  q.method = std::move(method);
  q.path = std::move(path);
  q.peer.kind = door == kAdminSocket       ? gpunode::json::Peer::Kind::unix_socket
                : door == kMetricsListener ? gpunode::json::Peer::Kind::plain_tcp
                                           : gpunode::json::Peer::Kind::tcp;
  return q;
}

}  // namespace

TEST_CASE("route table: every route in docs/openapi.yaml is a row, and every row is in it") {
  std::set<MethodPath> table;
  for (const auto& r : route_table()) {
    CHECK_MESSAGE(table.emplace(std::string(r.method), std::string(r.pattern)).second,
                  "a row twice: ", r.method, " ", r.pattern);
  }
  const auto documented = openapi_routes();
  CHECK(documented.size() > 20);
  for (const auto& [method, path] : documented)
    CHECK_MESSAGE(table.contains({method, path}), method, " ", path);
  for (const auto& [method, path] : table)
    CHECK_MESSAGE(documented.contains({method, path}), method, " ", path);
}

TEST_CASE("route table: each row is matched by its own path, by each door it lists and by no other") {
  for (const auto& r : route_table()) {
    for (const Doors door : {kHttps, kAdminSocket, kMetricsListener}) {
      const auto m = match_route(request(std::string(r.method), path_of(r.pattern), door));
      if ((r.doors & door) == 0) {
        CHECK_MESSAGE(m.route != &r, r.pattern, " matched by a door it does not list");
        continue;
      }
      REQUIRE_MESSAGE(m.route == &r, r.method, " ", r.pattern, " by door ", int{door});
      for (const auto& [name, value] : m.params) CHECK(value == std::string(name) + "-7");
    }
  }
}

TEST_CASE("route table: a 405 lists exactly the table's methods for that path") {
  for (const auto& r : route_table()) {
    for (const Doors door : {kHttps, kAdminSocket, kMetricsListener}) {
      if ((r.doors & door) == 0) continue;
      std::vector<std::string> methods;
      for (const auto& other : route_table()) {
        if (other.pattern == r.pattern && (other.doors & door) != 0) methods.emplace_back(other.method);
      }
      const auto m = match_route(request("DELETE", path_of(r.pattern), door));
      CHECK(m.route == nullptr);
      REQUIRE(m.path != nullptr);
      CHECK(m.path->pattern == r.pattern);
      CHECK(m.allow(door) == fmt::format("{}", fmt::join(methods, ", ")));
    }
  }
}

TEST_CASE("route table: what resolves where") {
  struct Case {
    const char* method;
    const char* path;
    Doors door;
    const char* pattern;  // nullptr: no row has the path
  };
  const Case cases[] = {
      {"GET", "/v1/nodes/n1/units", kHttps, "/v1/nodes/{nodeId}/units"},
      {"GET", "/v1/nodes/n%2D1/reservations/rsv_1", kHttps,
       "/v1/nodes/{nodeId}/reservations/{reservationId}"},
      {"GET", "/v1/nodes/n1/units/", kHttps, nullptr},  // a trailing slash is another path
      {"GET", "/v1/nodes/n1", kHttps, nullptr},
      {"GET", "/v1/nodes/n1/reservations/r/end/x", kHttps, nullptr},
      {"GET", "/metrics", kHttps, nullptr},  // the admin socket's and metrics.listen's only
      {"GET", "/metrics", kMetricsListener, "/metrics"},
      {"GET", "/v1/nodes/n1/units", kMetricsListener, nullptr},
      {"GET", "/healthz", kMetricsListener, "/healthz"},
      {"POST", "/v1/admin/rescan", kHttps, nullptr},  // admin routes: the admin socket only
      {"POST", "/v1/admin/rescan", kAdminSocket, "/v1/admin/rescan"},
      {"POST", "/v1/admin/reload", kAdminSocket, "/v1/admin/reload"},
      {"GET", "/v1/orgs/org-a/reserved-capacity", kHttps, "/v1/orgs/{orgId}/reserved-capacity"},
      // Decoded before matching, route names too, whether the pattern has parameters or not.
      {"GET", "/v1/%61dmin/unentitled", kAdminSocket, "/v1/admin/unentitled"},
      {"GET", "/v1/%61dmin/units/x/health", kAdminSocket, "/v1/admin/units/{unitId}/health"},
      {"GET", "/v1/nodes/n1/unit%73", kHttps, "/v1/nodes/{nodeId}/units"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.path);
    const auto m = match_route(request(c.method, c.path, c.door));
    if (c.pattern == nullptr) {
      CHECK(m.path == nullptr);
      continue;
    }
    REQUIRE(m.route != nullptr);
    CHECK(m.route->pattern == c.pattern);
  }
  const auto m = match_route(request("GET", "/v1/nodes/n%2D1/reservations/rsv_1", kHttps));
  CHECK(m.param("nodeId") == "n-1");
  CHECK(m.param("reservationId") == "rsv_1");
  CHECK(match_route(request("GET", "/metrics", kAdminSocket)).route->daemon == DaemonRoute::metrics);
  CHECK(match_route(request("POST", "/v1/admin/reload", kAdminSocket)).route->daemon == DaemonRoute::reload);
}

TEST_CASE(
    "route table: the snapshot answers GETs only, behind the node's 404; the daemon's rows are its own") {
  for (const auto& r : route_table()) {
    CAPTURE(r.pattern);
    const bool handled = r.handle != nullptr;
    if (r.from_snapshot()) {
      CHECK(r.method == "GET");
      CHECK((r.scope == Scope::node || r.scope == Scope::reservation));
      CHECK(handled);  // the core answers what the snapshot cannot
    }
    CHECK((r.daemon == DaemonRoute::none) == handled);
    if (r.pattern.starts_with("/v1/nodes/{nodeId}/"))
      CHECK((r.scope == Scope::node || r.scope == Scope::reservation));
  }
}

TEST_CASE("route table: the service's 405s and 404s, as the table says") {
  Lab lab;
  const auto admin = lab.token("org-platform", {"platform-admin"});
  auto r = lab.call("DELETE", Lab::path("/reservations"), admin);
  CHECK(r.status == 405);
  CHECK(r.header("Allow") == "GET, POST");
  CHECK(Lab::body(r).at("detail").as_string() == "allowed: GET, POST");
  const auto x = lab.create(admin, {U1}, {"org-aud"}, {"org-mgr"});
  r = lab.call("DELETE", Lab::path("/reservations/" + std::string(x.at("id").as_string())), admin);
  CHECK(r.status == 405);
  CHECK(r.header("Allow") == "GET, PATCH");
  r = lab.call("POST", "/healthz", "");
  CHECK(r.status == 405);
  CHECK(r.header("Allow") == "GET");
  // Hidden, missing and wrong are one 404, byte for byte, whatever the method.
  const auto stranger = lab.token("org-stranger");
  const auto not_found = gpunode::json::not_found().body;
  CHECK(lab.call("GET", Lab::path("/units"), stranger).body == not_found);
  CHECK(lab.call("DELETE", Lab::path("/units"), stranger).body == not_found);
  CHECK(lab.call("GET", "/v1/nodes/another-node/units", admin).body == not_found);
  CHECK(lab.call("GET", Lab::path("/nothing-here"), admin).body == not_found);
  CHECK(lab.call("GET", Lab::path("/reservations/rsv_missing"), admin).body == not_found);
  CHECK(lab.call("POST", "/v1/admin/rescan", admin).body == not_found);  // over HTTPS
}
