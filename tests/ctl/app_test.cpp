// The whole command line against a fake agent: which requests each command sends, what it prints,
// and the exit status of each kind of ending (CONTRACT §8).
#include "gpunode/ctl/app.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <boost/json/parse.hpp>
#include <map>

using namespace gpunode::ctl;
namespace json = boost::json;
using namespace std::chrono_literals;

namespace {

const Time kNow = std::chrono::sys_days{std::chrono::year{2027} / 1 / 5} + 10h;

struct FakeAgent {
  // target -> answer; a missing target is a 404 problem.
  std::map<std::string, Response> answers;
  std::vector<Request> seen;
  std::optional<TransportError> down;
};

class FakeTransport final : public Transport {
 public:
  explicit FakeTransport(FakeAgent& a) : a_(a) {}
  std::expected<Response, TransportError> call(const Request& r) override {
    a_.seen.push_back(r);
    if (a_.down) return std::unexpected(*a_.down);
    auto it = a_.answers.find(r.method + " " + r.target);
    if (it != a_.answers.end()) return it->second;
    return Response{
        404,
        {{"content-type", "application/problem+json"}},
        R"({"type":"urn:gpunode:problem:not-found","title":"Not Found","status":404,"detail":"no such resource","code":"not-found","errors":[]})"};
  }

 private:
  FakeAgent& a_;
};

Response ok(std::string body, unsigned status = 200) {
  return Response{status, {{"content-type", "application/json"}}, std::move(body)};
}

struct Fixture {
  FakeAgent agent;
  std::string socket_seen;
  std::optional<std::string> config;
  Env env;

  Fixture() {
    agent.answers["GET /healthz"] = ok(R"({"status":"ok","nodeId":"node-1","version":"0.1.0","revision":7})");
    env.connect = [this](const std::string& path) {
      socket_seen = path;
      return std::make_unique<FakeTransport>(agent);
    };
    env.read_file = [this](std::string_view) { return config; };
    env.now = kNow;
    env.uid = 1000;
    env.version = "0.1.0";
  }

  Result run(std::vector<std::string> args) { return gpunode::ctl::run(args, env); }
};

constexpr std::string_view kReservation =
    R"({"id":"rsv_1","nodeId":"node-1","unitIds":["u-1"],"audienceOrgIds":["org-a"],"managingOrgIds":[],"startsAt":"2027-01-05T10:00:00Z",)"
    R"("endsAt":"2027-02-04T10:00:00Z","state":"active","endedAt":null,"endReason":null,"releasedUnitIds":[],"reclaimingUnitIds":[],)"
    R"("note":"","createdAt":"2027-01-05T10:00:00Z","updatedAt":"2027-01-05T10:00:00Z","version":1})";

}  // namespace

