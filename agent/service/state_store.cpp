// StateStore: migrations, loading, the one commit, and the store's reads (idempotency, audit).
#include "state_store.hpp"

#include <fmt/format.h>

#include <charconv>
#include <random>

#include "gpunode/reservations/rules.hpp"
#include "gpunode/store/audit_chain.hpp"

namespace gpunode::service::detail {
namespace json = boost::json;
namespace r = gpunode::reservations;
using store::DbError;

namespace {

const std::vector<store::Migration>& migrations() {
  static const std::vector<store::Migration> list{{1, "initial",
                                                   R"sql(
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
INSERT INTO meta (key, value) VALUES ('revision', '0'), ('audit_seq', '0'), ('event_seq', '0'),
                                     ('audit_last_hash', '0000000000000000000000000000000000000000000000000000000000000000'),
                                     ('inventory_digest', '');
CREATE TABLE reservations (id TEXT PRIMARY KEY, doc TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE units (id TEXT PRIMARY KEY, doc TEXT NOT NULL, absent INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
CREATE TABLE audit (seq INTEGER PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE outbox (seq INTEGER PRIMARY KEY, event TEXT NOT NULL, delivered INTEGER NOT NULL DEFAULT 0);
CREATE TABLE idempotency (caller TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
                          status INTEGER NOT NULL, headers TEXT NOT NULL, body TEXT NOT NULL,
                          created_at INTEGER NOT NULL, PRIMARY KEY (caller, key)) WITHOUT ROWID;
)sql"},
                                                  {2, "terminations",
                                                   R"sql(
CREATE TABLE terminations (audit_seq INTEGER PRIMARY KEY, domain_uuid TEXT NOT NULL, doc TEXT NOT NULL,
                           state TEXT NOT NULL CHECK (state IN ('pending', 'done', 'failed')));
CREATE INDEX terminations_pending ON terminations (state) WHERE state = 'pending';
)sql"},
                                                  {3, "history on disk",
                                                   // Ended reservations stay on disk (CONTRACT §11): load
                                                   // reads the others by `ended`, pages of ended ones are
                                                   // read by it, and an org's by reservation_orgs (every org
                                                   // that was ever its audience or manager: the rules
                                                   // decide on the document). A document that is not JSON
                                                   // counts as not ended, so load() names it as today. The
                                                   // ended ones are counted in meta: a count(*) by the index
                                                   // reads every row (SQLite's index on a virtual column
                                                   // does not cover it), 90 ms a 100,000.
                                                   R"sql(
ALTER TABLE reservations ADD COLUMN ended INTEGER NOT NULL GENERATED ALWAYS AS
  (CASE WHEN json_valid(doc) THEN json_extract(doc, '$.state') IS 'ended' ELSE 0 END) VIRTUAL;
CREATE INDEX reservations_by_ended ON reservations (ended, id);
INSERT INTO meta (key, value) SELECT 'ended_reservations', CAST(count(*) AS TEXT) FROM reservations WHERE ended = 1;
CREATE TABLE reservation_orgs (org TEXT NOT NULL, id TEXT NOT NULL, PRIMARY KEY (org, id)) WITHOUT ROWID;
INSERT OR IGNORE INTO reservation_orgs (org, id)
  SELECT o.value, r.id FROM reservations r, json_each(CASE WHEN json_valid(r.doc) THEN r.doc ELSE '{}' END,
                                                      '$.audienceOrgIds') o WHERE o.type = 'text'
  UNION
  SELECT o.value, r.id FROM reservations r, json_each(CASE WHEN json_valid(r.doc) THEN r.doc ELSE '{}' END,
                                                      '$.managingOrgIds') o WHERE o.type = 'text';
)sql"},
                                                  {4, "audit checkpoints",
                                                   // CONTRACT §12: the signed checkpoints of the audit
                                                   // chain's head, by the head's seq (checkpoint_store.cpp).
                                                   R"sql(
CREATE TABLE checkpoints (seq INTEGER PRIMARY KEY, checkpoint TEXT NOT NULL);
)sql"},
                                                  {5, "unit health",
                                                   // CONTRACT §13 (health_store.cpp): what is kept of each
                                                   // PCI function (its baseline counts, the widest link
                                                   // width seen, ...) and each unit's reasons, as JSON.
                                                   R"sql(
CREATE TABLE health_devices (address TEXT PRIMARY KEY, doc TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE health_units (unit_id TEXT PRIMARY KEY, doc TEXT NOT NULL) WITHOUT ROWID;
)sql"}};
  return list;
}

json::value opt_json(const std::optional<std::string>& s) {
  return s ? json::value(*s) : json::value(nullptr);
}

// Steps `st` to the end, calling `row` on each; the first error stops it.
template <class Row>
std::expected<void, DbError> each_row(store::Statement& st, Row row) {
  while (true) {
    auto step = st.step();
    if (!step) return std::unexpected(step.error());
    if (*step == store::Statement::Step::done) return {};
    if (auto ok = row(st); !ok) return ok;
  }
}

}  // namespace

// Crockford's base32, lower-case: no i, l, o or u.
constexpr std::string_view kIdAlphabet = "0123456789abcdefghjkmnpqrstvwxyz";

std::string new_id(std::string_view prefix, std::chrono::system_clock::time_point now) {
  static constexpr std::string_view kAlphabet = kIdAlphabet;
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const auto ms = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count());
  std::string out(prefix);
  for (int i = 9; i >= 0; --i) out.push_back(kAlphabet[(ms >> (5 * i)) & 31]);
  for (int i = 0; i < 16; ++i) out.push_back(kAlphabet[rng() & 31]);
  return out;
}

bool is_new_id(std::string_view prefix, std::string_view id) {
  if (id.size() != prefix.size() + 26 || !id.starts_with(prefix)) return false;
  return id.substr(prefix.size()).find_first_not_of(kIdAlphabet) == std::string_view::npos;
}

std::expected<StateStore, DbError> StateStore::open(const std::filesystem::path& file, std::string node_id) {
  auto db = store::Database::open(file);
  if (!db) return std::unexpected(db.error());
  if (auto m = db->migrate(migrations()); !m) return std::unexpected(m.error());
  StateStore s(std::move(*db), std::move(node_id));
  if (auto loaded = s.load(); !loaded) return std::unexpected(loaded.error());
  return s;
}

std::expected<void, DbError> StateStore::load() {
  const std::string file = db_.path().string();
  auto meta = db_.prepare("SELECT key, value FROM meta");
  if (!meta) return std::unexpected(meta.error());
  auto counters = each_row(*meta, [&](store::Statement& st) -> std::expected<void, DbError> {
    const std::string key = st.column_text(0), value = st.column_text(1);
    auto number = [&](std::int64_t& out) -> std::expected<void, DbError> {
      auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
      if (ec != std::errc{} || p != value.data() + value.size() || out < 0) {
        return std::unexpected(
            store::corrupt(fmt::format("{}: meta {} is \"{}\", not a counter", file, key, value)));
      }
      return {};
    };
    if (key == "revision") return number(revision_);
    if (key == "audit_seq") return number(audit_seq_);
    if (key == "event_seq") return number(event_seq_);
    if (key == "ended_reservations") return number(ended_);
    if (key == "audit_last_hash") audit_last_hash_ = value;
    if (key == "inventory_digest") inventory_digest_ = value;
    return {};
  });
  if (!counters) return counters;
  // The chain's head is its last record: a commit does not write it into meta as well (one write
  // less per record). meta's audit_seq and audit_last_hash are what an older agent left there.
  auto last = db_.prepare("SELECT seq, record FROM audit ORDER BY seq DESC LIMIT 1");
  if (!last) return std::unexpected(last.error());
  auto head = each_row(*last, [&](store::Statement& st) -> std::expected<void, DbError> {
    const std::int64_t seq = st.column_int64(0);
    if (seq < audit_seq_)
      return std::unexpected(store::corrupt(fmt::format(
          "{}: the last audit record is aud_{}, meta says aud_{} was written", file, seq, audit_seq_)));
    boost::system::error_code ec;
    auto v = json::parse(st.column_text(1), ec);
    const auto* o = ec ? nullptr : v.if_object();
    const auto* h = o ? o->if_contains("hash") : nullptr;
    if (h == nullptr || !h->is_string())
      return std::unexpected(store::corrupt(fmt::format("{}: audit record aud_{} has no hash", file, seq)));
    audit_seq_ = seq;
    audit_last_hash_ = std::string(h->get_string());
    return {};
  });
  if (!head) return head;

  // The reservations not ended; the ended ones stay on disk (counted in meta).
  auto rows = db_.prepare("SELECT id, doc FROM reservations WHERE ended = 0");
  if (!rows) return std::unexpected(rows.error());
  auto reservations = each_row(*rows, [&](store::Statement& st) -> std::expected<void, DbError> {
    auto x = parse_reservation(st.column_text(0), st.column_text(1));
    if (!x) return std::unexpected(x.error());
    loaded_.reservations.emplace(x->id, std::move(*x));
    return {};
  });
  if (!reservations) return reservations;

  auto ts = db_.prepare("SELECT audit_seq, domain_uuid, doc FROM terminations WHERE state = 'pending'");
  if (!ts) return std::unexpected(ts.error());
  auto pending = each_row(*ts, [&](store::Statement& st) -> std::expected<void, DbError> {
    TerminationRow row{st.column_int64(0), st.column_text(1), st.column_text(2), "pending", std::nullopt};
    loaded_.pending.emplace(row.audit_seq, std::move(row));
    return {};
  });
  if (!pending) return pending;

  auto us = db_.prepare("SELECT id, doc FROM units WHERE absent = 1");
  if (!us) return std::unexpected(us.error());
  auto absent = each_row(*us, [&](store::Statement& st) -> std::expected<void, DbError> {
    boost::system::error_code ec;
    auto v = json::parse(st.column_text(1), ec);
    if (!ec && v.is_object()) loaded_.absent_units.emplace(st.column_text(0), std::move(v.get_object()));
    return {};
  });
  if (!absent) return absent;
  return load_health();
}

std::expected<reservations::Reservation, DbError> StateStore::parse_reservation(
    const std::string& id, const std::string& doc) const {
  boost::system::error_code ec;
  auto v = json::parse(doc, ec);
  auto x = ec ? error::fail(error::Errc::invalid, "not JSON") : reservation_from_json(v);
  if (!x)
    return std::unexpected(store::corrupt(
        fmt::format("reservation {} in {}: bad {}", id, db_.path().string(), x.error().detail)));
  return std::move(*x);
}

template <class Row, class... Args>
std::expected<void, DbError> StateStore::read(std::string_view sql, Row row, const Args&... args) {
  auto st = cached(sql);
  if (!st) return std::unexpected(st.error());
  if (auto b = (*st)->bind_all(args...); !b) return std::unexpected(b.error());
  auto done = each_row(**st, row);
  (*st)->reset();
  return done;
}

std::expected<std::optional<reservations::Reservation>, DbError> StateStore::reservation(
    std::string_view id) {
  auto row = reservation_row(id);
  if (!row) return std::unexpected(row.error());
  if (!*row) return std::nullopt;
  auto x = parse_reservation(std::string(id), **row);
  if (!x) return std::unexpected(x.error());
  return std::move(*x);
}

std::expected<std::optional<std::string>, DbError> StateStore::reservation_row(std::string_view id) {
  std::optional<std::string> out;
  auto done = read(
      "SELECT doc FROM reservations WHERE id = ?1",
      [&](store::Statement& row) -> std::expected<void, DbError> {
        out = row.column_text(0);
        return {};
      },
      id);
  if (!done) return std::unexpected(done.error());
  return out;
}

std::expected<bool, DbError> StateStore::org_linked(std::string_view org, std::string_view id) {
  bool linked = false;
  auto done = read(
      "SELECT 1 FROM reservation_orgs WHERE org = ?1 AND id = ?2",
      [&](store::Statement&) -> std::expected<void, DbError> {
        linked = true;
        return {};
      },
      org, id);
  if (!done) return std::unexpected(done.error());
  return linked;
}

std::expected<std::vector<reservations::Reservation>, DbError> StateStore::reservations_after(
    const StoredRows& q) {
  // Both walk an index in id order: reservations_by_ended or the primary key, or reservation_orgs'.
  const std::string_view sql =
      q.org ? (q.ended_only ? "SELECT r.id, r.doc FROM reservation_orgs o JOIN reservations r ON r.id = o.id "
                              "WHERE o.org = ?3 AND o.id > ?1 AND r.ended = 1 ORDER BY o.id LIMIT ?2"
                            : "SELECT r.id, r.doc FROM reservation_orgs o JOIN reservations r ON r.id = o.id "
                              "WHERE o.org = ?3 AND o.id > ?1 ORDER BY o.id LIMIT ?2")
            : (q.ended_only
                   ? "SELECT id, doc FROM reservations WHERE ended = 1 AND id > ?1 ORDER BY id LIMIT ?2"
                   : "SELECT id, doc FROM reservations WHERE id > ?1 ORDER BY id LIMIT ?2");
  std::vector<reservations::Reservation> out;
  auto add = [&](store::Statement& row) -> std::expected<void, DbError> {
    auto x = parse_reservation(row.column_text(0), row.column_text(1));
    if (!x) return std::unexpected(x.error());
    out.push_back(std::move(*x));
    return {};
  };
  const auto limit = static_cast<std::int64_t>(q.limit);
  auto done = q.org ? read(sql, add, q.after, limit, *q.org) : read(sql, add, q.after, limit);
  if (!done) return std::unexpected(done.error());
  return out;
}

std::expected<store::Statement*, DbError> StateStore::cached(std::string_view sql) {
  auto it = statements_.find(sql);
  if (it == statements_.end()) {
    auto st = db_.prepare(sql);
    if (!st) return std::unexpected(st.error());
    it = statements_.emplace(std::string(sql), std::move(*st)).first;
  }
  it->second.reset();
  it->second.clear_bindings();
  return &it->second;
}

template <class... Args>
std::expected<void, DbError> StateStore::write(std::string_view sql, const Args&... args) {
  auto st = cached(sql);
  if (!st) return std::unexpected(st.error());
  if (auto b = (*st)->bind_all(args...); !b) return std::unexpected(b.error());
  return (*st)->run();
}

std::expected<Committed, DbError> StateStore::commit(const Change& c,
                                                     std::chrono::system_clock::time_point wall) {
  const bool moves = c.moves_state();
  Tally t{.seq = audit_seq_, .ev = event_seq_, .ended = ended_, .last_hash = audit_last_hash_, .out = {}};
  t.out.audit_seqs.reserve(c.audits.size());
  auto result = db_.transaction([&](store::Tx&) -> std::expected<void, DbError> {
    for (auto step : {&StateStore::write_reservations, &StateStore::write_units, &StateStore::write_audits,
                      &StateStore::write_events, &StateStore::write_idempotency,
                      &StateStore::write_terminations, &StateStore::write_health}) {
      if (auto w = (this->*step)(c, t, wall); !w) return w;
    }
    return write_meta(c, t, moves);
  });
  if (!result) return std::unexpected(result.error());
  // Committed: the counters follow.
  audit_seq_ = t.seq;
  event_seq_ = t.ev;
  audit_last_hash_ = std::move(t.last_hash);
  ended_ = t.ended;
  if (c.inventory_digest) inventory_digest_ = *c.inventory_digest;
  if (moves) revision_ += 1;
  t.out.revision = revision_;
  return std::move(t.out);
}

std::expected<void, DbError> StateStore::write_reservations(const Change& c, Tally& t, Wall) {
  for (const auto& x : c.upserts) {
    if (x.ended()) {  // ended now, or written again once ended: counted once
      bool ended_before = false;
      auto was = read(
          "SELECT ended FROM reservations WHERE id = ?1",
          [&](store::Statement& row) -> std::expected<void, DbError> {
            ended_before = row.column_int64(0) != 0;
            return {};
          },
          x.id);
      if (!was) return was;
      if (!ended_before) ++t.ended;
    }
    if (auto w = write("INSERT INTO reservations (id, doc) VALUES (?1, ?2) ON CONFLICT(id) DO UPDATE SET "
                       "doc = excluded.doc",
                       x.id, json::serialize(to_json(x)));
        !w) {
      return w;
    }
    for (const auto* orgs : {&x.audience_org_ids, &x.managing_org_ids}) {
      for (const auto& org : *orgs) {
        if (auto w = write("INSERT OR IGNORE INTO reservation_orgs (org, id) VALUES (?1, ?2)", org, x.id); !w)
          return w;
      }
    }
  }
  return {};
}

std::expected<void, DbError> StateStore::write_units(const Change& c, Tally&, Wall) {
  for (const auto& [id, doc_absent] : c.units) {
    if (auto w = write("INSERT INTO units (id, doc, absent) VALUES (?1, ?2, ?3) "
                       "ON CONFLICT(id) DO UPDATE SET doc = excluded.doc, absent = excluded.absent",
                       id, doc_absent.first, doc_absent.second ? 1 : 0);
        !w) {
      return w;
    }
  }
  return {};
}

// Each record sealed onto the chain's head (store::seal_audit_record), numbered after the last.
std::expected<void, DbError> StateStore::write_audits(const Change& c, Tally& t, Wall) {
  for (const auto& a : c.audits) {
    json::object rec;
    rec["id"] = store::format_audit_id(static_cast<std::uint64_t>(++t.seq));
    rec["at"] = r::format_time(c.at);
    rec["actor"] = c.actor.actor();
    rec["action"] = a.action;
    rec["nodeId"] = node_id_;
    rec["reservationId"] = opt_json(a.reservation_id);
    rec["unitIds"] = strings_json(a.unit_ids);
    rec["vmIds"] = strings_json(a.vm_ids);
    rec["result"] = a.result;
    rec["detail"] = opt_json(a.detail);
    rec["requestId"] = opt_json(c.request_id);
    if (auto sealed = store::seal_audit_record(rec, t.last_hash); !sealed) {
      return std::unexpected(DbError{error::Errc::internal, "audit record: " + sealed.error().detail});
    }
    t.last_hash = std::string(rec["hash"].get_string());
    if (auto w = write("INSERT INTO audit (seq, record) VALUES (?1, ?2)", t.seq, json::serialize(rec)); !w)
      return w;
    t.out.audit_seqs.push_back(t.seq);
  }
  return {};
}

std::expected<void, DbError> StateStore::write_events(const Change& c, Tally& t, Wall wall) {
  for (const auto& e : c.events) {
    json::object evt;
    evt["seq"] = ++t.ev;
    evt["id"] = new_id("evt_", wall);
    evt["type"] = e.type;
    evt["at"] = r::format_time(c.at);
    evt["data"] = e.data;
    if (e.audit_index) {
      if (*e.audit_index >= t.out.audit_seqs.size())
        return std::unexpected(DbError{error::Errc::internal, "event names no audit record of its change"});
      evt["data"].as_object()["auditId"] =
          store::format_audit_id(static_cast<std::uint64_t>(t.out.audit_seqs[*e.audit_index]));
    }
    if (auto w = write("INSERT INTO outbox (seq, event) VALUES (?1, ?2)", t.ev, json::serialize(evt)); !w)
      return w;
  }
  return {};
}

// The first answer stays for its 24 hours; only an expired row is replaced.
std::expected<void, DbError> StateStore::write_idempotency(const Change& c, Tally&, Wall) {
  if (!c.idempotency) return {};
  const auto& i = *c.idempotency;
  json::array headers;
  for (const auto& [k, v] : i.response.headers)
    headers.emplace_back(json::array{json::value(k), json::value(v)});
  return write(
      "INSERT INTO idempotency (caller, key, fingerprint, status, headers, body, created_at) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT(caller, key) DO UPDATE SET fingerprint "
      "= excluded.fingerprint, "
      "status = excluded.status, headers = excluded.headers, body = excluded.body, created_at "
      "= excluded.created_at "
      "WHERE idempotency.created_at <= excluded.created_at - ?8",
      i.caller, i.key, i.fingerprint, static_cast<std::int64_t>(i.response.status), json::serialize(headers),
      i.response.body, static_cast<std::int64_t>(c.at.time_since_epoch().count()),
      static_cast<std::int64_t>(kIdempotencyWindow.count()));
}

std::expected<void, DbError> StateStore::write_terminations(const Change& c, Tally& t, Wall) {
  for (const auto& row : c.terminations) {
    std::int64_t key = row.audit_seq;
    if (row.audit_index) {
      if (*row.audit_index >= t.out.audit_seqs.size())
        return std::unexpected(
            DbError{error::Errc::internal, "termination row names no audit record of its change"});
      key = t.out.audit_seqs[*row.audit_index];
    }
    if (auto w =
            write("INSERT INTO terminations (audit_seq, domain_uuid, doc, state) VALUES (?1, ?2, ?3, ?4) "
                  "ON CONFLICT(audit_seq) DO UPDATE SET state = excluded.state",
                  key, row.domain_uuid, row.doc, row.state);
        !w) {
      return w;
    }
  }
  return {};
}

// The audit counters are the audit table's own (load() reads its last record); the event counter
// stays here, as the outbox's rows are deleted once delivered.
std::expected<void, DbError> StateStore::write_meta(const Change& c, const Tally& t, bool moves) {
  const std::string meta = "UPDATE meta SET value = ?2 WHERE key = ?1";
  if (moves) {
    if (auto w = write(meta, "revision", std::to_string(revision_ + 1)); !w) return w;
  }
  if (t.ev != event_seq_) {
    if (auto w = write(meta, "event_seq", std::to_string(t.ev)); !w) return w;
  }
  if (t.ended != ended_) {
    if (auto w = write(
            "INSERT INTO meta (key, value) VALUES ('ended_reservations', ?1) ON CONFLICT(key) DO UPDATE "
            "SET value = excluded.value",
            std::to_string(t.ended));
        !w)
      return w;
  }
  if (c.inventory_digest) return write(meta, "inventory_digest", *c.inventory_digest);
  return {};
}

std::expected<void, DbError> StateStore::bump_revision() {
  auto bumped = db_.transaction([&](store::Tx&) -> std::expected<void, DbError> {
    auto meta = cached("UPDATE meta SET value = ?2 WHERE key = ?1");
    if (!meta) return std::unexpected(meta.error());
    if (auto b = (*meta)->bind_all("revision", std::to_string(revision_ + 1)); !b)
      return std::unexpected(b.error());
    return (*meta)->run();
  });
  if (!bumped) return std::unexpected(bumped.error());
  revision_ += 1;
  return {};
}

std::vector<std::string> StateStore::present_unit_ids() {
  std::vector<std::string> out;
  auto st = db_.prepare("SELECT id FROM units WHERE absent = 0");
  if (!st) return out;
  (void)each_row(*st, [&](store::Statement& s) -> std::expected<void, DbError> {
    out.push_back(s.column_text(0));
    return {};
  });
  return out;
}

std::optional<json::object> StateStore::unit_doc(const std::string& id) {
  auto st = db_.prepare("SELECT doc FROM units WHERE id = ?1");
  if (!st || !st->bind_all(id) ||
      st->step().value_or(store::Statement::Step::done) != store::Statement::Step::row)
    return std::nullopt;
  boost::system::error_code ec;
  auto v = json::parse(st->column_text(0), ec);
  if (ec || !v.is_object()) return std::nullopt;
  return std::move(v.get_object());
}

std::optional<StoredAnswer> StateStore::idempotent_answer(const std::string& caller, const std::string& key) {
  auto st = cached(
      "SELECT fingerprint, status, headers, body, created_at FROM idempotency WHERE caller = ?1 AND key = "
      "?2");
  if (!st || !(*st)->bind_all(caller, key) ||
      (*st)->step().value_or(store::Statement::Step::done) != store::Statement::Step::row) {
    return std::nullopt;
  }
  store::Statement& row = **st;
  StoredAnswer out;
  out.fingerprint = row.column_text(0);
  out.response.status = static_cast<unsigned>(row.column_int64(1));
  out.response.body = row.column_text(3);
  out.created_at = row.column_int64(4);
  boost::system::error_code ec;
  auto hs = json::parse(row.column_text(2), ec);
  if (!ec && hs.is_array()) {
    for (const auto& h : hs.get_array()) {
      const auto* pair = h.if_array();
      if (pair && pair->size() == 2 && (*pair)[0].is_string() && (*pair)[1].is_string()) {
        out.response.headers.emplace_back(std::string((*pair)[0].get_string()),
                                          std::string((*pair)[1].get_string()));
      }
    }
  }
  row.reset();
  return out;
}

std::expected<void, DbError> StateStore::purge_idempotency(std::int64_t cutoff) {
  auto st = cached("DELETE FROM idempotency WHERE created_at < ?1");
  if (!st) return std::unexpected(st.error());
  if (auto b = (*st)->bind_all(cutoff); !b) return std::unexpected(b.error());
  if (auto run = (*st)->run(); !run) return std::unexpected(run.error());
  return {};
}

std::expected<std::vector<std::pair<std::int64_t, std::string>>, DbError> StateStore::audit_after(
    std::int64_t after_seq, std::size_t limit) {
  std::vector<std::pair<std::int64_t, std::string>> out;
  auto st = db_.prepare("SELECT seq, record FROM audit WHERE seq > ?1 ORDER BY seq LIMIT ?2");
  if (!st) return std::unexpected(st.error());
  if (auto b = st->bind_all(after_seq, static_cast<std::int64_t>(limit)); !b)
    return std::unexpected(b.error());
  auto read = each_row(*st, [&](store::Statement& s) -> std::expected<void, DbError> {
    out.emplace_back(s.column_int64(0), s.column_text(1));
    return {};
  });
  if (!read) return std::unexpected(read.error());
  return out;
}

}  // namespace gpunode::service::detail
