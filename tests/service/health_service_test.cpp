// Unit health in the service (CONTRACT §13): polls over a small tree whose files a test changes,
// what a failing unit does to the answers (units, admission, the hook, /metrics), what is kept
// across a reopen, the admin socket's routes, and that a quiet poll changes nothing.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <boost/json.hpp>
#include <chrono>
#include <filesystem>

#include "gpunode/service/node_service.hpp"
#include "gpunode/store/database.hpp"
#include "sysfs_tree.hpp"

namespace json = boost::json;
namespace fs = std::filesystem;
using namespace gpunode::service;
using gpunode::testing::Tree;

namespace {

constexpr const char* kNode = "node-health";
constexpr const char* kGpu = "0000:41:00.0";
constexpr const char* kPort = "0000:40:01.1";

// A root port with one GPU under it (unit u-0000-41-00-0), and a second GPU (u-0000-42-00-0) on
// the root bus; every function with AER files; a clock the test moves.
class Lab {
 public:
  Lab() {
    tree_.add(kPort, "8086", "352a", "060400", "pcieport", 30);
    tree_.nest(kGpu, kPort);
    tree_.add(kGpu, "10de", "2330", "030200", "vfio-pci", 37);
    tree_.add("0000:42:00.0", "10de", "2330", "030200", "vfio-pci", 38);
    for (const char* a : {kPort, kGpu, "0000:42:00.0"}) {
      aer(a, 0, 0, 0);
      link(a, "D0", 16);
    }
    config(kGpu, "\xde\x10\x30\x23");
    state_ = tree_.root() / "state";
    fs::create_directories(state_);
    now_ = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
    open();
  }

  void open() {
    service_.reset();
    ServiceOptions o;
    o.node_id = kNode;
    o.owner_org = "org-owner";
    o.host_root = tree_.root();
    o.state_dir = state_;
    o.version = "test";
    o.health.enabled = true;
    o.health.settings.recovery = std::chrono::seconds(120);
    auto s = NodeService::open(
        o, nullptr, nullptr, [this] { return now_; }, nullptr);
    REQUIRE_MESSAGE(s, (s ? "" : s.error().detail));
    service_ = std::move(*s);
  }

  void aer(const std::string& a, int fatal, int nonfatal, int cor) {
    tree_.write(tree_.dev(a) / "aer_dev_fatal",
                fmt::format("Undefined 0\nSDES {0}\nTOTAL_ERR_FATAL {0}\n", fatal));
    tree_.write(tree_.dev(a) / "aer_dev_nonfatal",
                fmt::format("CmpltTO {0}\nTOTAL_ERR_NONFATAL {0}\n", nonfatal));
    tree_.write(tree_.dev(a) / "aer_dev_correctable", fmt::format("RxErr {0}\nTOTAL_ERR_COR {0}\n", cor));
  }
  void link(const std::string& a, const std::string& power, int width) {
    tree_.write(tree_.dev(a) / "power_state", power + "\n");
    tree_.write(tree_.dev(a) / "current_link_width", fmt::format("{}\n", width));
    tree_.write(tree_.dev(a) / "max_link_width", "16\n");
    tree_.write(tree_.dev(a) / "current_link_speed", "32.0 GT/s PCIe\n");
  }
  void config(const std::string& a, const std::string& head) {
    tree_.write(tree_.dev(a) / "config", head + std::string(60, '\0'));
  }
  void poll(int times = 1) {
    for (int i = 0; i < times; ++i) {
      now_ += std::chrono::seconds(30);
      service_->poll_health();
    }
  }