TEST_CASE("--json prints the route's body exactly; the node id comes from the agent") {
  Fixture f;
  const std::string body = R"({"nodeId":"node-1","units":[]})";
  f.agent.answers["GET /v1/nodes/node-1/units"] = ok(body);
  auto r = f.run({"--socket", "/tmp/a.sock", "--json", "units"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == body + "\n");
  CHECK(r.err.empty());
  CHECK(f.socket_seen == "/tmp/a.sock");
  REQUIRE(f.agent.seen.size() == 2);
  CHECK(f.agent.seen[0].target == "/healthz");
  // --json after the command works too.
  CHECK(f.run({"--socket", "/tmp/a.sock", "units", "--json"}).out == body + "\n");
}

TEST_CASE("the socket: --socket, else admin.socket of agent.yaml, else the default") {
  Fixture f;
  f.agent.answers["GET /v1/nodes/node-1/workloads"] = ok(R"({"nodeId":"node-1","workloads":[]})");
  f.config = "admin:\n  socket: /srv/gpunode.sock\n";
  CHECK(f.run({"workloads"}).exit_code == 0);
  CHECK(f.socket_seen == "/srv/gpunode.sock");
  f.config = std::nullopt;
  CHECK(f.run({"workloads"}).out == "no workloads\n");
  CHECK(f.socket_seen == "/run/gpunode/admin.sock");
  f.config = "admin: [oops]\n";
  auto r = f.run({"workloads"});
  CHECK(r.exit_code == 3);
  CHECK(r.err ==
        "gpunodectl: cannot read admin.socket: /etc/gpunode/agent.yaml:1:8: admin must be a mapping, not a "
        "list; pass --socket PATH\n");
}

TEST_CASE(
    "a problem: exit 1, `gpunodectl: CODE: detail` and one line per field error; --json prints its body") {
  Fixture f;
  const std::string problem =
      R"({"type":"urn:gpunode:problem:invalid-request","title":"Bad Request","status":400,"detail":"the body is not a valid reservation",)"
      R"("code":"invalid-request","errors":[{"field":"endsAt","message":"must be after startsAt"},{"field":"note","message":"too long"}]})";
  f.agent.answers["POST /v1/nodes/node-1/reservations"] = Response{400, {}, problem};
  auto r = f.run({"reserve", "--units", "u-1", "--audience", "org-a", "--ends", "+30d"});
  CHECK(r.exit_code == 1);
  CHECK(r.out.empty());
  CHECK(r.err ==
        "gpunodectl: invalid-request: the body is not a valid reservation\n  endsAt: must be after "
        "startsAt\n  note: too long\n");
  auto j = f.run({"--json", "reserve", "--units", "u-1", "--audience", "org-a", "--ends", "+30d"});
  CHECK(j.exit_code == 1);
  CHECK(j.out == problem + "\n");
  CHECK(
      json::parse(f.agent.seen.back().body) ==
      json::parse(
          R"({"unitIds":["u-1"],"audienceOrgIds":["org-a"],"managingOrgIds":[],"endsAt":"2027-02-04T10:00:00Z"})"));

  auto missing = f.run({"reservation", "rsv_nope"});
  CHECK(missing.exit_code == 1);
  CHECK(missing.err == "gpunodectl: not-found: no such resource\n");
}

TEST_CASE("problems name what blocks: overlapping reservations, units' reasons, occupying VMs") {
  Fixture f;
  f.agent.answers["POST /v1/nodes/node-1/reservations"] = Response{
      409,
      {},
      R"({"type":"urn:gpunode:problem:reservation-overlap","title":"Conflict","status":409,"detail":"held by rsv_2","code":"reservation-overlap","errors":[],"blockingReservationIds":["rsv_2"]})"};
  CHECK(f.run({"reserve", "--units", "u-1", "--audience", "a", "--ends", "+1d"}).err ==
        "gpunodectl: reservation-overlap: held by rsv_2\n  blocked by reservation rsv_2\n");
  f.agent.answers["POST /v1/nodes/node-1/reservations"] = Response{
      409,
      {},
      R"({"code":"unit-occupied","detail":"workloads run","errors":[],"workloads":[{"vmId":null,"domainUuid":"d","name":"legacy"},{"vmId":"vm-1","domainUuid":"e","name":"od"}]})"};
  CHECK(f.run({"reserve", "--units", "u-1", "--audience", "a", "--ends", "+1d"}).err ==
        "gpunodectl: unit-occupied: workloads run\n  occupied by VM legacy (unlabelled)\n  occupied by VM od "
        "(vm-1)\n");
  f.agent.answers["POST /v1/nodes/node-1/reservations"] = Response{
      409,
      {},
      R"({"code":"unit-not-reservable","detail":"some units cannot be reserved","errors":[],"units":[{"unitId":"u-1","reasons":[{"code":"mixed-drivers","message":"m"},{"code":"class-not-reservable","message":"c"}]}]})"};
  CHECK(f.run({"reserve", "--units", "u-1", "--audience", "a", "--ends", "+1d"}).err ==
        "gpunodectl: unit-not-reservable: some units cannot be reserved\n  u-1: mixed-drivers, "
        "class-not-reservable\n");
  f.agent.answers["POST /v1/nodes/node-1/reservations"] = Response{502, {}, "<html>bad gateway</html>"};
  auto r = f.run({"reserve", "--units", "u-1", "--audience", "a", "--ends", "+1d"});
  CHECK(r.exit_code == 1);
  CHECK(r.err ==
        "gpunodectl: http-502: the agent answered 502 without a problem body: <html>bad gateway</html>\n");
}

TEST_CASE("the socket missing, denied, stale, refusing or silent: exit 3, the path and what to check") {
  Fixture f;
  auto with = [&](TransportError::Kind k) {
    f.agent.down = TransportError{k, "/run/gpunode/admin.sock", "why"};
    return f.run({"units"});
  };
  auto r = with(TransportError::Kind::missing);
  CHECK(r.exit_code == 3);
  CHECK(r.out.empty());
  CHECK(r.err.starts_with("gpunodectl: no admin socket at /run/gpunode/admin.sock (why)\n"));
  CHECK(r.err.find("is gpunode-agent running") != std::string::npos);
  CHECK(r.err.find("admin.socket") != std::string::npos);
  r = with(TransportError::Kind::denied);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("permission denied on the admin socket /run/gpunode/admin.sock") != std::string::npos);
  CHECK(r.err.find("uid 1000") != std::string::npos);
  CHECK(r.err.find("admin.allowed_group") != std::string::npos);
  r = with(TransportError::Kind::refused_peer);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("refused this caller") != std::string::npos);
  CHECK(r.err.find("uid 1000 is not in admin.allowed_uids and not in admin.allowed_group") !=
        std::string::npos);
  r = with(TransportError::Kind::not_listening);
  CHECK(r.err.find("nothing listens on the admin socket /run/gpunode/admin.sock") != std::string::npos);
  r = with(TransportError::Kind::timeout);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("no answer from the agent at /run/gpunode/admin.sock within why") != std::string::npos);
}

