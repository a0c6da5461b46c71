// The Reporter in process, against a fake central API made of gpunode::http::Server over real
// mTLS on loopback: every event delivered once, in seq order, through a partial ack and a 503;
// heartbeats with the revision the daemon published; status() read from this thread while the
// reporter's thread writes it; stop() prompt while the central API stalls. Run under ThreadSanitizer
// by `make test-tsan` (label unit): the reporter's shared state is exercised from two threads here.
#include "gpunode/report/reporter.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/json.hpp>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "gpunode/http/client_tls.hpp"
#include "gpunode/http/server.hpp"
#include "gpunode/store/database.hpp"
#include "temp_dir.hpp"
#include "test_certs.hpp"

namespace {

namespace json = boost::json;
namespace report = gpunode::report;
using gpunode::test_certs::certs;
using namespace std::chrono_literals;

// The NodeService's outbox as far as the reporter reads it, with `n` events from seq 1.
void make_outbox(const std::filesystem::path& file, std::int64_t n) {
  auto db = gpunode::store::Database::open(file);
  REQUIRE(db);
  REQUIRE(
      db->exec("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;"
               "CREATE TABLE outbox (seq INTEGER PRIMARY KEY, event TEXT NOT NULL, delivered INTEGER NOT "
               "NULL DEFAULT 0);"));
  auto meta = db->prepare("INSERT INTO meta (key, value) VALUES ('event_seq', ?1)");
  REQUIRE(meta);
  REQUIRE(meta->bind_all(std::to_string(n)));
  REQUIRE(meta->run());
  for (std::int64_t s = 1; s <= n; ++s) {
    auto st = db->prepare("INSERT INTO outbox (seq, event) VALUES (?1, ?2)");
    REQUIRE(st);
    REQUIRE(st->bind_all(s, json::serialize(json::object{{"seq", s},
                                                         {"id", "evt_" + std::to_string(s)},
                                                         {"type", "units.released"},
                                                         {"at", "2027-01-31T00:00:00Z"},
                                                         {"data", json::object{}}})));
    REQUIRE(st->run());
  }
}

// The fake central API: records what arrives; the first events POST is a 503, the second is acked
// only half way; a stall can be switched on.
struct Central {
  boost::asio::io_context io;
  std::optional<gpunode::http::Server> server;
  std::thread thread;
  std::mutex mu;  // guards the members below: written on the server's thread, read by the test
  std::vector<std::int64_t> seqs;       // every event seq received, in arrival order
  std::vector<std::int64_t> revisions;  // every heartbeat's revision
  int event_posts = 0;
  bool client_cert_seen = true;
  std::atomic<bool> stall{false};
  std::vector<gpunode::http::Reply> stalled;  // answered never (until the server goes)

  std::uint16_t start() {
    auto tls = gpunode::http::make_tls_context({certs().server_cert, certs().server_key, certs().ca});
    REQUIRE(tls);
    server.emplace(
        io, gpunode::http::Limits{},
        [this](gpunode::http::Request q, gpunode::http::Reply reply) {
          handle(std::move(q), std::move(reply));
        },
        nullptr);
    REQUIRE(server->listen_tls("127.0.0.1", 0, *tls));
    thread = std::thread([this] {
      auto guard = boost::asio::make_work_guard(io);
      io.run();
    });
    return server->tls_port();
  }
  ~Central() {
    io.stop();
    if (thread.joinable()) thread.join();
  }

  void handle(gpunode::http::Request q, gpunode::http::Reply reply) {
    std::lock_guard lock{mu};
    boost::system::error_code ec;
    auto body = json::parse(q.body, ec);
    if (q.path.ends_with("/heartbeat")) {
      if (!ec && body.is_object() && body.as_object().contains("revision"))
        revisions.push_back(body.at("revision").as_int64());
      reply({204, {}, ""});
      return;
    }
    if (stall) {
      stalled.push_back(std::move(reply));
      return;
    }
    ++event_posts;
    if (event_posts == 1) {
      reply({503, {{"Retry-After", "1"}}, ""});
      return;
    }
    REQUIRE(!ec);
    const auto& events = body.at("events").as_array();
    std::int64_t acked = 0;
    std::size_t take = event_posts == 2 ? events.size() / 2 : events.size();  // the second POST: half acked
    for (std::size_t i = 0; i < take; ++i) {
      acked = events[i].at("seq").as_int64();
      seqs.push_back(acked);
    }
    reply({200, {{"Content-Type", "application/json"}}, json::serialize(json::object{{"ackedSeq", acked}})});
  }
};

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 20s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

}  // namespace