  ApiResponse admin(const std::string& method, const std::string& path, const std::string& body = "") {
    ApiRequest q;
    q.method = method;
    q.path = path;
    q.body = body;
    q.request_id = "req-health";
    q.peer.kind = gpunode::json::Peer::Kind::unix_socket;
    q.peer.uid = 0;
    if (!body.empty()) q.headers.emplace_back("content-type", "application/json");
    auto out = service_->handle(q);
    REQUIRE(std::holds_alternative<ApiResponse>(out));
    return std::get<ApiResponse>(out);
  }
  json::object unit(const std::string& id) {
    auto r = admin("GET", fmt::format("/v1/nodes/{}/units", kNode));
    REQUIRE(r.status == 200);
    const auto doc = json::parse(r.body);
    for (const auto& u : doc.at("units").as_array()) {
      if (u.at("id").as_string() == id) return u.as_object();
    }
    FAIL("no unit " << id);
    return {};
  }
  static std::string state_of(const json::object& u) {
    return std::string(u.at("health").at("state").as_string());
  }
  static std::vector<std::string> codes(const json::object& u) {
    std::vector<std::string> out;
    for (const auto& r : u.at("health").at("reasons").as_array()) out.emplace_back(r.at("code").as_string());
    return out;
  }
  std::vector<json::object> rows(const std::string& sql) {
    auto db = gpunode::store::Database::open(state_ / "state.db");
    REQUIRE(db);
    auto st = db->prepare(sql);
    REQUIRE(st);
    std::vector<json::object> out;
    while (st->step().value_or(gpunode::store::Statement::Step::done) == gpunode::store::Statement::Step::row)
      out.push_back(json::parse(st->column_text(0)).as_object());
    return out;
  }
  std::vector<json::object> health_events() {
    std::vector<json::object> out;
    for (auto& e : rows("SELECT event FROM outbox ORDER BY seq")) {
      if (e.at("type").as_string() == "unit.health") out.push_back(e);
    }
    return out;
  }

  Tree tree_;
  fs::path state_;
  std::chrono::system_clock::time_point now_;
  std::unique_ptr<NodeService> service_;
};

}  // namespace

TEST_CASE("health: a poll that finds nothing new changes nothing") {
  Lab lab;
  const auto revision = lab.service_->revision();
  lab.poll(5);
  CHECK(lab.service_->revision() == revision);
  CHECK(lab.health_events().empty());
  CHECK(Lab::state_of(lab.unit("u-0000-41-00-0")) == "ok");
  CHECK(lab.unit("u-0000-41-00-0").at("sellable").as_bool());
}

TEST_CASE("health: a fatal error on a GPU's port fails its unit, and the failing unit refuses new starts") {
  Lab lab;
  const auto revision = lab.service_->revision();
  lab.aer(kPort, 1, 0, 0);
  lab.poll();
  CHECK(lab.service_->revision() == revision + 1);
  auto u = lab.unit("u-0000-41-00-0");
  CHECK(Lab::state_of(u) == "failing");
  CHECK(Lab::codes(u) == std::vector<std::string>{"pcie-fatal-error"});
  CHECK(u.at("health").at("reasons").at(0).at("pciAddress").as_string() == kPort);
  CHECK_FALSE(u.at("sellable").as_bool());
  CHECK_FALSE(u.at("reservable").as_bool());
  CHECK(u.at("notReservableReasons").at(0).at("code").as_string() == "pcie-fatal-error");
  CHECK(Lab::state_of(lab.unit("u-0000-42-00-0")) == "ok");
  // One unit.health event, stored with the change.
  const auto events = lab.health_events();
  REQUIRE(events.size() == 1);
  CHECK(events[0].at("data").at("unitId").as_string() == "u-0000-41-00-0");
  CHECK(events[0].at("data").at("state").as_string() == "failing");
  // Admission: not-sellable (the hook asks the same table); a reservation cannot be made.
  auto a = lab.admin("POST", fmt::format("/v1/nodes/{}/admission", kNode),
                     R"({"orgId": "org-a", "tier": "on-demand", "unitIds": ["u-0000-41-00-0"]})");
  REQUIRE(a.status == 200);
  CHECK_FALSE(json::parse(a.body).at("allowed").as_bool());
  CHECK(json::parse(a.body).at("reasons").at(0).at("code").as_string() == "not-sellable");
  // /metrics: the unit's gauge, and the fatal error counted on the port.
  const auto g = lab.service_->gauges();
  CHECK(std::find(g.unit_failing.begin(), g.unit_failing.end(),
                  std::pair<std::string, bool>{"u-0000-41-00-0", true}) != g.unit_failing.end());
  bool counted = false;
  for (const auto& e : g.pcie_errors) counted = counted || (e.pci_address == kPort && e.counts[0] == 1);
  CHECK(counted);
  // Nothing new: nothing changes, the reason keeps its since.
  const auto since = u.at("health").at("reasons").at(0).at("since");
  lab.poll(3);
  CHECK(lab.service_->revision() == revision + 1);
  CHECK(lab.unit("u-0000-41-00-0").at("health").at("reasons").at(0).at("since") == since);
}

