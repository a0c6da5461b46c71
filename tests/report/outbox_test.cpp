// Unit tests of gpunode::report::Outbox over a real SQLite file with the service's outbox schema:
// batches in seq order after the acknowledged seq, deletes through an ack only, depth and age
// without counting rows, and where delivery stands after a restart.
#include "gpunode/report/outbox.hpp"

#include <doctest/doctest.h>

#include <string>

#include "temp_dir.hpp"

namespace {

namespace report = gpunode::report;
using gpunode::store::Database;
using gpunode::test::TempDir;

// The NodeService's tables as far as the reporter reads them (agent/service/node_state.cpp).
void make_state(const std::filesystem::path& file, std::int64_t events, std::int64_t event_seq) {
  auto db = Database::open(file);
  REQUIRE(db);
  REQUIRE(
      db->exec("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;"
               "CREATE TABLE outbox (seq INTEGER PRIMARY KEY, event TEXT NOT NULL, delivered INTEGER NOT "
               "NULL DEFAULT 0);"));
  auto meta = db->prepare("INSERT INTO meta (key, value) VALUES ('event_seq', ?1)");
  REQUIRE(meta);
  REQUIRE(meta->bind(1, std::to_string(event_seq)));
  REQUIRE(meta->run());
  for (std::int64_t s = event_seq - events + 1; s <= event_seq; ++s) {
    auto st = db->prepare("INSERT INTO outbox (seq, event) VALUES (?1, ?2)");
    REQUIRE(st);
    const std::string at =
        "2027-01-31T00:00:" + std::string(s % 60 < 10 ? "0" : "") + std::to_string(s % 60) + "Z";
    REQUIRE(st->bind_all(
        s, R"({"seq":)" + std::to_string(s) + R"(,"id":"e","type":"t","at":")" + at + R"(","data":{}})"));
    REQUIRE(st->run());
  }
}

}  // namespace

TEST_CASE("a fresh outbox: everything from seq 1, in order, a batch at a time") {
  TempDir dir;
  make_state(dir / "state.db", 1200, 1200);
  auto ob = report::Outbox::open(dir / "state.db");
  REQUIRE(ob);
  CHECK(ob->acknowledged() == 0);
  auto stats = ob->stats();
  REQUIRE(stats);
  CHECK(stats->depth == 1200);
  CHECK(stats->first_seq == 1);
  CHECK(stats->last_seq == 1200);
  CHECK(stats->oldest_at == "2027-01-31T00:00:01Z");

  report::BatchBuilder b("n");
  auto r = ob->read_batch(0, b);
  REQUIRE(r);
  CHECK(!r->bad);
  CHECK(b.count() == report::Limits::kBatchEvents);
  CHECK(b.first() == 1);
  CHECK(b.last() == 500);
  report::BatchBuilder after("n");
  REQUIRE(ob->read_batch(1000, after));
  CHECK(after.count() == 200);
  CHECK(after.first() == 1001);
}

TEST_CASE("deletes go through the acknowledged seq only, and a restart resumes after it") {
  TempDir dir;
  make_state(dir / "state.db", 30, 30);
  {
    auto ob = report::Outbox::open(dir / "state.db");
    REQUIRE(ob);
    CHECK(ob->delete_through(12) == 12);
    CHECK(ob->delete_through(12) == 0);
    auto stats = ob->stats();
    REQUIRE(stats);
    CHECK(stats->depth == 18);
    CHECK(stats->first_seq == 13);
    CHECK(stats->oldest_at == "2027-01-31T00:00:13Z");
  }
  auto again = report::Outbox::open(dir / "state.db");  // a restart
  REQUIRE(again);
  CHECK(again->acknowledged() == 12);
  report::BatchBuilder b("n");
  REQUIRE(again->read_batch(12, b));
  CHECK(b.first() == 13);
  CHECK(b.last() == 30);
  CHECK(again->delete_through(30) == 18);
  auto empty = again->stats();
  REQUIRE(empty);
  CHECK(empty->depth == 0);
  CHECK(empty->oldest_at == std::nullopt);
  CHECK(again->acknowledged() == 30);  // from meta's event_seq: all of them went
}

TEST_CASE("an empty outbox of a state that never had events") {
  TempDir dir;
  make_state(dir / "state.db", 0, 0);
  auto ob = report::Outbox::open(dir / "state.db");
  REQUIRE(ob);
  CHECK(ob->acknowledged() == 0);
  report::BatchBuilder b("n");
  REQUIRE(ob->read_batch(0, b));
  CHECK(b.count() == 0);
}

TEST_CASE("a damaged row stops the batch before it and is reported") {
  TempDir dir;
  make_state(dir / "state.db", 5, 5);
  {
    auto db = Database::open(dir / "state.db");
    REQUIRE(db);
    REQUIRE(db->exec("UPDATE outbox SET event = 'garbage' WHERE seq = 3"));
  }
  auto ob = report::Outbox::open(dir / "state.db");
  REQUIRE(ob);
  report::BatchBuilder b("n");
  auto r = ob->read_batch(0, b);
  REQUIRE(r);
  REQUIRE(r->bad);
  CHECK(b.count() == 2);
  CHECK(r->bad->detail == "outbox row 3 is not a JSON object");
  CHECK(r->bad->code == gpunode::error::Errc::corrupt);
}

TEST_CASE("no state file: an error naming it, and no file is made") {
  TempDir dir;
  auto ob = report::Outbox::open(dir / "state.db");
  REQUIRE(!ob);
  CHECK(ob.error().detail.find("state.db") != std::string::npos);
  CHECK(ob.error().code == gpunode::error::Errc::not_found);
  CHECK(!std::filesystem::exists(dir / "state.db"));
}
