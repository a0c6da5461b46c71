// The node's API in process, as the service tests drive it (node_service_test.cpp,
// workloads_test.cpp, terminate_test.cpp, admission_test.cpp, callers_test.cpp): a node with three
// units, a clock the test moves, a key that signs tokens, the daemon's driver on this thread.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <boost/asio/io_context.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "gpunode/daemon/driver.hpp"
#include "gpunode/service/node_service.hpp"
#include "gpunode/store/audit_chain.hpp"
#include "gpunode/store/database.hpp"
#include "gpunode/vmctl/fake_hypervisor.hpp"
#include "jwt_signer.hpp"
#include "snapshot.hpp"
#include "sysfs_tree.hpp"

namespace service_test {

namespace json = boost::json;
namespace fs = std::filesystem;
using namespace gpunode::service;
using gpunode::auth::testing::KeyKind;
using gpunode::auth::testing::TestKey;
using gpunode::testing::Tree;
using std::chrono::system_clock;

constexpr const char* kNode = "node-test";
constexpr const char* kOwner = "org-owner";
constexpr const char* kIssuer = "https://central.test";

inline std::string iso(system_clock::time_point t) {
  return gpunode::reservations::format_time(std::chrono::time_point_cast<std::chrono::seconds>(t));
}

// A node with three single-GPU units (u-0000-41-00-0, u-0000-42-00-0, u-0000-43-00-0; the last one
// has a NIC in its group, so it is not reservable), a clock we move, and a key that signs tokens.
class Lab {
 public:
  Lab() : key_(KeyKind::ed25519) {
    tree_.add("0000:41:00.0", "10de", "2330", "030200", "vfio-pci", 1);
    tree_.add("0000:42:00.0", "10de", "2330", "030200", "vfio-pci", 2);
    tree_.add("0000:43:00.0", "10de", "2330", "030200", "vfio-pci", 3);
    tree_.add("0000:43:00.1", "15b3", "1021", "020700", "mlx5_core", 3);
    state_ = tree_.root() / "state";
    fs::create_directories(state_);
    now_ = std::chrono::time_point_cast<std::chrono::seconds>(system_clock::now());
    open();
  }

  void open() {
    if (driver_) {  // its timers are cancelled and their handlers run before it goes
      driver_->stop();
      drain();
      driver_.reset();
    }
    service_.reset();
    gpunode::auth::VerifierConfig vc{kIssuer, "gpunode", kNode, std::chrono::seconds(60)};
    auto verifier = gpunode::auth::TokenVerifier::from_pems({key_.public_pem()}, vc);
    REQUIRE(verifier);
    ServiceOptions o;
    o.node_id = kNode;
    o.owner_org = kOwner;
    o.host_root = tree_.root();
    o.state_dir = state_;
    o.version = "test";
    o.shutdown_grace = grace_;
    auto s = NodeService::open(
        o, std::make_shared<gpunode::auth::TokenVerifier>(*verifier), nullptr, [this] { return now_; },
        nullptr);
    REQUIRE_MESSAGE(s, (s ? "" : s.error().detail));
    service_ = std::move(*s);
    // The daemon's driver, with every executor being this thread's io_context: lists and
    // terminations run in order on this thread, with a clock-free sleep that only counts.
    gpunode::daemon::Driver::Options dopt;
    dopt.lists = io_.get_executor();
    dopt.terminations = io_.get_executor();
    dopt.sleeper = [this](std::chrono::milliseconds d) {
      slept_ += d;
      return true;
    };
    driver_ =
        std::make_unique<gpunode::daemon::Driver>(io_, *service_, hypervisor_, std::move(dopt), nullptr);
  }

  // Runs whatever the driver posted until nothing is ready (timers are not waited for).
  void drain() {
    io_.restart();
    io_.poll();
  }

  // The service's decision on a request, with the domains listed now (no driver).
  Outcome handle_listed(ApiRequest q) {
    q.workloads = std::make_shared<const WorkloadListing>(WorkloadListing{hypervisor_->list()});
    return service_->handle(q);
  }

  // One request through the driver; it must be answered without waiting for a timer.
  ApiResponse call_request(ApiRequest q) {
    std::optional<ApiResponse> out;
    driver_->submit(std::move(q), [&out](ApiResponse r) { out = std::move(r); });
    drain();
    REQUIRE_MESSAGE(out, "the request was not answered");
    return std::move(*out);
  }