TEST_CASE("usage errors: exit 2 with the usage") {
  Fixture f;
  auto r = f.run({});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("Usage:") != std::string::npos);
  r = f.run({"frobnicate"});
  CHECK(r.exit_code == 2);
  r = f.run({"reserve", "--units", "u-1", "--audience", "a", "--ends", "+30x"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("unknown unit 'x'") != std::string::npos);
  CHECK(r.err.find("Usage: gpunodectl reserve") != std::string::npos);
  r = f.run({"reserve", "--units", "u-1,,u-2", "--audience", "a", "--ends", "+1d"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("empty entry") != std::string::npos);
  CHECK(f.run({"reserve", "--units", "u-1", "--audience", "a"}).exit_code == 2);  // --ends is required
  CHECK(f.run({"reservations", "--state", "gone"}).exit_code == 2);
  CHECK(f.run({"terminate-spot", "--grace", "301"}).exit_code == 2);
  CHECK(f.run({"timeline", "--weeks", "0"}).exit_code == 2);
  CHECK(f.run({"audit", "--limit", "0"}).exit_code == 2);
  CHECK(f.run({"capacity"}).exit_code == 2);
  r = f.run({"amend", "rsv_1"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("nothing to change") != std::string::npos);
  CHECK(f.agent.seen.empty());  // nothing was sent for any of them
  r = f.run({"--help"});
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("terminate-spot") != std::string::npos);
  CHECK(f.run({"reserve", "--help"}).out.find("--managers") != std::string::npos);
  CHECK(f.run({"--version"}).out == "gpunodectl 0.1.0\n");
}

TEST_CASE("commands send their route") {
  Fixture f;
  auto last = [&] { return f.agent.seen.back().method + " " + f.agent.seen.back().target; };
  f.run({"reservation", "rsv_1"});
  CHECK(last() == "GET /v1/nodes/node-1/reservations/rsv_1");
  f.run({"amend", "rsv_1", "--note", "", "--if-match", "2"});
  CHECK(last() == "PATCH /v1/nodes/node-1/reservations/rsv_1");
  CHECK(f.agent.seen.back().body == R"({"note":""})");
  f.run({"amend", "rsv_1", "--managers", ""});
  CHECK(f.agent.seen.back().body == R"({"managingOrgIds":[]})");
  f.run({"amend", "rsv_1", "--managers", "org-m,org-n", "--units", "u-1"});
  CHECK(json::parse(f.agent.seen.back().body) ==
        json::parse(R"({"unitIds":["u-1"],"managingOrgIds":["org-m","org-n"]})"));
  f.run({"end", "rsv_1", "--reason", "done"});
  CHECK(last() == "POST /v1/nodes/node-1/reservations/rsv_1/end");
  f.run({"release", "rsv_1", "--units", "u-1,u-2"});
  CHECK(last() == "POST /v1/nodes/node-1/reservations/rsv_1/release");
  f.run({"reclaim", "rsv_1", "--units", "u-1", "--terminate-spot"});
  CHECK(f.agent.seen.back().body == R"({"unitIds":["u-1"],"terminateSpot":true})");
  f.run({"terminate-spot", "--units", "u-1", "--reservation", "rsv_1", "--grace", "0"});
  CHECK(f.agent.seen.back().body == R"({"unitIds":["u-1"],"reservationId":"rsv_1","gracePeriodSeconds":0})");
  f.run({"capacity", "org-x"});
  CHECK(last() == "GET /v1/nodes/node-1/capacity?org=org-x");
  f.run({"audit", "--after", "aud_3", "--limit", "5"});
  CHECK(last() == "GET /v1/nodes/node-1/audit?limit=5&after=aud_3");
  f.run({"reservations", "--state", "active"});
  CHECK(last() == "GET /v1/nodes/node-1/reservations?limit=500&state=active");
  f.run({"rescan"});
  CHECK(last() == "POST /v1/admin/rescan");
}

TEST_CASE("answers for people") {
  Fixture f;
  f.agent.answers["GET /v1/nodes/node-1/reservations/rsv_1"] = ok(std::string(kReservation));
  auto r = f.run({"reservation", "rsv_1"});
  CHECK(r.exit_code == 0);
  CHECK(r.out ==
        "reservation rsv_1\n"
        "id:               rsv_1\n"
        "state:            active\n"
        "starts:           2027-01-05T10:00:00Z\n"
        "ends:             2027-02-04T10:00:00Z\n"
        "units:            u-1\n"
        "audience:         org-a\n"
        "managers:         -\n"
        "released to spot: -\n"
        "reclaiming:       -\n"
        "note:             -\n"
        "version:          1\n");
  f.agent.answers["POST /v1/admin/rescan"] = ok(R"({"revision":12})");
  CHECK(f.run({"rescan"}).out == "rescanned: revision 12\n");
  CHECK(f.run({"--json", "rescan"}).out == "{\"revision\":12}\n");
  f.agent.answers["POST /v1/nodes/node-1/terminate-spot"] = ok(
      R"({"terminated":[{"vmId":"vm-1","domainUuid":"d","name":"spot-1","unitIds":["u-1"]}],"leftRunning":[{"vmId":null,"domainUuid":"e","name":"legacy","unitIds":["u-1"],"tier":null,"reason":"not-spot"}]})");
  CHECK(f.run({"terminate-spot"}).out ==
        "VM      VMID  UNITS  OUTCOME\n"
        "spot-1  vm-1  u-1    terminated\n"
        "legacy  -     u-1    left running (not-spot)\n");
}

TEST_CASE("an answer that is not JSON, or not the contract's shape, is exit 1 and says where") {
  Fixture f;
  f.agent.answers["GET /v1/nodes/node-1/workloads"] = ok(R"({"nodeId":"node-1","workloads":[{"name":7}]})");
  auto r = f.run({"workloads"});
  CHECK(r.exit_code == 1);
  CHECK(r.err ==
        "gpunodectl: bad-answer: the agent's workload list is not what the contract says: workloads[0].name: "
        "not a string\n");
  f.agent.answers["GET /v1/nodes/node-1/workloads"] = ok(R"({"nodeId":"node-1","workloads":[}")");
  r = f.run({"workloads"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.starts_with(
      "gpunodectl: bad-answer: GET /v1/nodes/node-1/workloads: the body is not JSON: line 1"));
  f.agent.answers["GET /healthz"] = ok(R"({"status":"ok"})");
  r = f.run({"workloads"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("has no nodeId") != std::string::npos);
}

TEST_CASE("status: the node at a glance, from the state, the metrics when served, else the workloads") {
  Fixture f;
  f.agent.answers["GET /v1/nodes/node-1/state"] = ok(
      R"({"nodeId":"node-1","revision":9,"units":[{"id":"u-1","class":"vfio-group","gpuCount":2,"reservable":true},{"id":"u-2","class":"none","gpuCount":1,"reservable":false}],)"
      R"("reservations":[{"id":"rsv_1","state":"active"},{"id":"rsv_2","state":"ended"}],"workloads":[{"name":"a","state":"running"},{"name":"b","state":"shutoff"}]})");
  f.agent.answers["GET /v1/nodes/node-1/workloads"] = Response{
      503,
      {},
      R"({"code":"hypervisor-unavailable","detail":"the hypervisor cannot be reached: down","errors":[]})"};
  auto r = f.run({"status"});
  CHECK(r.exit_code == 0);
  CHECK(r.out ==
        "node:         node-1\n"
        "agent:        gpunode-agent 0.1.0\n"
        "revision:     9\n"
        "units:        2 (3 GPUs; 1 reservable): 1 none, 1 vfio-group\n"
        "reservations: 1 active, 1 ended\n"
        "workloads:    2 (1 running)\n"
        "outbox:       unknown (the agent serves no outbox metric)\n"
        "libvirt:      disconnected: the hypervisor cannot be reached: down\n"
        "unentitled:   unknown (the agent does not say)\n");
  f.agent.answers["GET /metrics"] = Response{
      200, {}, "# TYPE gpunode_outbox_events gauge\ngpunode_outbox_events 4\ngpunode_libvirt_connected 1\n"};
  auto j = f.run({"--json", "status"});
  CHECK(json::parse(j.out) == json::parse(R"({"nodeId":"node-1","version":"0.1.0","revision":9,
      "units":{"total":2,"gpus":3,"reservable":1,"byClass":{"vfio-group":1,"none":1}},
      "reservations":{"scheduled":0,"active":1,"ended":1},"workloads":{"total":2,"running":1},"outboxDepth":4,"libvirt":"connected",
      "unentitledWorkloads":null})"));
  // GET state holds no ended reservation (CONTRACT §4): their count is the agent's metric.
  f.agent.answers["GET /metrics"] =
      Response{200, {}, "gpunode_outbox_events 4\ngpunode_reservations{state=\"ended\"} 7\n"};
  CHECK(json::parse(f.run({"--json", "status"}).out).at("reservations") ==
        json::parse(R"({"scheduled":0,"active":1,"ended":7})"));
  CHECK(f.run({"status"}).out.find("reservations: 1 active, 7 ended\n") != std::string::npos);
  // An agent that judges its domains (CONTRACT §9): the VMs on units they are not entitled to, named.
  f.agent.answers["GET /v1/nodes/node-1/state"] = ok(
      R"({"nodeId":"node-1","revision":9,"units":[],"reservations":[],"workloads":[{"name":"a","domainUuid":"da","state":"running"},)"
      R"({"name":"b\u001b[2J","domainUuid":"db","state":"running"}]})");
  f.agent.answers["GET /v1/admin/unentitled"] =
      ok(R"({"workloads":[{"name":"b","domainUuid":"db","vmId":null,"org":null,"tier":"on-demand",)"
         R"("unitIds":["u-1"],"reasons":[{"code":"unit-reserved","message":"m","unitId":"u-1"}]}]})");
  r = f.run({"status"});
  CHECK(
      r.out.ends_with("unentitled:   1 VM on units it is not entitled to: b\\x1b[2J (u-1: unit-reserved)\n"));
  j = f.run({"--json", "status"});
  CHECK(json::parse(j.out).at("unentitledWorkloads") == 1);
  f.agent.answers["GET /v1/admin/unentitled"] = ok(R"({"workloads":[]})");
  CHECK(f.run({"status"}).out.ends_with("unentitled:   none\n"));
}

// ---- health (CONTRACT §8, §13) ----------------------------------------------------------------

namespace {

constexpr std::string_view kHealth =
    R"j({"nodeId":"node-1","enabled":true,"polledAt":"2027-01-05T10:00:00Z","units":[)j"
    R"j({"unitId":"u-0000-41-00-0","state":"failing","reasons":[{"code":"pcie-fatal-error",)j"
    R"j("pciAddress":"0000:40:01.1","detail":"fatal PCIe errors rose from 0 to 1 (aer_dev_fatal)",)j"
    R"j("since":"2027-01-05T09:58:00Z"}],"devices":[)j"
    R"j({"pciAddress":"0000:41:00.0","role":"gpu","powerState":"D3hot","linkWidth":null,"maxLinkWidth":null,)j"
    R"j("widestLinkWidth":16,"linkSpeed":null,"aer":{"fatal":0,"nonfatal":0,"correctable":0}},)j"
    R"j({"pciAddress":"0000:40:01.1","role":"upstream-port","powerState":"D0","linkWidth":8,"maxLinkWidth":16,)j"
    R"j("widestLinkWidth":16,"linkSpeed":"16.0 GT/s PCIe","aer":{"fatal":1,"nonfatal":0,"correctable":2}}]},)j"
    R"j({"unitId":"u-0000-42-00-0","state":"warning","reasons":[{"code":"aer-not-monitored",)j"
    R"j("pciAddress":"0000:42:00.0","detail":"no aer_dev_* files\u001b[2J","since":"2027-01-05T09:00:00Z"}],)j"
    R"j("devices":[{"pciAddress":"0000:42:00.0","role":"gpu","powerState":"D0","linkWidth":16,"maxLinkWidth":16,)j"
    R"j("widestLinkWidth":16,"linkSpeed":"2.5 GT/s PCIe","aer":null}]}]})j";

}  // namespace

TEST_CASE("health: a row per function with its link, the reasons in full, text from sysfs escaped") {
  Fixture f;
  f.agent.answers["GET /v1/admin/health"] = ok(std::string(kHealth));
  auto r = f.run({"health"});
  CHECK(r.exit_code == 0);
  const std::string want =
      "UNIT            STATE    REASONS            FUNCTION      ROLE           POWER  LINK             "
      "SPEED           AER F/NF/COR\n"
      "u-0000-41-00-0  failing  pcie-fatal-error   0000:41:00.0  gpu            D3hot  -                -    "
      "           0/0/0\n"
      "                                            0000:40:01.1  upstream-port  D0     x8 (widest x16)  16.0 "
      "GT/s PCIe  1/0/2\n"
      "u-0000-42-00-0  warning  aer-not-monitored  0000:42:00.0  gpu            D0     x16              2.5 "
      "GT/s PCIe   not monitored\n"
      "\n"
      "u-0000-41-00-0: pcie-fatal-error on 0000:40:01.1 since 2027-01-05T09:58:00Z: fatal PCIe errors rose "
      "from 0 to 1 (aer_dev_fatal)\n"
      "u-0000-42-00-0: aer-not-monitored on 0000:42:00.0 since 2027-01-05T09:00:00Z: no aer_dev_* "
      "files\\x1b[2J\n";
  CHECK(r.out == want);
  CHECK(f.run({"--json", "health"}).out == std::string(kHealth) + "\n");
}

TEST_CASE("health UNIT asks for that unit; health clear needs --reason and says what is left") {
  Fixture f;
  auto r = f.run({"health", "u-0000-41-00-0"});
  CHECK(r.exit_code == 1);  // the fake's 404
  CHECK(f.agent.seen.back().target == "/v1/admin/units/u-0000-41-00-0/health");
  CHECK(f.run({"health", "clear", "u-0000-41-00-0"}).exit_code == 2);
  f.agent.answers["POST /v1/admin/units/u-0000-41-00-0/health/clear"] = ok(
      R"({"id":"u-0000-41-00-0","iommuGroup":37,"class":"vfio-group","gpuCount":1,"numaNodes":[0],"sellable":true,)"
      R"("reservable":true,"notReservableReasons":[],"gpus":[],"devices":[],"reservationIds":[],)"
      R"("health":{"state":"ok","reasons":[]}})");
  r = f.run({"health", "clear", "u-0000-41-00-0", "--reason", "reseated"});
  CHECK(r.exit_code == 0);
  CHECK(r.out == "u-0000-41-00-0: health cleared; now ok\n");
  CHECK(f.agent.seen.back().method == "POST");
  CHECK(f.agent.seen.back().body == R"({"reason":"reseated"})");
}
