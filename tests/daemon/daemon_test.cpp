// The daemon in process (gpunode::daemon::Daemon) with the fake hypervisor: start and what stops it
// from starting, requests, parked long polls (answered exactly once, at their own deadline, also
// while changes land), terms by the clock, SIGHUP, SIGTERM with parked polls and running
// terminations, the admin socket's mode and group.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "node.hpp"

using namespace daemon_test;

TEST_CASE("daemon: serves requests in process and on the admin socket, made 0660 in a 0750 directory") {
  Node n;
  n.start();
  auto health = n.call("GET", "/healthz", "");
  CHECK(health.status == 200);
  CHECK(n.call("GET", Node::path("/units"), n.admin()).status == 200);
  const auto sock = n.dir_ / "run/admin.sock";
  struct stat st {};
  REQUIRE(::stat(sock.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0660);
  REQUIRE(::stat(sock.parent_path().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0750);
  const auto raw = over_admin_socket(sock, Node::path("/units"));
  CHECK(raw.starts_with("HTTP/1.1 200"));
  CHECK(raw.find(U1) != std::string::npos);
}

TEST_CASE("daemon: a started agent ignores SIGPIPE (a peer that hung up is EPIPE, not the agent's death)") {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  REQUIRE(::sigaction(SIGPIPE, &dfl, nullptr) == 0);  // as a shell that does not ignore it starts us
  Node n;
  n.start();
  struct sigaction now {};
  REQUIRE(::sigaction(SIGPIPE, nullptr, &now) == 0);
  const bool ignored = now.sa_handler == SIG_IGN;
  CHECK(ignored);
  // And so a write to a socket whose other end is closed fails with EPIPE, in this process.
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  ::close(fds[1]);
  CHECK(::write(fds[0], "x", 1) == -1);
  CHECK(errno == EPIPE);
  ::close(fds[0]);
}

TEST_CASE("daemon: the admin socket's group is admin.allowed_group when it exists") {
  // The test's own primary group stands for the admin group.
  group* g = ::getgrgid(::getgid());
  REQUIRE(g != nullptr);
  Node n(fmt::format("\n  allowed_group: {}", g->gr_name));
  n.start();
  struct stat st {};
  REQUIRE(::stat((n.dir_ / "run/admin.sock").c_str(), &st) == 0);
  CHECK(st.st_gid == ::getgid());
  CHECK((st.st_mode & 0777) == 0660);
}

TEST_CASE("daemon: the first record after start is signed soon, not an audit.checkpoint_interval later") {
  Node n;
  n.first_checkpoint_within_ = 300ms;  // 30 s in a real agent; the interval stays the default 1 h
  n.start();
  n.create(U1);
  const auto head = [&] {
    auto records = Node::body(n.call("GET", Node::path("/audit"), n.admin())).at("records").as_array();
    return records.empty() ? std::string() : std::string(records.back().at("id").as_string());
  };
  const auto signed_head = [&] {
    auto cps =
        Node::body(n.call("GET", Node::path("/audit/checkpoints"), n.admin())).at("checkpoints").as_array();
    return cps.empty() ? std::string() : fmt::format("aud_{}", cps.back().at("seq").as_int64());
  };
  REQUIRE_FALSE(head().empty());
  CHECK(eventually([&] { return signed_head() == head(); }, 30s));  // a hang guard, not a bound
}

TEST_CASE("daemon: a second agent on the same state directory refuses to start, naming it and the holder") {
  Node n;
  n.start();
  auto second = n.make();
  REQUIRE_FALSE(second);
  CHECK(second.error().detail.find((n.dir_ / "state").string()) != std::string::npos);
  CHECK(second.error().detail.find(fmt::format("pid {}", ::getpid())) != std::string::npos);
  CHECK(second.error().code == gpunode::error::Errc::busy);  // held by another agent: may pass later
  CHECK(n.call("GET", "/healthz", "").status == 200);        // the first one is untouched
}

TEST_CASE("daemon: a host root without sys/bus/pci refuses to start and marks nothing absent") {
  Node n;
  n.start();
  n.create(U1);
  n.stop();
  fs::rename(n.tree_.root() / "sys", n.tree_.root() / "sys.moved");
  auto refused = n.make();
  REQUIRE_FALSE(refused);
  CHECK(refused.error().detail.find((n.tree_.root() / "sys/bus/pci").string()) != std::string::npos);
  CHECK(refused.error().code ==
        gpunode::error::Errc::invalid);  // a file the config names: the config is refused
  fs::rename(n.tree_.root() / "sys.moved", n.tree_.root() / "sys");
  n.start();
  auto units = Node::body(n.call("GET", Node::path("/units"), n.admin())).at("units").as_array();
  REQUIRE(units.size() == 2);
  for (const auto& u : units) CHECK(u.at("reservable") == true);  // nothing became absent
}

TEST_CASE("daemon: a long poll is answered 304 at its own deadline, and at once by a change") {
  Node n;
  n.start();
  const auto rev = n.revision();
  auto t0 = steady_clock::now();
  auto poll =
      n.submit(Node::request("GET", Node::path(fmt::format("/state?after={}&wait=1500ms", rev)), n.admin()));
  // Not before its deadline; then answered (the wait below is how long the test waits, not a bound
  // on the agent's speed).
  REQUIRE(poll.wait_for(30s) == std::future_status::ready);
  const auto took = steady_clock::now() - t0;
  auto r = poll.get();
  CHECK(r.status == 304);
  CHECK(took >= 1500ms);

  auto woken =
      n.submit(Node::request("GET", Node::path(fmt::format("/state?after={}&wait=60s", rev)), n.admin()));
  std::this_thread::sleep_for(200ms);
  CHECK(woken.wait_for(0s) == std::future_status::timeout);
  n.create(U1);
  REQUIRE(woken.wait_for(30s) == std::future_status::ready);  // a hang guard, not a bound
  auto w = woken.get();
  CHECK(w.status == 200);
  CHECK(Node::body(w).at("revision").as_int64() > rev);
}

TEST_CASE("daemon: many parked polls whose waits end while changes land are each answered exactly once") {
  Node n;
  n.start();
  const auto rev = n.revision();
  constexpr int kPolls = 300;
  std::mutex mu;
  std::map<int, int> answers;
  std::map<int, unsigned> statuses;
  std::atomic<int> done = 0;
  std::mt19937 rng(7);
  for (int i = 0; i < kPolls; ++i) {
    // Half wait for a revision far ahead, their deadlines spread over the changes (each ends at its
    // wait, re-parked by every change until then); half for the next revision, with a wait long
    // enough that only a change can answer them.
    const auto after = i % 2 == 0 ? rev + 1000000 : rev;
    const int wait_ms = i % 2 == 0 ? 20 + static_cast<int>(rng() % 600) : 120000;
    auto q =
        Node::request("GET", Node::path(fmt::format("/state?after={}&wait={}ms", after, wait_ms)), n.admin());
    n.daemon_->submit(std::move(q), [&, i](ApiResponse r) {
      std::lock_guard lock{mu};
      answers[i] += 1;
      statuses[i] = r.status;
      ++done;
    });
  }
  // Changes land while the waits end: creates and ends, each a new revision.
  for (int k = 0; k < 20; ++k) {
    const auto id = n.create(k % 2 == 0 ? U1 : U2);
    CHECK(n.call("POST", Node::path("/reservations/" + id + "/end"), n.admin(), "{}").status == 200);
    std::this_thread::sleep_for(10ms);
  }
  REQUIRE(eventually([&] { return done.load() >= kPolls; }, 60s));
  // A second answer to any of them would come from a change or a deadline: one more change, and a
  // wait past the longest deadline above, without a sleep: a poll parked after both answers it.
  n.create(U1);
  auto last = n.submit(Node::request("GET", Node::path("/state?after=1000000000&wait=700ms"), n.admin()));
  REQUIRE(last.wait_for(30s) == std::future_status::ready);
  std::lock_guard lock{mu};
  REQUIRE(answers.size() == kPolls);
  for (const auto& [i, count] : answers) {
    CAPTURE(i);
    CHECK(count == 1);
    // Its revision never comes: answered at its wait; the next revision came: answered by it.
    CHECK(statuses[i] == (i % 2 == 0 ? 304U : 200U));
  }
}

TEST_CASE(
    "daemon: terms start and end at their instants by the wall-clock timer, with no request to prompt them") {
  Node n;
  n.start();
  // Whole seconds, two and three from now: the audit's times are whole seconds too.
  const auto now = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
  const auto starts = now + 2s;
  const auto ends = now + 3s;
  const auto id = n.create(U1, iso(starts), iso(ends));
  CHECK(
      std::string(
          Node::body(n.call("GET", Node::path("/reservations/" + id), n.admin())).at("state").as_string()) ==
      "scheduled");
  // No request until both are recorded (read from state.db, not asked of the agent): a request
  // applies the terms due too, so only the timer can have recorded them at their instants.
  REQUIRE(eventually([&] { return n.stored_actions().count("reservation.expire") == 1; }, 30s));
  CHECK(
      std::string(
          Node::body(n.call("GET", Node::path("/reservations/" + id), n.admin())).at("state").as_string()) ==
      "ended");
  auto audit = Node::body(n.call("GET", Node::path("/audit"), n.admin())).at("records").as_array();
  std::map<std::string, std::vector<std::string>> at;
  for (const auto& r : audit)
    at[std::string(r.at("action").as_string())].emplace_back(r.at("at").as_string());
  REQUIRE(at["reservation.activate"].size() == 1);
  REQUIRE(at["reservation.expire"].size() == 1);
  // Within the second of each instant (CONTRACT §7), not at a request that came later.
  CHECK(at["reservation.activate"][0] == iso(starts));
  CHECK(at["reservation.expire"][0] == iso(ends));
}

TEST_CASE(
    "daemon: a create checks occupancy against the list libvirt's events keep current, and lists again after "
    "an event") {
  Node n;
  n.hv_->events = true;
  n.start();
  const auto lists = [&] { return n.hv_->count("list"); };
  const auto before = lists();
  const auto first = n.create(U1);  // starting now: both are checked for occupancy
  n.create(U2);
  CHECK(lists() <= before + 1);  // the second create used the list the first one made
  auto ended = n.call("POST", Node::path("/reservations/" + first + "/end"), n.admin(), "{}");
  REQUIRE_MESSAGE(ended.status == 200, ended.body);
  // An org outside the audience starts a VM on U1: libvirt's event drops the kept list, so the
  // next check sees the VM (listing itself, or with the refresh the event started).
  auto vm = spot_vm("other", "6b1d2c3e-0000-4000-8000-000000000001", "0000:41:00.0");
  vm.label = WorkloadLabel{"vm-other", "org-x", Tier::on_demand};
  {
    std::lock_guard lock{n.hv_->mu};
    n.hv_->domains.push_back(vm);
  }
  n.hv_->emit();
  json::object b{{"unitIds", json::array{U1}},
                 {"audienceOrgIds", json::array{"org-a"}},
                 {"endsAt", iso(std::chrono::system_clock::now() + 1h)}};
  auto blocked = n.call("POST", Node::path("/reservations"), n.admin(), json::serialize(b));
  CHECK_MESSAGE(blocked.status == 409, blocked.body);
  CHECK(blocked.body.find("unit-occupied") != std::string::npos);
}

TEST_CASE("daemon: a PCI device the kernel announces is in the units at once, not at the next rescan" *
          doctest::test_suite("root")) {
  Node n;
  n.rescan_every("1h");  // only the uevent can bring the new unit within the test
  n.start();
  auto units = [&] {
    return Node::body(n.call("GET", Node::path("/units"), n.admin())).at("units").as_array().size();
  };
  REQUIRE(units() == 2);
  n.tree_.add("0000:43:00.0", "10de", "2330", "030200", "vfio-pci", 3);
  const int fd = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_KOBJECT_UEVENT);
  REQUIRE(fd >= 0);
  sockaddr_nl to{};
  to.nl_family = AF_NETLINK;
  to.nl_groups = 1;
  std::string m;
  for (const char* field : {"add@/devices/pci0000:00/0000:43:00.0", "ACTION=add", "SUBSYSTEM=pci"})
    (m += field) += '\0';
  const bool sent = ::sendto(fd, m.data(), m.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof to) ==
                    static_cast<ssize_t>(m.size());
  ::close(fd);
  REQUIRE_MESSAGE(sent, "sendto on the uevent group as root: " << std::strerror(errno));
  // The rescan interval is an hour: only the uevent can bring the new unit (the 30 s is a hang guard,
  // not a bound on the daemon's speed).
  CHECK(eventually([&] { return units() == 3; }, 30s));
}

TEST_CASE(
    "daemon: SIGHUP applies what it can, names the keys that need a restart, keeps the config when the file "
    "is invalid") {
  Node n;
  n.start();
  CHECK(Node::body(n.call("GET", Node::path("/units"), n.admin())).at("units").as_array()[0].at("sellable") ==
        true);
  n.write_config("", "127.0.0.1:1",
                 fmt::format("[{}]", U1));  // api.listen needs a restart; unsellable applies
  CHECK(n.daemon_->reload_now());
  auto units = Node::body(n.call("GET", Node::path("/units"), n.admin())).at("units").as_array();
  CHECK(units[0].at("id") == U1);
  CHECK(units[0].at("sellable") == false);
  CHECK(n.call("GET", "/healthz", "").status == 200);  // still serving where it was
  std::ofstream(n.dir_ / "agent.yaml") << "node: [\n";
  CHECK_FALSE(n.daemon_->reload_now());
  CHECK(n.call("GET", Node::path("/units"), n.admin()).status == 200);
}

TEST_CASE("daemon: SIGTERM answers parked polls and running terminations, then stops") {
  Node n;
  n.hv_->domains = {spot_vm("s1", "uuid-s1", "0000:41:00.0")};
  n.hv_->ignore_shutdown.insert("uuid-s1");  // a guest that ignores ACPI: the grace runs out
  n.start();
  const auto rev = n.revision();
  auto poll = n.submit(
      Node::request("GET", Node::path(fmt::format("/state?after={}&wait=120s", rev + 1000)), n.admin()));
  // A grace of 300 s (the most a caller may ask): answered within the test's 30 s, it was cut short
  // (the 30 s is a hang guard, not a bound on the daemon's speed).
  auto term = n.submit(
      Node::request("POST", Node::path("/terminate-spot"), n.token(kOwner), R"({"gracePeriodSeconds":300})"));
  // The guest asked to stop: the termination is waiting out its grace.
  REQUIRE(eventually(
      [&] {
        std::lock_guard lock{n.hv_->mu};
        return std::find(n.hv_->calls.begin(), n.hv_->calls.end(), "shutdown uuid-s1") != n.hv_->calls.end();
      },
      30s));
  CHECK(term.wait_for(0s) == std::future_status::timeout);
  n.daemon_->stop();
  REQUIRE(poll.wait_for(30s) == std::future_status::ready);
  REQUIRE(term.wait_for(30s) == std::future_status::ready);
  CHECK(poll.get().status == 304);
  auto t = term.get();
  CHECK(t.status == 503);  // cut short: nothing is recorded as terminated that was not
  n.net_.join();
  CHECK(n.exit_code_ == 0);
  n.daemon_.reset();
  {
    std::lock_guard lock{n.hv_->mu};
    CHECK(n.hv_->find("uuid-s1")->state == "running");
    n.hv_->ignore_shutdown.clear();
  }
  // The next start finishes it, as the agent.
  n.start();
  CHECK(eventually([&] { return n.vm_state("uuid-s1") == "shutoff"; }, 30s));
}

TEST_CASE("daemon: a terminate-spot with a 60 s grace is answered after its grace, not cut short") {
  Node n;
  n.hv_->domains = {spot_vm("s1", "uuid-s1", "0000:41:00.0")};
  n.hv_->ignore_shutdown.insert("uuid-s1");
  n.start();
  // 60 s of grace: twice the generic timeout the daemon used to cut requests off at (30 s).
  const auto t0 = steady_clock::now();
  auto term = n.submit(
      Node::request("POST", Node::path("/terminate-spot"), n.token(kOwner), R"({"gracePeriodSeconds":60})"));
  REQUIRE(term.wait_for(150s) == std::future_status::ready);  // a hang guard, not a bound
  const auto took = steady_clock::now() - t0;
  auto r = term.get();
  CHECK(r.status == 200);
  CHECK(took >= 60s);
  auto terminated = Node::body(r).at("terminated").as_array();
  REQUIRE(terminated.size() == 1);
  CHECK(terminated[0].at("vmId") == "vm-s1");
}

TEST_CASE(
    "daemon: /metrics on the admin socket while requests run: values follow the changes, each answer counted "
    "once") {
  Node n;
  n.start();
  const auto sock = n.dir_ / "run/admin.sock";
  auto metric = [](const std::string& raw, const std::string& series) -> std::optional<double> {
    const auto at = raw.find("\n" + series + " ");
    if (at == std::string::npos) return std::nullopt;
    return std::stod(raw.substr(at + series.size() + 2));
  };
  const auto first = over_admin_socket(sock, "/metrics");
  REQUIRE(first.starts_with("HTTP/1.1 200"));
  CHECK(first.find("Content-Type: text/plain; version=0.0.4; charset=utf-8") != std::string::npos);
  CHECK(metric(first, R"(gpunode_reservations{state="active"})") == 0.0);
  // Creates on the core thread (in process), GETs over the admin socket (net thread, counted by the
  // server's observer) and scrapes (core thread, reading what the net thread recorded), all at once.
  constexpr int kCreates = 5, kGets = 20, kScrapes = 10;
  std::thread creates([&] {
    const auto t0 = std::chrono::system_clock::now() + 48h;
    for (int i = 0; i < kCreates; ++i)
      n.create(U2, iso(t0 + std::chrono::hours(2 * i)), iso(t0 + std::chrono::hours(2 * i + 1)));
  });
  std::thread gets([&] {
    for (int i = 0; i < kGets; ++i)
      CHECK(over_admin_socket(sock, Node::path("/units")).starts_with("HTTP/1.1 200"));
  });
  for (int i = 0; i < kScrapes; ++i) CHECK(over_admin_socket(sock, "/metrics").starts_with("HTTP/1.1 200"));
  creates.join();
  gets.join();
  const auto last = over_admin_socket(sock, "/metrics");
  CHECK(metric(last, R"(gpunode_reservations{state="scheduled"})") == double(kCreates));
  CHECK(metric(last, "gpunode_state_revision") == double(n.revision()));
  CHECK(metric(last,
               R"(gpunode_http_requests_total{route="/v1/nodes/{nodeId}/units",method="GET",code="200"})") ==
        double(kGets));
  CHECK(metric(last, R"(gpunode_http_requests_total{route="/metrics",method="GET",code="200"})") ==
        double(kScrapes + 1));
  CHECK(
      metric(
          last,
          R"(gpunode_http_request_duration_seconds_count{route="/v1/nodes/{nodeId}/units",method="GET"})") ==
      double(kGets));
  CHECK(metric(last, R"(gpunode_terminations_total{result="ok"})") == 0.0);
  CHECK(metric(last, "gpunode_outbox_events") > 0.0);  // reporting is off: every event waits
}