  std::string token(std::optional<std::string> org, std::vector<std::string> roles = {}, long exp_in = 600) {
    return token_as("user@" + org.value_or("platform"), std::move(org), std::move(roles), exp_in);
  }
  std::string token_as(const std::string& sub, std::optional<std::string> org,
                       std::vector<std::string> roles = {}, long exp_in = 600) {
    json::object claims{
        {"iss", kIssuer},
        {"aud", "gpunode"},
        {"sub", sub},
        {"exp", std::chrono::duration_cast<std::chrono::seconds>(now_.time_since_epoch()).count() + exp_in}};
    if (org) claims["org"] = *org;
    json::array rs;
    for (auto& r : roles) rs.emplace_back(r);
    if (!roles.empty()) claims["roles"] = rs;
    return gpunode::auth::testing::mint(key_, R"({"alg":"EdDSA","typ":"JWT"})", json::serialize(claims));
  }

  ApiResponse call(const std::string& method, const std::string& target, const std::string& tok,
                   const std::string& body = "",
                   std::vector<std::pair<std::string, std::string>> headers = {}) {
    return call_request(request(method, target, tok, body, std::move(headers)));
  }

  static ApiRequest request(const std::string& method, const std::string& target, const std::string& tok,
                            const std::string& body = "",
                            std::vector<std::pair<std::string, std::string>> headers = {}) {
    ApiRequest q;
    q.method = method;
    auto qm = target.find('?');
    q.path = target.substr(0, qm);
    q.query = qm == std::string::npos ? "" : target.substr(qm + 1);
    q.body = body;
    q.request_id = "req-test";
    if (tok == "admin-socket") {
      q.peer.kind = gpunode::json::Peer::Kind::unix_socket;
      q.peer.uid = 0;
    } else if (!tok.empty()) {
      q.headers.emplace_back("authorization", "Bearer " + tok);
    }
    if (!body.empty()) q.headers.emplace_back("content-type", "application/json");
    for (auto& h : headers) q.headers.push_back(h);
    return q;
  }

  static json::value body(const ApiResponse& r) {
    boost::system::error_code ec;
    auto v = json::parse(r.body, ec);
    return ec ? json::value(nullptr) : v;
  }

  json::object create(const std::string& admin, std::vector<std::string> units,
                      std::vector<std::string> audience, std::vector<std::string> managers,
                      std::string starts = "", std::string ends = "") {
    json::object b{{"unitIds", json::value_from(units)},
                   {"audienceOrgIds", json::value_from(audience)},
                   {"managingOrgIds", json::value_from(managers)},
                   {"endsAt", ends.empty() ? iso(now_ + std::chrono::hours(24)) : ends}};
    if (!starts.empty()) b["startsAt"] = starts;
    auto r = call("POST", path("/reservations"), admin, json::serialize(b));
    REQUIRE_MESSAGE(r.status == 201, r.body);
    return body(r).as_object();
  }

  static std::string path(const std::string& rest) { return std::string("/v1/nodes/") + kNode + rest; }

  Tree tree_;
  fs::path state_;
  TestKey key_;
  system_clock::time_point now_;
  boost::asio::io_context io_;
  std::unique_ptr<NodeService> service_;
  std::unique_ptr<gpunode::daemon::Driver> driver_;
  std::chrono::milliseconds slept_{0};
  std::chrono::seconds grace_{0};

  // The stored events of one type (the outbox), oldest first.
  std::vector<json::object> events(const std::string& type) {
    auto db = gpunode::store::Database::open(state_ / "state.db");
    REQUIRE(db);
    auto st = db->prepare("SELECT event FROM outbox ORDER BY seq");
    REQUIRE(st);
    std::vector<json::object> out;
    while (st->step().value_or(gpunode::store::Statement::Step::done) ==
           gpunode::store::Statement::Step::row) {
      auto e = json::parse(st->column_text(0)).as_object();
      if (e.at("type").as_string() == type) out.push_back(e);
    }
    return out;
  }
  // Audit records with this action, oldest first.
  std::vector<json::object> audits(const std::string& action) {
    std::vector<json::object> out;
    auto b = body(call("GET", path("/audit?limit=500"), "admin-socket"));
    for (auto& r : b.at("records").as_array()) {
      if (r.at("action").as_string() == action) out.push_back(r.as_object());
    }
    return out;
  }
  void refresh() {
    driver_->refresh();
    drain();
  }
  std::shared_ptr<gpunode::vmctl::FakeHypervisor> hypervisor_ =
      std::make_shared<gpunode::vmctl::FakeHypervisor>();
};

inline std::string code_of(const ApiResponse& r) {
  auto v = Lab::body(r);
  return v.is_object() && v.as_object().contains("code") ? std::string(v.at("code").as_string()) : "";
}

}  // namespace service_test