TEST_CASE("health: a latched failure is kept across a reopen; a clear is audited and answers the unit") {
  Lab lab;
  lab.config(kGpu, std::string(4, '\xff'));
  lab.poll(3);
  CHECK(Lab::codes(lab.unit("u-0000-41-00-0")) == std::vector<std::string>{"device-unresponsive"});
  lab.config(kGpu, "\xde\x10\x30\x23");  // it answers again: latched all the same
  lab.poll();
  const auto revision = lab.service_->revision();
  lab.open();
  CHECK(lab.service_->revision() == revision);
  CHECK(Lab::state_of(lab.unit("u-0000-41-00-0")) == "failing");
  // The clear: a reason is required.
  CHECK(lab.admin("POST", "/v1/admin/units/u-0000-41-00-0/health/clear", "{}").status == 400);
  CHECK(lab.admin("POST", "/v1/admin/units/u-0000-99-00-0/health/clear", R"({"reason": "x"})").status == 404);
  CHECK(lab.admin("GET", "/v1/admin/units/u-0000-41-00-0/health/clear").status == 405);
  auto r =
      lab.admin("POST", "/v1/admin/units/u-0000-41-00-0/health/clear", R"({"reason": "reseated the card"})");
  REQUIRE(r.status == 200);
  const auto answer = json::parse(r.body).as_object();
  CHECK(answer.at("id").as_string() == "u-0000-41-00-0");
  CHECK(Lab::state_of(answer) == "ok");
  CHECK(answer.at("sellable").as_bool());
  CHECK(Lab::state_of(lab.unit("u-0000-41-00-0")) == "ok");
  const auto audits = lab.rows("SELECT record FROM audit ORDER BY seq");
  REQUIRE_FALSE(audits.empty());
  CHECK(audits.back().at("action").as_string() == "unit.health-clear");
  CHECK(audits.back().at("detail").as_string() ==
        "cleared device-unresponsive on 0000:41:00.0: reseated the card");
  const auto events = lab.health_events();
  REQUIRE(events.size() == 2);
  CHECK(events.back().at("data").at("state").as_string() == "ok");
  // Over HTTPS the route is none of the API's.
  ApiRequest q;
  q.method = "POST";
  q.path = "/v1/admin/units/u-0000-41-00-0/health/clear";
  q.body = R"({"reason": "x"})";
  q.peer.kind = gpunode::json::Peer::Kind::tcp;
  auto https = lab.service_->handle(q);
  CHECK(std::get<ApiResponse>(https).status == 401);
}

TEST_CASE("health: a degraded link fails the unit and recovers after health.recovery") {
  Lab lab;
  lab.link(kGpu, "D0", 8);
  lab.poll(2);
  CHECK(Lab::state_of(lab.unit("u-0000-41-00-0")) == "ok");
  lab.poll();
  CHECK(Lab::codes(lab.unit("u-0000-41-00-0")) == std::vector<std::string>{"link-degraded"});
  lab.link(kGpu, "D0", 16);
  lab.poll(4);  // 90 s back at x16: not yet
  CHECK(Lab::state_of(lab.unit("u-0000-41-00-0")) == "failing");
  lab.poll();  // 120 s
  CHECK(Lab::state_of(lab.unit("u-0000-41-00-0")) == "ok");
  // Asleep, the link and config read Unknown/63 and all ones: not judged.
  lab.link(kGpu, "D3cold", 63);
  lab.config(kGpu, std::string(4, '\xff'));
  lab.poll(5);
  CHECK(Lab::state_of(lab.unit("u-0000-41-00-0")) == "ok");
}

TEST_CASE("health: GET /v1/admin/health shows each function's link and counts") {
  Lab lab;
  auto r = lab.admin("GET", "/v1/admin/health");
  REQUIRE(r.status == 200);
  const auto doc = json::parse(r.body);
  CHECK(doc.at("enabled").as_bool());
  const auto& units = doc.at("units").as_array();
  REQUIRE(units.size() == 2);
  const auto& devices = units[0].at("devices").as_array();
  REQUIRE(devices.size() == 2);
  CHECK(devices[0].at("pciAddress").as_string() == kGpu);
  CHECK(devices[0].at("linkWidth").as_int64() == 16);
  CHECK(devices[0].at("linkSpeed").as_string() == "32.0 GT/s PCIe");
  CHECK(devices[1].at("pciAddress").as_string() == kPort);
  CHECK(devices[1].at("role").as_string() == "upstream-port");
  CHECK(devices[1].at("aer").at("fatal").as_int64() == 0);
  CHECK(lab.admin("GET", "/v1/admin/units/u-0000-42-00-0/health").status == 200);
  CHECK(lab.admin("GET", "/v1/admin/units/u-0000-99-00-0/health").status == 404);
}
