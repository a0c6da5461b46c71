// Fuzz target: HTTP requests through the node's service (gpunode::service::NodeService) with the
// fake hypervisor: routes, query strings, headers, bodies and tokens.
//
// The input is a stream of HTTP/1.1 requests, as a keep-alive connection carries them (at most 8),
// parsed by Beast with the server's limits (8 KiB of header, 64 KiB of body) and handed over as
// the server and the daemon do (path and query split, header names lower-cased). Tokens: a client
// cannot sign, so `Authorization: Bearer @NAME` is replaced by a token the service's key signed,
// for NAME one of admin, operator, owner, mgr, aud, other, expired (see kCallers); the header
// `X-Fuzz-Admin-Socket` makes the request come over the admin socket as root. Reservation ids
// are random, so `@rsv` in a path stands for the id of the last reservation created. The service's
// outcomes are carried out the way the driver does, on this thread: the domains listed from the
// fake, batches of terminations run against it (graces slept by a clock that only counts), a long
// poll answered at its deadline.
//
// Each input starts from the same node: a fresh state directory (on tmpfs when /dev/shm exists),
// three GPU units and the fake's three domains, and a clock that stands still (the node is opened
// again only after an input that changed it: see Node::reset).
//
// GPUNODE_FUZZ_VERBOSE=1 prints each request's answer (to read a reproducer).
//
// Properties: handle() and finish() never throw; every request gets one answer, never a 500; every
// body is strict JSON (valid UTF-8, no duplicate key); a problem body has type, title, status,
// detail and code, with the response's status.
#include <unistd.h>

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "fuzz_check.hpp"
#include "fuzz_keys.hpp"
#include "gpunode/json/strict.hpp"
#include "gpunode/service/node_service.hpp"
#include "gpunode/vmctl/fake_hypervisor.hpp"
#include "jwt_signer.hpp"

