// The in-process daemon as the tests drive it: a host with two GPU units, a config, TLS and token
// keys in a temp dir, the fake hypervisor, an optional clock of the test's own; requests
// submitted as if from the network. Shared by daemon_test.cpp and faults_test.cpp.
#pragma once

#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <grp.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/json.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "gpunode/daemon/daemon.hpp"
#include "gpunode/reservations/model.hpp"
#include "gpunode/store/database.hpp"
#include "gpunode/vmctl/fake_hypervisor.hpp"
#include "jwt_signer.hpp"
#include "sysfs_tree.hpp"

namespace json = boost::json;
namespace fs = std::filesystem;
using gpunode::daemon::Daemon;
using gpunode::service::ApiRequest;
using gpunode::service::ApiResponse;
using gpunode::vmctl::Domain;
using gpunode::vmctl::Tier;
using gpunode::vmctl::WorkloadLabel;
using std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace daemon_test {

constexpr const char* kNode = "node-d";
constexpr const char* kOwner = "org-owner";
constexpr const char* kIssuer = "https://central.test";
constexpr const char* U1 = "u-0000-41-00-0";
constexpr const char* U2 = "u-0000-42-00-0";

inline std::string iso(std::chrono::system_clock::time_point t) {
  return gpunode::reservations::format_time(std::chrono::time_point_cast<std::chrono::seconds>(t));
}

inline Domain spot_vm(const std::string& name, const std::string& uuid, const std::string& address) {
  Domain d;
  d.name = name;
  d.uuid = uuid;
  d.state = "running";
  d.pci_addresses = {address};
  d.label = WorkloadLabel{"vm-" + name, "org-b", Tier::spot};
  return d;
}

// A TCP port nobody listens on now (api.listen takes no port 0).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

// A host with two GPU units, a config in a temp dir, a self-signed TLS pair and a token key.
class Node {
 public:
  explicit Node(std::string extra_admin = "") : key_(gpunode::auth::testing::KeyKind::ed25519) {
    tree_.add("0000:41:00.0", "10de", "2330", "030200", "vfio-pci", 1);
    tree_.add("0000:42:00.0", "10de", "2330", "030200", "vfio-pci", 2);
    dir_ = tree_.root() / "agent";
    fs::create_directories(dir_);
    const std::string openssl = fmt::format(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout {0}/tls.key -out "
        "{0}/tls.crt -days 2 "
        "-subj /CN=localhost >/dev/null 2>&1",
        dir_.string());
    REQUIRE(std::system(openssl.c_str()) == 0);
    std::ofstream(dir_ / "key.pub") << key_.public_pem();
    listen_ = fmt::format("127.0.0.1:{}", free_port());
    write_config(extra_admin, listen_);
  }
  ~Node() {
    if (daemon_) stop();
  }

  void write_config(const std::string& extra_admin, const std::string& listen,
                    const std::string& unsellable = "[]") {
    std::ofstream(dir_ / "agent.yaml.tmp") << fmt::format(
        R"(node:
  id: {node}
  owner_org: {owner}
  unsellable_units: {unsellable}
discovery:
  host_root: {root}
  rescan_interval: {rescan}
api:
  listen: "{listen}"
  tls: {{cert: {dir}/tls.crt, key: {dir}/tls.key}}
auth:
  issuer: {issuer}
  keys: [{dir}/key.pub]
admin:
  socket: {dir}/run/admin.sock
  allowed_uids: [{uid}]{extra}
libvirt:
  uri: test:///default
state:
  dir: {dir}/state
log:
  level: {level}
)",
        fmt::arg("node", kNode), fmt::arg("owner", kOwner), fmt::arg("root", tree_.root().string()),
        fmt::arg("dir", dir_.string()), fmt::arg("issuer", kIssuer), fmt::arg("uid", ::getuid()),
        fmt::arg("extra", extra_admin), fmt::arg("listen", listen), fmt::arg("unsellable", unsellable),
        fmt::arg("level", log_level_), fmt::arg("rescan", rescan_interval_));
    fs::rename(dir_ / "agent.yaml.tmp", dir_ / "agent.yaml");
  }

  gpunode::error::Result<std::unique_ptr<Daemon>> make() {
    gpunode::daemon::DaemonOptions o{(dir_ / "agent.yaml").string(), "/nonexistent/pci.ids", "test", hv_,
                                     clock_};
    o.first_checkpoint_within = first_checkpoint_within_;
    return Daemon::start(std::move(o));
  }
  void start() {
    std::size_t calls_before = 0;
    {
      std::lock_guard lock{hv_->mu};
      calls_before = hv_->calls.size();
    }
    auto d = make();
    REQUIRE_MESSAGE(d, (d ? "" : d.error().detail));
    daemon_ = std::move(*d);
    net_ = std::thread([this] { exit_code_ = daemon_->run(false); });
    // The first workload refresh moves the revision once; tests start from a settled one: its list
    // asked of the hypervisor (however late the lists thread runs), then the revision still.
    const auto listed = [this, calls_before] {
      std::lock_guard lock{hv_->mu};
      const auto from = hv_->calls.begin() + static_cast<std::ptrdiff_t>(calls_before);
      return std::find(from, hv_->calls.end(), "list") != hv_->calls.end();
    };
    for (const auto until = steady_clock::now() + 30s; !listed() && steady_clock::now() < until;)
      std::this_thread::sleep_for(10ms);
    REQUIRE(listed());
    for (auto last = revision();;) {
      std::this_thread::sleep_for(100ms);
      const auto now = revision();
      if (now == last) break;
      last = now;
    }
  }
  void stop() {
    daemon_->stop();
    net_.join();
    daemon_.reset();
  }

  std::string token(std::optional<std::string> org, std::vector<std::string> roles = {}) {
    const auto now = clock_ ? clock_() : std::chrono::system_clock::now();  // valid by the daemon's clock
    const auto exp = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count() + 600;
    json::object claims{
        {"iss", kIssuer}, {"aud", "gpunode"}, {"sub", "user@" + org.value_or("platform")}, {"exp", exp}};
    if (org) claims["org"] = *org;
    if (!roles.empty()) claims["roles"] = json::value_from(roles);
    return gpunode::auth::testing::mint(key_, R"({"alg":"EdDSA","typ":"JWT"})", json::serialize(claims));
  }
  std::string admin() { return token("org-platform", {"platform-admin"}); }

  static ApiRequest request(const std::string& method, const std::string& target, const std::string& tok,
                            const std::string& body = "") {
    ApiRequest q;
    q.method = method;
    const auto qm = target.find('?');
    q.path = target.substr(0, qm);
    q.query = qm == std::string::npos ? "" : target.substr(qm + 1);
    q.body = body;
    q.request_id = "req-daemon-test";
    if (!tok.empty()) q.headers.emplace_back("authorization", "Bearer " + tok);
    if (!body.empty()) q.headers.emplace_back("content-type", "application/json");
    return q;
  }
  // Submits a request; the future is its one answer.
  std::future<ApiResponse> submit(ApiRequest q) {
    auto promise = std::make_shared<std::promise<ApiResponse>>();
    auto f = promise->get_future();
    daemon_->submit(std::move(q), [promise](ApiResponse r) { promise->set_value(std::move(r)); });
    return f;
  }
  ApiResponse call(const std::string& method, const std::string& target, const std::string& tok,
                   const std::string& body = "") {
    auto f = submit(request(method, target, tok, body));
    REQUIRE(f.wait_for(30s) == std::future_status::ready);  // a hang guard, not a bound
    return f.get();
  }
  static std::string path(const std::string& rest) { return std::string("/v1/nodes/") + kNode + rest; }
  static json::value body(const ApiResponse& r) {
    boost::system::error_code ec;
    auto v = json::parse(r.body, ec);
    return ec ? json::value(nullptr) : v;
  }
  std::int64_t revision() { return body(call("GET", path("/state"), admin())).at("revision").as_int64(); }
  std::string create(const std::string& unit, const std::string& starts = "", const std::string& ends = "") {
    json::object b{{"unitIds", json::array{json::value(unit)}},
                   {"audienceOrgIds", json::array{"org-a"}},
                   {"endsAt", ends.empty() ? iso(std::chrono::system_clock::now() + 24h) : ends}};
    if (!starts.empty()) b["startsAt"] = starts;
    auto r = call("POST", path("/reservations"), admin(), json::serialize(b));
    REQUIRE_MESSAGE(r.status == 201, r.body);
    return std::string(body(r).at("id").as_string());
  }

  // The audit actions state.db holds, read from the file (not asked of the agent, whose requests
  // apply the terms due).
  std::multiset<std::string> stored_actions() {
    std::multiset<std::string> out;
    auto db = gpunode::store::Database::open(dir_ / "state" / "state.db");
    if (!db) return out;
    auto st = db->prepare("SELECT record FROM audit ORDER BY seq");
    if (!st) return out;
    while (st->step().value_or(gpunode::store::Statement::Step::done) ==
           gpunode::store::Statement::Step::row) {
      boost::system::error_code ec;
      auto v = json::parse(st->column_text(0), ec);
      if (!ec && v.is_object() && v.as_object().contains("action"))
        out.emplace(v.as_object().at("action").as_string());
    }
    return out;
  }

  // The config again, at this log level (the captured-log tests read info lines).
  void log_at(const std::string& level) {
    log_level_ = level;
    write_config("", listen_);
  }
  // The config again, with this rescan interval (discovery.rescan_interval).
  void rescan_every(const std::string& interval) {
    rescan_interval_ = interval;
    write_config("", listen_);
  }
  std::string vm_state(const std::string& uuid) {
    std::lock_guard lock{hv_->mu};
    const auto* d = hv_->find(uuid);
    return d != nullptr ? d->state : "";
  }

  std::string log_level_ = "error";
  std::string rescan_interval_ = "30s";
  gpunode::service::Clock clock_;  // empty: the system's
  std::chrono::milliseconds first_checkpoint_within_ = gpunode::daemon::AuditCheckpoints::kFirstWithin;
  gpunode::testing::Tree tree_;
  gpunode::auth::testing::TestKey key_;
  fs::path dir_;
  std::string listen_;
  std::shared_ptr<gpunode::vmctl::FakeHypervisor> hv_ = std::make_shared<gpunode::vmctl::FakeHypervisor>();
  std::unique_ptr<Daemon> daemon_;
  std::thread net_;
  int exit_code_ = -1;
};

// Polls `cond` every 20 ms until it holds or `wait` has passed; its last value.
inline bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds wait) {
  const auto until = steady_clock::now() + wait;
  while (!cond() && steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  return cond();
}

// One HTTP/1.1 request over the admin socket; the raw response.
inline std::string over_admin_socket(const fs::path& socket, const std::string& target) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket.c_str());
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  const std::string req =
      fmt::format("GET {} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n", target);
  REQUIRE(::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

}  // namespace daemon_test