TEST_CASE(
    "the reporter delivers the outbox once, in order, through a 503 and a partial ack; heartbeats carry the "
    "published revision") {
  gpunode::test::TempDir dir;
  make_outbox(dir / "state.db", 1200);
  Central central;
  const auto port = central.start();
  auto tls = gpunode::http::make_client_tls_context({certs().ca, certs().client_cert, certs().client_key});
  REQUIRE(tls);
  std::atomic<std::int64_t> revision{7};
  report::Options o;
  o.url = "https://127.0.0.1:" + std::to_string(port);
  o.node_id = "node-test";
  o.version = "test";
  o.state_db = dir / "state.db";
  o.tls = *tls;
  o.heartbeat_interval = 200ms;
  o.request_timeout = std::chrono::hours(1);  // only stop() ends the stalled batch below
  std::mutex log_mu;
  std::vector<std::string> lines;  // what the reporter logs, read at the end
  o.log = [&](gpunode::config::LogLevel, const std::string& line) {
    std::lock_guard lock{log_mu};
    lines.push_back(line);
  };
  o.facts = [&] { return report::NodeFacts{revision.load(), true}; };
  auto reporter = report::Reporter::start(o);
  REQUIRE_MESSAGE(reporter, (reporter ? "" : reporter.error().detail));

  // status() from this thread while the reporter's thread delivers (before its first read of the
  // outbox it knows nothing yet: depth 0, acked 0).
  std::int64_t last_acked = 0;
  CHECK(eventually([&] {
    const auto st = (*reporter)->status();
    CHECK(st.acked_seq >= last_acked);  // never goes back
    last_acked = st.acked_seq;
    return st.acked_seq == 1200 && st.outbox_depth == 0;
  }));
  revision = 9;
  CHECK(eventually([&] {
    std::lock_guard lock{central.mu};
    return !central.revisions.empty() && central.revisions.back() == 9;
  }));
  const auto st = (*reporter)->status();
  CHECK(st.acked_seq == 1200);
  CHECK(st.events_delivered == 1200);
  CHECK(st.failures_of(report::Failure::server_error) >= 1);
  {
    std::lock_guard lock{central.mu};
    REQUIRE(central.seqs.size() == 1200);
    for (std::size_t i = 0; i < central.seqs.size(); ++i)
      CHECK(central.seqs[i] == static_cast<std::int64_t>(i + 1));
    for (std::size_t i = 1; i < central.revisions.size(); ++i)
      CHECK(central.revisions[i] >= central.revisions[i - 1]);
  }

  // A stalled central API does not hold stop() back.
  central.stall = true;
  {
    auto db = gpunode::store::Database::open(dir / "state.db");
    REQUIRE(db);
    REQUIRE(db->exec(
        R"(INSERT INTO outbox (seq, event) VALUES (1201, '{"seq":1201,"id":"e","type":"t","at":"2027-01-31T00:00:00Z","data":{}}'))"));
  }
  (*reporter)->notify();
  CHECK(eventually([&] {
    std::lock_guard lock{central.mu};
    return !central.stalled.empty();
  }));
  // The batch's request timeout is an hour: stop() returning at all while the central API still
  // stalls is stop() cutting it short (the 30 s is a hang guard, not a bound on its speed).
  // stop() gives its loops 3 s to end, then stops its thread and says so: the loops ended when
  // asked only if it said nothing of the kind.
  auto stopped = std::async(std::launch::async, [&] { (*reporter)->stop(); });
  CHECK(stopped.wait_for(30s) == std::future_status::ready);
  std::lock_guard lock{log_mu};
  for (const auto& line : lines)
    CHECK_MESSAGE(line.find("did not end when asked") == std::string::npos, line);
}