namespace {

namespace fs = std::filesystem;
namespace bhttp = boost::beast::http;
namespace service = gpunode::service;
namespace vmctl = gpunode::vmctl;
namespace testing = gpunode::auth::testing;
using gpunode::fuzz::check;

constexpr std::size_t kMaxRequests = 8;
constexpr std::string_view kOwner = "org-owner";

struct Caller {
  std::string_view name;
  std::string_view org;  // empty: none
  std::string_view role;
  long long exp_in;  // seconds from now
};
constexpr Caller kCallers[] = {
    {"admin", "org-platform", "platform-admin", 3600},
    {"operator", "org-platform", "platform-operator", 3600},
    {"owner", "org-owner", "", 3600},
    {"mgr", "org-mgr", "", 3600},
    {"aud", "org-aud", "", 3600},
    {"other", "org-other", "", 3600},
    {"expired", "org-platform", "platform-admin", -3600},
};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

// The node, made once; reset() gives every input the same starting point.
class Node {
 public:
  Node() : key_(testing::TestKey::from_private_pem(testing::KeyKind::ed25519, gpunode::fuzz::kEd25519Pem)) {
    const fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    root_ = base / ("gpunode-fuzz-http-" + std::to_string(::getpid()));
    fs::remove_all(root_);
    make_host();
    gpunode::auth::VerifierConfig vc{std::string(gpunode::fuzz::kIssuer),
                                     std::string(gpunode::fuzz::kAudience),
                                     std::string(gpunode::fuzz::kNodeId), std::chrono::seconds(60)};
    auto verifier = gpunode::auth::TokenVerifier::from_pems({key_.public_pem()}, vc);
    if (!verifier) gpunode::fuzz::fail("the fuzzer's key does not load", verifier.error().detail);
    verifier_ = std::make_shared<const gpunode::auth::TokenVerifier>(std::move(*verifier));
    for (const Caller& c : kCallers) tokens_.emplace(std::string(c.name), mint(c));
  }
  ~Node() {
    service_.reset();
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // A request that changed nothing leaves the revision where the fresh node had it (every change
  // moves it: a reservation, a term, a termination, a rescan that found something); then the node
  // is kept and only the fake is made anew, which spares most inputs the reopening (a database and
  // a scan of the host, the bulk of an input's time otherwise).
  void reset() {
    hypervisor_ = std::make_shared<vmctl::FakeHypervisor>(domains());
    if (service_ && service_->revision() == fresh_revision_) return;
    service_.reset();
    const fs::path state = root_ / "state";
    fs::remove_all(state);
    fs::create_directories(state);
    service::ServiceOptions o;
    o.node_id = gpunode::fuzz::kNodeId;
    o.owner_org = kOwner;
    o.host_root = root_;
    o.state_dir = state;
    o.version = "fuzz";
    auto s = service::NodeService::open(
        o, verifier_, nullptr, [] { return now(); }, nullptr);
    if (!s) gpunode::fuzz::fail("the service does not open", s.error().detail);
    service_ = std::move(*s);
    service_->set_has_hypervisor(true);
    fresh_revision_ = service_->revision();
  }

  // One request, carried out to its answer.
  service::ApiResponse call(service::ApiRequest q) {
    service::Outcome outcome = service_->handle(q);
    for (int step = 0; step < 4; ++step) {
      if (auto* r = std::get_if<service::ApiResponse>(&outcome)) return std::move(*r);
      if (std::holds_alternative<service::NeedsWorkloads>(outcome)) {
        q.workloads =
            std::make_shared<const service::WorkloadListing>(service::WorkloadListing{hypervisor_->list()});
      } else if (std::holds_alternative<service::Park>(outcome)) {
        q.wait_over = true;
      } else if (auto* batch = std::get_if<service::RunBatch>(&outcome)) {
        auto outcomes = vmctl::terminate_spot_all(*hypervisor_, batch->work.jobs,
                                                  [](std::chrono::milliseconds) { return true; });
        return service_->finish(batch->work.batch, std::move(outcomes), hypervisor_->list());
      }
      outcome = service_->handle(q);
    }
    gpunode::fuzz::fail("a request was not answered after its workloads and its deadline",
                        q.method + " " + q.path);
  }

  // `Bearer @NAME` -> a signed token for NAME (else the value as sent).
  std::string authorization(std::string_view value) const {
    constexpr std::string_view prefix = "Bearer @";
    if (!value.starts_with(prefix)) return std::string(value);
    auto it = tokens_.find(std::string(value.substr(prefix.size())));
    return it == tokens_.end() ? std::string(value) : "Bearer " + it->second;
  }

 private:
  static std::chrono::system_clock::time_point now() {
    return std::chrono::system_clock::time_point{std::chrono::seconds(gpunode::fuzz::kNowSeconds)};
  }

  std::string mint(const Caller& c) const {
    boost::json::object claims{{"iss", gpunode::fuzz::kIssuer},
                               {"aud", gpunode::fuzz::kAudience},
                               {"sub", "user@" + std::string(c.org.empty() ? "none" : c.org)},
                               {"exp", gpunode::fuzz::kNowSeconds + c.exp_in}};
    if (!c.org.empty()) claims["org"] = c.org;
    if (!c.role.empty()) claims["roles"] = boost::json::array{boost::json::string(c.role)};
    return testing::mint(key_, R"({"alg":"EdDSA","typ":"JWT"})", boost::json::serialize(claims));
  }

  // Three single-GPU units (the third shares its group with a NIC).
  void make_host() {
    add("0000:41:00.0", "10de", "2330", "030200", "vfio-pci", 1);
    add("0000:42:00.0", "10de", "2330", "030200", "vfio-pci", 2);
    add("0000:43:00.0", "10de", "2330", "030200", "vfio-pci", 3);
    add("0000:43:00.1", "15b3", "1021", "020700", "mlx5_core", 3);
    write(root_ / "proc/cmdline", "BOOT_IMAGE=/vmlinuz ro intel_iommu=on\n");
  }
  static std::vector<vmctl::Domain> domains() {
    auto vm = [](std::string name, std::string uuid, std::string address,
                 std::optional<vmctl::WorkloadLabel> label, std::string state) {
      vmctl::Domain d;
      d.name = std::move(name);
      d.uuid = std::move(uuid);
      d.state = std::move(state);
      d.pci_addresses = {std::move(address)};
      d.label = std::move(label);
      return d;
    };
    // A spot VM of the audience's org on the first unit (a reservation for org-aud may take the
    // unit, and a reclaim terminates it), a VM that is off on the second, an unlabelled one on the
    // third (which is not reservable anyway: a NIC shares its group).
    return {vm("spot-a", "uuid-1", "0000:41:00.0", vmctl::WorkloadLabel{"vm-1", "org-aud", vmctl::Tier::spot},
               "running"),
            vm("off", "uuid-2", "0000:42:00.0",
               vmctl::WorkloadLabel{"vm-2", "org-other", vmctl::Tier::on_demand}, "shutoff"),
            vm("bare", "uuid-3", "0000:43:00.0", std::nullopt, "running")};
  }
  static void write(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
  }
  void add(const std::string& a, const char* vendor, const char* device, const char* cls,
           const std::string& driver, int group) {
    const fs::path d = root_ / "sys/devices/pci0000:00" / a;
    write(d / "vendor", std::string("0x") + vendor + "\n");
    write(d / "device", std::string("0x") + device + "\n");
    write(d / "class", std::string("0x") + cls + "\n");
    write(d / "numa_node", "0\n");
    write(d / "config", std::string(64, '\0'));
    fs::create_directories(root_ / "sys/bus/pci/devices");
    fs::create_directory_symlink(fs::relative(d, root_ / "sys/bus/pci/devices"),
                                 root_ / "sys/bus/pci/devices" / a);
    const fs::path drv = root_ / "sys/bus/pci/drivers" / driver;
    fs::create_directories(drv);
    fs::create_directory_symlink(fs::relative(drv, d), d / "driver");
    const fs::path g = root_ / "sys/kernel/iommu_groups" / std::to_string(group);
    fs::create_directories(g / "devices");
    fs::create_directory_symlink(fs::relative(d, g / "devices"), g / "devices" / a);
    fs::create_directory_symlink(fs::relative(g, d), d / "iommu_group");
  }

  fs::path root_;
  testing::TestKey key_;
  std::shared_ptr<const gpunode::auth::TokenVerifier> verifier_;
  std::map<std::string, std::string> tokens_;
  std::unique_ptr<service::NodeService> service_;
  std::int64_t fresh_revision_ = 0;
  std::shared_ptr<vmctl::FakeHypervisor> hypervisor_;
};

void check_response(const service::ApiResponse& r, const service::ApiRequest& q) {
  const std::string what = q.method + " " + q.path + " -> " + std::to_string(r.status) + " " + r.body;
  check(r.status >= 200 && r.status <= 599, "a status outside 200..599", what);
  check(r.status != 500, "an internal error (500)", what);
  if (r.body.empty()) return;
  auto body = gpunode::json::parse_strict(r.body);
  check(body.has_value(), "a body that is not strict JSON", what);
  const auto type = r.header("Content-Type");
  if (type && *type == "application/problem+json") {
    check(body->is_object(), "a problem that is not an object", what);
    const auto& o = body->get_object();
    for (const char* key : {"type", "title", "status", "detail", "code"})
      check(o.contains(key), "a problem without one of type, title, status, detail, code", what);
    const auto* status = o.if_contains("status");
    check(
        status != nullptr && status->is_int64() && status->get_int64() == static_cast<std::int64_t>(r.status),
        "a problem whose status is not the response's", what);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Node node;
  static const bool verbose = std::getenv("GPUNODE_FUZZ_VERBOSE") != nullptr;
  node.reset();
  std::string last_reservation;

  boost::beast::string_view rest(reinterpret_cast<const char*>(data), size);
  for (std::size_t n = 0; n < kMaxRequests && !rest.empty(); ++n) {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(8 * 1024);
    parser.body_limit(64 * 1024);
    parser.eager(true);
    boost::beast::error_code ec;
    const std::size_t used = parser.put(boost::asio::buffer(rest.data(), rest.size()), ec);
    if (!ec && !parser.is_done()) parser.put_eof(ec);
    if (ec || !parser.is_done()) return 0;  // the server answers 400/413/431 itself
    rest.remove_prefix(used);

    auto msg = parser.release();
    service::ApiRequest q;
    q.method = std::string(msg.method_string());
    const std::string target(msg.target());
    if (const auto mark = target.find('?'); mark != std::string::npos) {
      q.path = target.substr(0, mark);
      q.query = target.substr(mark + 1);
    } else {
      q.path = target;
    }
    if (const auto at = q.path.find("@rsv"); at != std::string::npos && !last_reservation.empty())
      q.path.replace(at, 4, last_reservation);
    for (const auto& field : msg) {
      std::string name = lower(field.name_string());
      if (name == "x-fuzz-admin-socket") {
        q.peer.kind = gpunode::json::Peer::Kind::unix_socket;
        q.peer.uid = 0;
        continue;
      }
      std::string value(field.value());
      if (name == "authorization") value = node.authorization(value);
      q.headers.emplace_back(std::move(name), std::move(value));
    }
    q.body = std::move(msg.body());
    q.request_id = "req-fuzz";
    const service::ApiResponse r = node.call(q);
    if (verbose)
      std::fprintf(stderr, "%s %s -> %u %.200s\n", q.method.c_str(), q.path.c_str(), r.status,
                   r.body.c_str());
    check_response(r, q);
    if (r.status == 201) {
      auto body = gpunode::json::parse_strict(r.body);
      const auto* id = body && body->is_object() ? body->get_object().if_contains("id") : nullptr;
      if (id != nullptr && id->is_string()) last_reservation = std::string(id->get_string());
    }
  }
  return 0;
}
