// The node's API over its state. See node_service.hpp.
#include "gpunode/service/node_service.hpp"

#include <algorithm>
#include <charconv>
#include <random>
#include <set>
#include <unordered_map>

#include <boost/json.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpunode/config/config.hpp"
#include "gpunode/discovery/json.hpp"
#include "gpunode/discovery/rules.hpp"
#include "gpunode/discovery/sysfs_reader.hpp"
#include "gpunode/service/reservation_json.hpp"
#include "gpunode/service/spot_plan.hpp"
#include "gpunode/store/audit_chain.hpp"
#include "gpunode/store/canonical_json.hpp"
#include "gpunode/store/database.hpp"

namespace gpunode::service {
namespace r = gpunode::reservations;
namespace json = boost::json;
using store::DbError;

namespace {

constexpr std::int64_t kIdempotencyWindowSeconds = 24 * 3600;
constexpr std::size_t kDefaultLimit = 100;
constexpr std::size_t kMaxLimit = 500;

const std::vector<store::Migration>& migrations() {
  static const std::vector<store::Migration> list{
      {1, "initial",
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
)sql"}};
  return list;
}

r::Time to_time(std::chrono::system_clock::time_point t) {
  return std::chrono::time_point_cast<std::chrono::seconds>(t);
}

json::array strings_json(const std::vector<std::string>& list) {
  json::array a;
  for (const auto& s : list) a.emplace_back(s);
  return a;
}

// rsv_ + 26 Crockford base32 characters: 48 bits of milliseconds, then 80 random bits, so ids sort
// by creation time.
std::string new_id(std::string_view prefix, std::chrono::system_clock::time_point now) {
  static constexpr char kAlphabet[] = "0123456789abcdefghjkmnpqrstvwxyz";
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const auto ms = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count());
  std::string out(prefix);
  for (int i = 9; i >= 0; --i) out.push_back(kAlphabet[(ms >> (5 * i)) & 31]);
  for (int i = 0; i < 16; ++i) out.push_back(kAlphabet[rng() & 31]);
  return out;
}

struct Caller {
  r::Caller who;
  json::object actor() const {
    json::object a;
    a["sub"] = who.sub;
    a["org"] = who.org ? json::value(*who.org) : json::value(nullptr);
    a["roles"] = strings_json(who.roles);
    a["via"] = who.via;
    return a;
  }
  std::string by() const { return who.org ? *who.org : who.sub; }
};

Caller agent_caller() { return Caller{r::Caller{"gpunode-agent", std::nullopt, {}, "agent"}}; }

ApiResponse not_found() {
  // Holds nothing from the request: every 404 for an unseen node is byte-identical (§7).
  return problem(404, "not-found", "no such resource");
}

ApiResponse forbidden(std::string_view detail) { return problem(403, "forbidden", detail); }

ApiResponse with_header(ApiResponse resp, std::string name, std::string value) {
  resp.headers.emplace_back(std::move(name), std::move(value));
  return resp;
}

std::string etag_of_version(std::int64_t version) { return fmt::format("\"{}\"", version); }

bool etag_matches(std::string_view header, std::string_view etag) {
  // A list of entity tags, or *; weak comparison.
  std::string_view h = header;
  while (!h.empty()) {
    const auto comma = h.find(',');
    std::string_view t = h.substr(0, comma);
    while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
    while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
    if (t.starts_with("W/")) t.remove_prefix(2);
    if (t == "*" || t == etag) return true;
    h = comma == std::string_view::npos ? std::string_view{} : h.substr(comma + 1);
  }
  return false;
}

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  if (path.starts_with('/')) pos = 1;
  while (pos <= path.size()) {
    const auto slash = path.find('/', pos);
    const auto end = slash == std::string_view::npos ? path.size() : slash;
    out.emplace_back(path.substr(pos, end - pos));
    if (slash == std::string_view::npos) break;
    pos = slash + 1;
  }
  return out;
}

struct AuditDraft {
  std::string action;
  std::optional<std::string> reservation_id;
  std::vector<std::string> unit_ids;
  std::vector<std::string> vm_ids;
  std::string result = "ok";
  std::optional<std::string> detail;
};

struct EventDraft {
  std::string type;
  json::object data;
};

struct IdempotencyDraft {
  std::string caller, key, fingerprint;
  ApiResponse response;
};

// A termination as stored (crash safety): written pending, with its audit record, before the
// domain is touched; done or failed once the hypervisor answered.
struct TerminationRow {
  std::int64_t audit_seq = 0;
  std::string domain_uuid;
  std::string doc;    // {vmId, name, unitIds, by, at, grace}
  std::string state;  // pending | done | failed
};

// One transaction's worth of change.
struct Change {
  Caller actor;
  std::optional<std::string> request_id;
  r::Time at{};
  std::vector<r::Reservation> upserts;
  std::vector<AuditDraft> audits;
  std::vector<EventDraft> events;
  std::vector<std::pair<std::string, std::pair<std::string, bool>>> units;  // id -> (doc, absent)
  std::optional<std::string> inventory_digest;
  std::optional<IdempotencyDraft> idempotency;
  std::vector<TerminationRow> terminations;
};

}  // namespace

struct NodeService::Impl {
  ServiceOptions opt;
  std::shared_ptr<const auth::TokenVerifier> verifier;
  const discovery::PciIds* names = nullptr;
  Clock clock;
  LogSink log;
  store::Database db;
  std::unique_ptr<discovery::SysfsReader> reader;

  std::map<std::string, r::Reservation> reservations;
  std::vector<discovery::Unit> units;                // present, sorted by id
  std::map<std::string, json::object> absent_units;  // last seen JSON, with `absent` applied
  std::int64_t revision = 0, audit_seq = 0, event_seq = 0;
  std::string audit_last_hash;
  std::string inventory_digest;
  std::shared_ptr<vmctl::Hypervisor> hypervisor;
  // Terminations written pending and not decided yet, by audit seq (loaded on open: cut short by a
  // crash); those a running batch holds are in `in_flight`.
  std::map<std::int64_t, TerminationRow> pending;
  std::set<std::int64_t> in_flight;
  struct BatchVm {
    std::int64_t audit_seq = 0;
    vmctl::Domain domain;
    std::vector<std::string> unit_ids;
    vmctl::TerminationRecord record;
    std::chrono::seconds grace{0};
  };
  struct Batch {
    enum class Kind { terminate_spot, reclaim, agent } kind = Kind::agent;
    Caller caller;
    std::optional<std::string> request_id;
    std::optional<std::string> reservation_id;  // reclaim
    std::vector<BatchVm> vms;
    json::array left_running;                   // decided before the run
    std::optional<IdempotencyDraft> idempotency;
  };
  std::map<std::uint64_t, Batch> batches;
  std::uint64_t next_batch = 1;
  // The workloads as last listed (GET .../state shows them; a change moves the revision).
  json::array observed_workloads;
  std::string observed_digest;
  static constexpr std::size_t kTokenCacheSize = 4096;
  mutable std::unordered_map<std::string, auth::Claims> token_cache;

  Impl(ServiceOptions o, store::Database d) : opt(std::move(o)), db(std::move(d)) {}

  r::NodeView node() const { return {opt.node_id, opt.owner_org}; }
  r::Time now() const { return to_time(clock()); }
  // The reservations as one list for the rules; rebuilt only after a commit changed them.
  const std::vector<r::Reservation>& all_reservations() const {
    if (list_stale) {
      list_cache.clear();
      list_cache.reserve(reservations.size());
      for (const auto& [id, x] : reservations) list_cache.push_back(x);
      list_stale = false;
    }
    return list_cache;
  }
  mutable std::vector<r::Reservation> list_cache;
  mutable bool list_stale = true;

  void say(LogLevel level, const std::string& text) const {
    if (log) log(level, text);
  }

  // ---- loading ---------------------------------------------------------------------------------
  std::expected<void, std::string> load() {
    auto meta = db.prepare("SELECT key, value FROM meta");
    if (!meta) return std::unexpected(meta.error().message);
    while (true) {
      auto step = meta->step();
      if (!step) return std::unexpected(step.error().message);
      if (*step == store::Statement::Step::done) break;
      const std::string key = meta->column_text(0), value = meta->column_text(1);
      auto number = [&](std::int64_t& out) -> std::expected<void, std::string> {
        auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
        if (ec != std::errc{} || p != value.data() + value.size() || out < 0) {
          return std::unexpected(fmt::format("{}: meta {} is \"{}\", not a counter", db.path().string(), key, value));
        }
        return {};
      };
      std::expected<void, std::string> ok;
      if (key == "revision") ok = number(revision);
      if (key == "audit_seq") ok = number(audit_seq);
      if (key == "event_seq") ok = number(event_seq);
      if (!ok) return ok;
      if (key == "audit_last_hash") audit_last_hash = value;
      if (key == "inventory_digest") inventory_digest = value;
    }
    auto rows = db.prepare("SELECT id, doc FROM reservations");
    if (!rows) return std::unexpected(rows.error().message);
    while (true) {
      auto step = rows->step();
      if (!step) return std::unexpected(step.error().message);
      if (*step == store::Statement::Step::done) break;
      boost::system::error_code ec;
      auto v = json::parse(rows->column_text(1), ec);
      auto x = ec ? std::unexpected(std::string("not JSON")) : reservation_from_json(v);
      if (!x) return std::unexpected(fmt::format("reservation {} in {}: bad {}", rows->column_text(0), db.path().string(), x.error()));
      reservations.emplace(x->id, std::move(*x));
    }
    list_stale = true;
    auto ts = db.prepare("SELECT audit_seq, domain_uuid, doc FROM terminations WHERE state = 'pending'");
    if (!ts) return std::unexpected(ts.error().message);
    while (true) {
      auto step = ts->step();
      if (!step) return std::unexpected(step.error().message);
      if (*step == store::Statement::Step::done) break;
      TerminationRow row{ts->column_int64(0), ts->column_text(1), ts->column_text(2), "pending"};
      pending.emplace(row.audit_seq, std::move(row));
    }
    if (!pending.empty()) say(LogLevel::warning, fmt::format("{} termination(s) were cut short: finishing them once libvirt answers", pending.size()));
    auto us = db.prepare("SELECT id, doc FROM units WHERE absent = 1");
    if (!us) return std::unexpected(us.error().message);
    while (true) {
      auto step = us->step();
      if (!step) return std::unexpected(step.error().message);
      if (*step == store::Statement::Step::done) break;
      boost::system::error_code ec;
      auto v = json::parse(us->column_text(1), ec);
      if (!ec && v.is_object()) absent_units.emplace(us->column_text(0), std::move(v.get_object()));
    }
    return {};
  }

  // Prepared once, reused by every commit (a prepare costs more than the insert it serves).
  std::map<std::string, store::Statement, std::less<>> statements;
  std::expected<store::Statement*, DbError> cached(std::string_view sql) {
    auto it = statements.find(sql);
    if (it == statements.end()) {
      auto st = db.prepare(sql);
      if (!st) return std::unexpected(st.error());
      it = statements.emplace(std::string(sql), std::move(*st)).first;
    }
    it->second.reset();
    it->second.clear_bindings();
    return &it->second;
  }

  // ---- the one way state changes --------------------------------------------------------------
  std::expected<void, std::string> commit(Change& c) {
    // An idempotency row alone is not a change of the node's state: the revision stays.
    const bool moves = !c.upserts.empty() || !c.units.empty() || !c.audits.empty() || !c.events.empty() ||
                       c.inventory_digest.has_value() || !c.terminations.empty();
    std::int64_t seq = audit_seq, ev = event_seq;
    std::string last_hash = audit_last_hash;
    std::vector<json::object> events_out;
    auto result = db.transaction([&](store::Tx&) -> std::expected<void, DbError> {
      for (const auto& x : c.upserts) {
        auto st = cached("INSERT INTO reservations (id, doc) VALUES (?1, ?2) ON CONFLICT(id) DO UPDATE SET doc = excluded.doc");
        if (!st) return std::unexpected(st.error());
        if (auto b = (*st)->bind_all(x.id, json::serialize(to_json(x))); !b) return std::unexpected(b.error());
        if (auto run = (*st)->run(); !run) return std::unexpected(run.error());
      }
      for (const auto& [id, doc_absent] : c.units) {
        auto st = cached("INSERT INTO units (id, doc, absent) VALUES (?1, ?2, ?3) ON CONFLICT(id) DO UPDATE SET doc = excluded.doc, absent = excluded.absent");
        if (!st) return std::unexpected(st.error());
        if (auto b = (*st)->bind_all(id, doc_absent.first, doc_absent.second ? 1 : 0); !b) return std::unexpected(b.error());
        if (auto run = (*st)->run(); !run) return std::unexpected(run.error());
      }
      for (const auto& a : c.audits) {
        json::object rec;
        rec["id"] = store::format_audit_id(static_cast<std::uint64_t>(++seq));
        rec["at"] = r::format_time(c.at);
        rec["actor"] = c.actor.actor();
        rec["action"] = a.action;
        rec["nodeId"] = opt.node_id;
        rec["reservationId"] = a.reservation_id ? json::value(*a.reservation_id) : json::value(nullptr);
        rec["unitIds"] = strings_json(a.unit_ids);
        rec["vmIds"] = strings_json(a.vm_ids);
        rec["result"] = a.result;
        rec["detail"] = a.detail ? json::value(*a.detail) : json::value(nullptr);
        rec["requestId"] = c.request_id ? json::value(*c.request_id) : json::value(nullptr);
        if (auto sealed = store::seal_audit_record(rec, last_hash); !sealed) {
          return std::unexpected(DbError{0, "audit record: " + sealed.error()});
        }
        last_hash = std::string(rec["hash"].get_string());
        auto st = cached("INSERT INTO audit (seq, record) VALUES (?1, ?2)");
        if (!st) return std::unexpected(st.error());
        if (auto b = (*st)->bind_all(seq, json::serialize(rec)); !b) return std::unexpected(b.error());
        if (auto run = (*st)->run(); !run) return std::unexpected(run.error());
      }
      for (const auto& e : c.events) {
        json::object evt;
        evt["seq"] = ++ev;
        evt["id"] = new_id("evt_", clock());
        evt["type"] = e.type;
        evt["at"] = r::format_time(c.at);
        evt["data"] = e.data;
        auto st = cached("INSERT INTO outbox (seq, event) VALUES (?1, ?2)");
        if (!st) return std::unexpected(st.error());
        if (auto b = (*st)->bind_all(ev, json::serialize(evt)); !b) return std::unexpected(b.error());
        if (auto run = (*st)->run(); !run) return std::unexpected(run.error());
      }
      if (c.idempotency) {
        const auto& i = *c.idempotency;
        json::array headers;
        for (const auto& [k, v] : i.response.headers) headers.emplace_back(json::array{json::value(k), json::value(v)});
        auto st = cached("INSERT OR REPLACE INTO idempotency (caller, key, fingerprint, status, headers, body, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
        if (!st) return std::unexpected(st.error());
        if (auto b = (*st)->bind_all(i.caller, i.key, i.fingerprint, static_cast<std::int64_t>(i.response.status),
                                  json::serialize(headers), i.response.body, static_cast<std::int64_t>(c.at.time_since_epoch().count()));
            !b) {
          return std::unexpected(b.error());
        }
        if (auto run = (*st)->run(); !run) return std::unexpected(run.error());
      }
      for (const auto& row : c.terminations) {
        auto st = cached("INSERT INTO terminations (audit_seq, domain_uuid, doc, state) VALUES (?1, ?2, ?3, ?4) ON CONFLICT(audit_seq) DO UPDATE SET state = excluded.state");
        if (!st) return std::unexpected(st.error());
        if (auto b = (*st)->bind_all(row.audit_seq, row.domain_uuid, row.doc, row.state); !b) return std::unexpected(b.error());
        if (auto run = (*st)->run(); !run) return std::unexpected(run.error());
      }
      auto meta = cached("UPDATE meta SET value = ?2 WHERE key = ?1");
      if (!meta) return std::unexpected(meta.error());
      auto set = [&](std::string_view key, const std::string& value) -> std::expected<void, DbError> {
        (*meta)->reset();
        if (auto b = (*meta)->bind_all(key, value); !b) return std::unexpected(b.error());
        return (*meta)->run();
      };
      if (auto s = set("revision", std::to_string(revision + (moves ? 1 : 0))); !s) return s;
      if (auto s = set("audit_seq", std::to_string(seq)); !s) return s;
      if (auto s = set("event_seq", std::to_string(ev)); !s) return s;
      if (auto s = set("audit_last_hash", last_hash); !s) return s;
      if (c.inventory_digest) {
        if (auto s = set("inventory_digest", *c.inventory_digest); !s) return s;
      }
      return {};
    });
    if (!result) {
      say(LogLevel::error, fmt::format("state commit failed: {}", result.error().message));
      return std::unexpected(result.error().message);
    }
    // Committed: now memory follows.
    for (auto& x : c.upserts) reservations[x.id] = x;
    if (!c.upserts.empty()) list_stale = true;
    if (moves) revision += 1;
    audit_seq = seq;
    event_seq = ev;
    audit_last_hash = last_hash;
    if (c.inventory_digest) inventory_digest = *c.inventory_digest;
    for (const auto& row : c.terminations) {
      if (row.state == "pending") {
        pending.insert_or_assign(row.audit_seq, row);
      } else {
        pending.erase(row.audit_seq);
      }
    }
    return {};
  }

  // ---- units -------------------------------------------------------------------------------------
  json::object unit_view(const discovery::Unit& u, const Caller& caller) const {
    return discovery::unit_to_json(u, r::visible_reservation_ids(caller.who, node(), all_reservations(), u.id));
  }

  json::object absent_view(const std::string& id, json::object doc, const Caller& caller) const {
    doc["reservationIds"] = strings_json(r::visible_reservation_ids(caller.who, node(), all_reservations(), id));
    return doc;
  }

  json::array units_json(const Caller& caller) const {
    std::map<std::string, json::object> all;
    for (const auto& u : units) all.emplace(u.id, unit_view(u, caller));
    for (const auto& [id, doc] : absent_units) {
      if (!all.contains(id)) all.emplace(id, absent_view(id, doc, caller));
    }
    json::array out;
    for (auto& [id, o] : all) out.emplace_back(std::move(o));
    return out;
  }

  const discovery::Unit* present_unit(const std::string& id) const {
    auto it = std::lower_bound(units.begin(), units.end(), id, [](const discovery::Unit& u, const std::string& k) { return u.id < k; });
    return it != units.end() && it->id == id ? &*it : nullptr;
  }

  void scan(bool first) {
    if (!reader) reader = std::make_unique<discovery::SysfsReader>(opt.host_root, opt.policy, names);
    auto snapshot = reader->read();
    for (const auto& w : snapshot.warnings) say(LogLevel::warning, "discovery: " + w);
    auto fresh = discovery::build_units(snapshot, opt.policy);

    // What discovery says (reservationIds empty), its digest, and what changed.
    json::array answer;
    for (const auto& u : fresh) answer.emplace_back(discovery::unit_to_json(u));
    std::set<std::string> fresh_ids;
    for (const auto& u : fresh) fresh_ids.insert(u.id);

    Change c{agent_caller(), std::nullopt, now(), {}, {}, {}, {}, {}, {}, {}};
    // Units seen before (present last time, or stored) that are gone now become absent.
    std::set<std::string> known;
    for (const auto& u : units) known.insert(u.id);
    if (first) {
      auto st = db.prepare("SELECT id FROM units WHERE absent = 0");
      while (st && st->step().value_or(store::Statement::Step::done) == store::Statement::Step::row) known.insert(st->column_text(0));
    }
    std::map<std::string, json::object> newly_absent;
    for (const auto& id : known) {
      if (fresh_ids.contains(id) || absent_units.contains(id)) continue;
      json::object doc;
      if (const auto* u = present_unit(id)) {
        doc = discovery::unit_to_json(*u);
      } else {
        auto st = db.prepare("SELECT doc FROM units WHERE id = ?1");
        if (st && st->bind_all(id) && st->step().value_or(store::Statement::Step::done) == store::Statement::Step::row) {
          boost::system::error_code ec;
          auto v = json::parse(st->column_text(0), ec);
          if (!ec && v.is_object()) doc = v.get_object();
        }
      }
      if (doc.empty()) continue;
      auto& reasons = doc["notReservableReasons"];
      if (!reasons.is_array()) reasons = json::array{};
      reasons.get_array().emplace_back(json::object{{"code", "absent"}, {"message", "the unit was seen before and is gone now"}});
      doc["reservable"] = false;
      doc["sellable"] = false;
      newly_absent.emplace(id, doc);
      c.units.push_back({id, {json::serialize(doc), true}});
      c.audits.push_back(AuditDraft{"unit.absent", std::nullopt, {id}, {}, "ok", "the unit is no longer on the host"});
    }
    std::vector<std::string> back;
    for (const auto& u : fresh) {
      c.units.push_back({u.id, {json::serialize(discovery::unit_to_json(u)), false}});
      if (absent_units.contains(u.id)) back.push_back(u.id);
    }
    json::array full = answer;
    for (const auto& [id, doc] : absent_units) {
      if (!fresh_ids.contains(id)) full.emplace_back(doc);
    }
    for (const auto& [id, doc] : newly_absent) full.emplace_back(doc);
    auto canon = store::canonical_json(full);
    auto digest = canon ? store::sha256_hex(*canon) : std::unexpected(canon.error());
    const std::string d = digest.value_or("");
    const bool changed = d != inventory_digest;
    if (!changed && newly_absent.empty() && back.empty()) {
      units = std::move(fresh);
      return;
    }
    // Apply to memory first for the admin view of the event, then commit (a failed commit is
    // retried by the next scan: the digest is unchanged in the store).
    auto previous_units = units;
    auto previous_absent = absent_units;
    units = std::move(fresh);
    for (auto& [id, doc] : newly_absent) absent_units[id] = doc;
    for (const auto& id : back) absent_units.erase(id);
    Caller admin{r::Caller{"gpunode-agent", std::nullopt, {"platform-admin"}, "agent"}};
    c.events.push_back(EventDraft{"inventory.changed", json::object{{"units", units_json(admin)}}});
    c.inventory_digest = d;
    if (auto ok = commit(c); !ok) {
      units = std::move(previous_units);
      absent_units = std::move(previous_absent);
      return;
    }
    say(LogLevel::info, fmt::format("inventory changed: {} present unit(s), {} absent", units.size(), absent_units.size()));
  }

  // ---- terms -------------------------------------------------------------------------------------
  std::optional<r::Time> apply_terms() {
    const r::Time t = now();
    for (const auto& tr : r::due_transitions(all_reservations(), t)) {
      r::Reservation x = reservations.at(tr.reservation_id);
      r::apply(x, tr);
      x.updated_at = t;
      x.version += 1;
      const bool activate = tr.kind == r::Transition::Kind::activate;
      Change c{agent_caller(), std::nullopt, t, {x}, {}, {}, {}, {}, {}, {}};
      c.audits.push_back(AuditDraft{activate ? "reservation.activate" : "reservation.expire", x.id, x.unit_ids, {}, "ok",
                                    fmt::format("term {} at {}", activate ? "started" : "ended", r::format_time(tr.at))});
      c.events.push_back(EventDraft{activate ? "reservation.activated" : "reservation.expired",
                                    json::object{{"reservation", to_json(x)}}});
      if (!commit(c)) return t + std::chrono::seconds(1);  // retry soon
      say(LogLevel::info, fmt::format("RESERVATION={} {}", x.id, activate ? "activated" : "expired"));
    }
    return r::next_transition_at(all_reservations(), t);
  }

  // ---- request plumbing ----------------------------------------------------------------------
  std::expected<Caller, ApiResponse> authenticate(const ApiRequest& q) const {
    if (q.via == ApiRequest::Via::admin_socket) {
      const std::string sub = fmt::format("local:{}", q.peer_uid.value_or(0));
      return Caller{r::Caller{sub, std::nullopt, {"platform-admin"}, "admin-socket"}};
    }
    if (!verifier) return std::unexpected(with_header(problem(401, "unauthenticated", "no token keys are configured"), "WWW-Authenticate", "Bearer"));
    const std::string header(q.header("authorization").value_or(""));
    const auto wall = clock();
    // A token whose signature was verified once is not verified again (an Ed25519 verify costs
    // ~100 µs); its times are checked on every use. The cache goes with the keys on reload.
    if (auto hit = token_cache.find(header); hit != token_cache.end()) {
      const auto secs = std::chrono::duration_cast<std::chrono::seconds>(wall.time_since_epoch()).count();
      const auto& cl = hit->second;
      if (secs <= cl.exp + 60 && (!cl.nbf || secs + 60 >= *cl.nbf)) return Caller{r::Caller{cl.sub, cl.org, cl.roles, "https"}};
      token_cache.erase(hit);
    }
    auto claims = verifier->verify(header, wall);
    if (!claims) {
      say(LogLevel::info, fmt::format("REQUEST={} unauthenticated: {} ({})", q.request_id, auth::to_string(claims.error().why), claims.error().detail));
      return std::unexpected(with_header(problem(401, "unauthenticated", fmt::format("bearer token rejected: {}", auth::to_string(claims.error().why))),
                                         "WWW-Authenticate", "Bearer error=\"invalid_token\""));
    }
    if (token_cache.size() >= kTokenCacheSize) token_cache.clear();
    token_cache.emplace(header, *claims);
    return Caller{r::Caller{claims->sub, claims->org, claims->roles, "https"}};
  }

  static std::string caller_key(const Caller& c) {
    return fmt::format("{}|{}|{}", c.who.via, c.who.sub, c.who.org.value_or(""));
  }

  // Idempotency-Key: a stored response to replay, a 422, or nothing (go on).
  std::optional<ApiResponse> idempotent_replay(const ApiRequest& q, const Caller& c, std::optional<IdempotencyDraft>& draft) {
    auto key = q.header("idempotency-key");
    if (!key) return std::nullopt;
    if (key->empty() || key->size() > 256) return problem(400, "invalid-request", "Idempotency-Key must be 1 to 256 characters", {{"Idempotency-Key", "must be 1 to 256 characters"}});
    auto fp = store::sha256_hex(q.method + " " + q.path + "\n" + q.body);
    IdempotencyDraft d{caller_key(c), std::string(*key), fp.value_or(""), {}};
    auto st = db.prepare("SELECT fingerprint, status, headers, body, created_at FROM idempotency WHERE caller = ?1 AND key = ?2");
    if (st && st->bind_all(d.caller, d.key) && st->step().value_or(store::Statement::Step::done) == store::Statement::Step::row) {
      const std::int64_t created = st->column_int64(4);
      if (now().time_since_epoch().count() - created < kIdempotencyWindowSeconds) {
        if (st->column_text(0) != d.fingerprint) {
          return problem(422, "idempotency-key-reuse", "this Idempotency-Key was used with another request");
        }
        ApiResponse replay;
        replay.status = static_cast<unsigned>(st->column_int64(1));
        replay.body = st->column_text(3);
        boost::system::error_code ec;
        auto hs = json::parse(st->column_text(2), ec);
        if (!ec && hs.is_array()) {
          for (const auto& h : hs.get_array()) {
            if (h.is_array() && h.get_array().size() == 2 && h.get_array()[0].is_string() && h.get_array()[1].is_string()) {
              replay.headers.emplace_back(std::string(h.get_array()[0].get_string()), std::string(h.get_array()[1].get_string()));
            }
          }
        }
        replay.headers.emplace_back("Idempotent-Replayed", "true");
        return replay;
      }
    }
    draft = std::move(d);
    return std::nullopt;
  }

  ApiResponse commit_response(Change& c, ApiResponse resp) {
    if (c.idempotency) c.idempotency->response = resp;
    if (auto ok = commit(c); !ok) return problem(503, "storage-unavailable", "the change could not be stored; nothing was changed");
    return resp;
  }

  // ---- routes ----------------------------------------------------------------------------------
  ApiResponse route(const ApiRequest& q) {
    if (q.path == "/healthz") {
      if (q.method != "GET") return with_header(problem(405, "method-not-allowed", "GET only"), "Allow", "GET");
      return json_response(json::object{{"status", "ok"}, {"nodeId", opt.node_id}, {"version", opt.version}, {"revision", revision}});
    }
    auto caller = authenticate(q);
    if (!caller) return caller.error();
    if (q.path == "/v1/admin/rescan" && q.via == ApiRequest::Via::admin_socket) {
      // Operators' "scan now" (gpunodectl rescan); only on the admin socket.
      if (q.method != "POST") return method_not_allowed("POST");
      scan(false);
      return json_response(json::object{{"revision", revision}});
    }
    const auto seg = split_path(q.path);
    if (seg.size() >= 3 && seg[0] == "v1" && seg[1] == "nodes") return node_route(q, *caller, seg);
    if (seg.size() == 4 && seg[0] == "v1" && seg[1] == "orgs" && seg[3] == "reserved-capacity") {
      return reserved_capacity(q, *caller, seg[2]);
    }
    return not_found();
  }

  ApiResponse method_not_allowed(std::string allow) {
    return with_header(problem(405, "method-not-allowed", fmt::format("allowed: {}", allow)), "Allow", allow);
  }

  ApiResponse node_route(const ApiRequest& q, const Caller& c, const std::vector<std::string>& seg) {
    if (seg[2] != opt.node_id || !r::sees_node(c.who, node(), all_reservations())) return not_found();
    const std::size_t n = seg.size();
    if (n == 4 && seg[3] == "units") return q.method == "GET" ? list_units(c) : method_not_allowed("GET");
    if (n == 4 && seg[3] == "audit") return q.method == "GET" ? audit(q, c) : method_not_allowed("GET");
    if (n == 4 && seg[3] == "state") return q.method == "GET" ? state(q, c) : method_not_allowed("GET");
    if (n == 4 && seg[3] == "workloads") return q.method == "GET" ? workloads(c) : method_not_allowed("GET");
    if (n == 4 && seg[3] == "capacity") return q.method == "GET" ? capacity(q, c) : method_not_allowed("GET");
    if (n == 4 && seg[3] == "admission") return q.method == "POST" ? admission(q, c) : method_not_allowed("POST");
    if (n == 4 && seg[3] == "terminate-spot") return q.method == "POST" ? terminate_spot(q, c) : method_not_allowed("POST");
    if (n == 4 && seg[3] == "reservations") {
      if (q.method == "GET") return list_reservations(q, c);
      if (q.method == "POST") return create(q, c);
      return method_not_allowed("GET, POST");
    }
    if (n >= 5 && seg[3] == "reservations") {
      auto it = reservations.find(seg[4]);
      if (it == reservations.end() || !r::sees_reservation(c.who, node(), it->second)) return not_found();
      if (n == 5) {
        if (q.method == "GET") return with_header(json_response(to_json(it->second)), "ETag", etag_of_version(it->second.version));
        if (q.method == "PATCH") return amend(q, c, it->second);
        return method_not_allowed("GET, PATCH");
      }
      if (n == 6 && seg[5] == "end") return q.method == "POST" ? end(q, c, it->second) : method_not_allowed("POST");
      if (n == 6 && seg[5] == "release") return q.method == "POST" ? release(q, c, it->second) : method_not_allowed("POST");
      if (n == 6 && seg[5] == "reclaim") return q.method == "POST" ? reclaim(q, c, it->second) : method_not_allowed("POST");
    }
    return not_found();
  }

  ApiResponse list_units(const Caller& c) {
    if (!r::may_list_units(c.who, node(), all_reservations())) return forbidden("units are listed for operators, the owner and managing orgs");
    return json_response(json::object{{"nodeId", opt.node_id}, {"units", units_json(c)}});
  }

  // limit and pageToken; pageToken is the last id of the previous page.
  std::expected<std::pair<std::size_t, std::string>, ApiResponse> paging(const ApiRequest& q) const {
    std::size_t limit = kDefaultLimit;
    if (auto l = q.query_param("limit")) {
      std::size_t v = 0;
      auto [p, ec] = std::from_chars(l->data(), l->data() + l->size(), v);
      if (ec != std::errc{} || p != l->data() + l->size() || v < 1 || v > kMaxLimit) {
        return std::unexpected(problem(400, "invalid-request", "limit must be an integer from 1 to 500", {{"limit", "must be an integer from 1 to 500"}}));
      }
      limit = v;
    }
    return std::pair{limit, q.query_param("pageToken").value_or("")};
  }

  ApiResponse list_reservations(const ApiRequest& q, const Caller& c) {
    std::optional<r::State> state;
    if (auto s = q.query_param("state"); s && !s->empty()) {
      state = r::parse_state(*s);
      if (!state) return problem(400, "invalid-request", "state must be scheduled, active or ended", {{"state", "must be scheduled, active or ended"}});
    }
    auto page = paging(q);
    if (!page) return page.error();
    const auto& [limit, token] = *page;
    json::array list;
    std::string last;
    bool more = false;
    for (auto it = token.empty() ? reservations.begin() : reservations.upper_bound(token); it != reservations.end(); ++it) {
      const auto& x = it->second;
      if (!r::sees_reservation(c.who, node(), x) || (state && x.state != *state)) continue;
      if (list.size() == limit) {
        more = true;
        break;
      }
      list.emplace_back(to_json(x));
      last = x.id;
    }
    return json_response(json::object{{"reservations", std::move(list)}, {"nextPageToken", more ? json::value(last) : json::value(nullptr)}});
  }

  // Units named in a request: 422 unknown-unit, 409 unit-not-reservable.
  std::optional<ApiResponse> check_units(const std::vector<std::string>& ids) {
    std::vector<FieldProblem> unknown;
    json::array not_reservable;
    for (const auto& id : ids) {
      const auto* u = present_unit(id);
      if (u == nullptr && !absent_units.contains(id)) {
        unknown.push_back({"unitIds", fmt::format("{} is not a unit of node {}", id, opt.node_id)});
        continue;
      }
      json::array reasons;
      if (u != nullptr) {
        for (const auto& rs : u->reasons) reasons.emplace_back(json::object{{"code", rs.code}, {"message", rs.message}});
      } else {
        reasons = absent_units.at(id)["notReservableReasons"].as_array();
      }
      if (!reasons.empty()) not_reservable.emplace_back(json::object{{"unitId", id}, {"reasons", std::move(reasons)}});
    }
    if (!unknown.empty()) return problem(422, "unknown-unit", "some units are not units of this node", unknown);
    if (!not_reservable.empty()) {
      json::object extra{{"units", not_reservable}};
      return problem(409, "unit-not-reservable", "some units cannot be reserved", {}, &extra);
    }
    return std::nullopt;
  }

  std::optional<ApiResponse> check_overlap(const r::Reservation& candidate) {
    auto blockers = r::blocking_reservations(candidate, all_reservations());
    if (blockers.empty()) return std::nullopt;
    json::object extra{{"blockingReservationIds", strings_json(blockers)}};
    return problem(409, "reservation-overlap",
                   fmt::format("the units are held at overlapping times by {}", fmt::join(blockers, ", ")), {}, &extra);
  }

  ApiResponse create(const ApiRequest& q, const Caller& c) {
    if (!c.who.admin()) return forbidden("only a platform admin reserves units");
    std::optional<IdempotencyDraft> idem;
    if (auto replay = idempotent_replay(q, c, idem)) return *replay;
    auto body = parse_object(q.body, false);
    if (!body) return problem(400, "invalid-request", "the body is not a valid reservation request", body.error());
    Fields f(*body, {"unitIds", "audienceOrgIds", "managingOrgIds", "startsAt", "endsAt", "note"});
    r::CreateRequest req;
    req.unit_ids = f.strings("unitIds").value_or(std::vector<std::string>{});
    req.audience_org_ids = f.strings("audienceOrgIds").value_or(std::vector<std::string>{});
    req.managing_org_ids = f.strings("managingOrgIds").value_or(std::vector<std::string>{});
    req.starts_at = f.time("startsAt");
    req.ends_at = f.time("endsAt");
    req.note = f.string("note").value_or("");
    const r::Time t = now();
    auto problems = std::move(f.problems());
    for (auto& e : r::validate_create(req, t)) {
      if (std::none_of(problems.begin(), problems.end(), [&](const FieldProblem& p) { return p.field == e.field; })) {
        problems.push_back({e.field, e.message});
      }
    }
    if (!problems.empty()) return problem(400, "invalid-request", "the body is not a valid reservation request", problems);
    if (auto bad = check_units(req.unit_ids)) return *bad;

    r::Reservation x;
    x.id = new_id("rsv_", clock());
    x.node_id = opt.node_id;
    x.unit_ids = req.unit_ids;
    x.audience_org_ids = req.audience_org_ids;
    x.managing_org_ids = req.managing_org_ids;
    x.starts_at = req.starts_at.value_or(t);
    x.ends_at = *req.ends_at;
    x.state = x.starts_at <= t ? r::State::active : r::State::scheduled;
    x.note = req.note;
    x.created_at = x.updated_at = t;
    x.version = 1;
    if (auto overlap = check_overlap(x)) return *overlap;
    json::array spot;
    if (auto occupied = check_occupancy(x, x.unit_ids, t, spot)) return *occupied;

    Change ch{c, q.request_id, t, {x}, {}, {}, {}, {}, std::move(idem), {}};
    ch.audits.push_back(AuditDraft{"reservation.create", x.id, x.unit_ids, {}, "ok", std::nullopt});
    ch.events.push_back(EventDraft{"reservation.created", json::object{{"reservation", to_json(x)}}});
    auto body_out = to_json(x);
    body_out["spotWorkloads"] = std::move(spot);
    ApiResponse resp = json_response(body_out, 201);
    resp.headers.emplace_back("Location", fmt::format("/v1/nodes/{}/reservations/{}", opt.node_id, x.id));
    resp.headers.emplace_back("ETag", etag_of_version(x.version));
    auto out = commit_response(ch, std::move(resp));
    if (out.status == 201) say(LogLevel::info, fmt::format("RESERVATION={} created by {} UNITS={}", x.id, c.who.sub, fmt::join(x.unit_ids, ",")));
    return out;
  }

  ApiResponse amend(const ApiRequest& q, const Caller& c, const r::Reservation& current) {
    if (!c.who.admin()) return forbidden("only a platform admin amends reservations");
    const auto ct = q.header("content-type").value_or("");
    if (!ct.starts_with("application/merge-patch+json") && !ct.starts_with("application/json")) {
      return problem(415, "unsupported-media-type", "send application/merge-patch+json or application/json");
    }
    std::optional<IdempotencyDraft> idem;
    if (auto replay = idempotent_replay(q, c, idem)) return *replay;
    if (auto m = q.header("if-match"); m && !etag_matches(*m, etag_of_version(current.version))) {
      return problem(412, "version-mismatch", fmt::format("the reservation is at version {}", current.version));
    }
    if (current.ended()) return problem(409, "reservation-ended", "an ended reservation cannot be amended");
    auto body = parse_object(q.body, false);
    if (!body) return problem(400, "invalid-request", "the body is not a valid amendment", body.error());
    Fields f(*body, {"unitIds", "audienceOrgIds", "managingOrgIds", "startsAt", "endsAt", "note"});
    r::Reservation x = current;
    const r::Time t = now();
    if (auto v = f.strings("unitIds")) x.unit_ids = *v;
    if (auto v = f.strings("audienceOrgIds")) x.audience_org_ids = *v;
    if (auto v = f.strings("managingOrgIds")) x.managing_org_ids = *v;
    if (auto v = f.string("note")) x.note = *v;
    if (f.has("startsAt")) {
      if (auto v = f.time("startsAt")) {
        if (current.state != r::State::scheduled) {
          f.problems().push_back({"startsAt", "can change only while the reservation is scheduled"});
        } else {
          x.starts_at = *v;
        }
      }
    }
    if (auto v = f.time("endsAt")) x.ends_at = *v;
    auto problems = std::move(f.problems());
    r::CreateRequest check{x.unit_ids, x.audience_org_ids, x.managing_org_ids, x.starts_at, x.ends_at, x.note};
    for (auto& e : r::validate_create(check, t)) {
      if (e.field == "endsAt" && !body->contains("endsAt") && !body->contains("startsAt")) continue;
      if (std::none_of(problems.begin(), problems.end(), [&](const FieldProblem& p) { return p.field == e.field; })) {
        problems.push_back({e.field, e.message});
      }
    }
    if (!problems.empty()) return problem(400, "invalid-request", "the body is not a valid amendment", problems);
    std::vector<std::string> added;
    for (const auto& u : x.unit_ids) {
      if (!current.holds_unit(u)) added.push_back(u);
    }
    if (auto bad = check_units(added)) return *bad;
    if (auto overlap = check_overlap(x)) return *overlap;
    json::array spot;
    const bool audience_changed = x.audience_org_ids != current.audience_org_ids;
    if (auto occupied = check_occupancy(x, audience_changed ? x.unit_ids : added, t, spot)) return *occupied;
    // Released or reclaiming units that left the reservation leave the spot market with it.
    std::erase_if(x.released_unit_ids, [&](const std::string& u) { return !x.holds_unit(u); });
    std::erase_if(x.reclaiming_unit_ids, [&](const std::string& u) { return !x.holds_unit(u); });
    x.version += 1;
    x.updated_at = t;
    Change ch{c, q.request_id, t, {x}, {}, {}, {}, {}, std::move(idem), {}};
    ch.audits.push_back(AuditDraft{"reservation.amend", x.id, x.unit_ids, {}, "ok", std::nullopt});
    ch.events.push_back(EventDraft{"reservation.amended", json::object{{"reservation", to_json(x)}}});
    auto amended = to_json(x);
    amended["spotWorkloads"] = std::move(spot);
    auto resp = with_header(json_response(amended), "ETag", etag_of_version(x.version));
    auto out = commit_response(ch, std::move(resp));
    apply_terms();  // a new startsAt or endsAt may be due already
    if (out.status == 200 && reservations.at(x.id).version != x.version) {
      const auto& now_x = reservations.at(x.id);
      out = with_header(json_response(to_json(now_x)), "ETag", etag_of_version(now_x.version));
    }
    return out;
  }

  ApiResponse end(const ApiRequest& q, const Caller& c, const r::Reservation& current) {
    if (!c.who.admin()) return forbidden("only a platform admin ends reservations");
    std::optional<IdempotencyDraft> idem;
    if (auto replay = idempotent_replay(q, c, idem)) return *replay;
    auto body = parse_object(q.body, true);
    if (!body) return problem(400, "invalid-request", "the body is not valid", body.error());
    Fields f(*body, {"reason"});
    auto reason = f.string("reason", true);
    if (reason && reason->size() > r::kMaxNote) f.problems().push_back({"reason", "must be at most 1024 characters"});
    if (!f.problems().empty()) return problem(400, "invalid-request", "the body is not valid", f.problems());
    if (current.ended()) return problem(409, "reservation-ended", "the reservation has ended already");
    const r::Time t = now();
    r::Reservation x = current;
    x.state = r::State::ended;
    x.ended_at = t;
    x.end_reason = r::EndReason::ended_early;
    x.released_unit_ids.clear();
    x.reclaiming_unit_ids.clear();
    x.version += 1;
    x.updated_at = t;
    Change ch{c, q.request_id, t, {x}, {}, {}, {}, {}, std::move(idem), {}};
    ch.audits.push_back(AuditDraft{"reservation.end", x.id, x.unit_ids, {}, "ok", reason});
    ch.events.push_back(EventDraft{"reservation.ended", json::object{{"reservation", to_json(x)}}});
    return commit_response(ch, with_header(json_response(to_json(x)), "ETag", etag_of_version(x.version)));
  }

  // GET .../state[?after=REV&wait=30s]: units, reservations, workloads and the revision. A long
  // poll whose revision has not passed REV yet is answered with status 0 and the wait in
  // X-Gpunode-Wait-Ms: the daemon parks it and asks again when the revision moves or the wait
  // ends (then with X-Gpunode-Waited, which makes it a 304).
  ApiResponse state(const ApiRequest& q, const Caller& c) {
    if (!(c.who.admin() || c.who.operator_role())) return forbidden("the node's state is for platform admins and operators");
    std::optional<std::int64_t> after;
    if (auto a = q.query_param("after")) {
      std::int64_t v = 0;
      auto [p, ec] = std::from_chars(a->data(), a->data() + a->size(), v);
      if (ec != std::errc{} || p != a->data() + a->size() || v < 0) {
        return problem(400, "invalid-request", "after must be a revision (a non-negative integer)", {{"after", "must be a non-negative integer"}});
      }
      after = v;
    }
    std::chrono::milliseconds wait = std::chrono::seconds(30);
    if (auto w = q.query_param("wait")) {
      auto d = config::parse_duration(*w);
      if (!d || *d > std::chrono::seconds(120)) {
        return problem(400, "invalid-request", "wait must be a duration of at most 120s, e.g. 30s", {{"wait", d ? "must be at most 120s" : d.error()}});
      }
      wait = *d;
    }
    const std::string etag = fmt::format("\"{}\"", revision);
    if (after && revision <= *after) {
      if (q.header("x-gpunode-waited") || wait.count() == 0) {
        ApiResponse not_modified;
        not_modified.status = 304;
        not_modified.headers.emplace_back("ETag", etag);
        return not_modified;
      }
      ApiResponse park;
      park.status = 0;
      park.headers.emplace_back("X-Gpunode-Wait-Ms", std::to_string(wait.count()));
      return park;
    }
    json::array rs;
    for (const auto& [id, x] : reservations) rs.emplace_back(to_json(x));
    return with_header(json_response(json::object{{"nodeId", opt.node_id}, {"revision", revision}, {"units", units_json(c)},
                                                  {"reservations", std::move(rs)}, {"workloads", observed_workloads}}),
                       "ETag", etag);
  }

  ApiResponse audit(const ApiRequest& q, const Caller& c) {
    if (!(c.who.admin() || c.who.operator_role() || r::is_owner(c.who, node()))) return forbidden("the audit log is for operators and the owner");
    auto page = paging(q);
    if (!page) return page.error();
    const auto& [limit, token] = *page;
    std::int64_t after = 0;
    for (const auto& cursor : {q.query_param("after").value_or(""), token}) {
      if (cursor.empty()) continue;
      auto seq = store::parse_audit_id(cursor);
      if (!seq) return problem(400, "invalid-request", "after and pageToken take an audit id such as aud_12", {{"after", "must be an audit id such as aud_12"}});
      after = std::max(after, static_cast<std::int64_t>(*seq));
    }
    auto st = db.prepare("SELECT seq, record FROM audit WHERE seq > ?1 ORDER BY seq LIMIT ?2");
    if (!st || !st->bind_all(after, static_cast<std::int64_t>(limit + 1))) return problem(503, "storage-unavailable", "the audit log cannot be read");
    json::array records;
    std::int64_t last = 0;
    bool more = false;
    while (true) {
      auto step = st->step();
      if (!step) return problem(503, "storage-unavailable", "the audit log cannot be read");
      if (*step == store::Statement::Step::done) break;
      if (records.size() == limit) {
        more = true;
        break;
      }
      boost::system::error_code ec;
      records.emplace_back(json::parse(st->column_text(1), ec));
      last = st->column_int64(0);
    }
    return json_response(json::object{{"records", std::move(records)},
                                      {"nextPageToken", more ? json::value(store::format_audit_id(static_cast<std::uint64_t>(last))) : json::value(nullptr)}});
  }

  ApiResponse reserved_capacity(const ApiRequest& q, const Caller& c, const std::string& org) {
    if (q.method != "GET") {
      if (!(c.who.admin() || c.who.operator_role() || c.who.org == org)) return not_found();
      return method_not_allowed("GET");
    }
    if (!(c.who.admin() || c.who.operator_role() || c.who.org == org)) return not_found();
    json::array entries;
    std::int64_t total_units = 0, total_gpus = 0;
    for (const auto& [id, x] : reservations) {
      if (x.ended() || std::find(x.audience_org_ids.begin(), x.audience_org_ids.end(), org) == x.audience_org_ids.end()) continue;
      json::array units_out;
      std::int64_t gpus = 0;
      for (const auto& uid : x.unit_ids) {
        if (const auto* u = present_unit(uid)) {
          gpus += u->gpu_count();
          units_out.emplace_back(unit_view(*u, c));
        } else if (auto a = absent_units.find(uid); a != absent_units.end()) {
          if (const auto* g = a->second.if_contains("gpuCount"); g && g->is_int64()) gpus += g->get_int64();
          units_out.emplace_back(absent_view(uid, a->second, c));
        }
      }
      total_units += static_cast<std::int64_t>(x.unit_ids.size());
      total_gpus += gpus;
      entries.emplace_back(json::object{{"reservationId", x.id}, {"state", r::to_string(x.state)},
                                        {"startsAt", r::format_time(x.starts_at)}, {"endsAt", r::format_time(x.ends_at)},
                                        {"unitIds", strings_json(x.unit_ids)}, {"releasedUnitIds", strings_json(x.released_unit_ids)},
                                        {"gpuCount", gpus}, {"units", std::move(units_out)}});
    }
    return json_response(json::object{{"orgId", org}, {"nodeId", opt.node_id}, {"reservations", std::move(entries)},
                                      {"totals", json::object{{"units", total_units}, {"gpus", total_gpus}}}});
  }

  // ---- workloads (CONTRACT §5, §7 Occupancy) ---------------------------------------------------
  using Workload = spot::Occupant;  // a domain and the units its PCI hostdevs are members of

  // Every unit's member addresses, present and absent units alike.
  std::map<std::string, std::string> unit_of_address() const {
    std::map<std::string, std::string> out;
    for (const auto& u : units) {
      for (const auto& m : u.devices) out[m.device.address.to_string()] = u.id;
    }
    for (const auto& [id, doc] : absent_units) {
      if (const auto* ds = doc.if_contains("devices"); ds && ds->is_array()) {
        for (const auto& d : ds->get_array()) {
          if (const auto* a = d.is_object() ? d.get_object().if_contains("pciAddress") : nullptr; a && a->is_string()) {
            out.emplace(std::string(a->get_string()), id);
          }
        }
      }
    }
    return out;
  }

  std::expected<std::vector<Workload>, ApiResponse> workloads_now() {
    if (!hypervisor) return std::unexpected(problem(503, "hypervisor-unavailable", "no hypervisor is configured"));
    auto list = hypervisor->list();
    if (!list) {
      say(LogLevel::warning, "hypervisor: " + list.error().message);
      return std::unexpected(problem(503, "hypervisor-unavailable", fmt::format("the hypervisor cannot be reached: {}", list.error().message)));
    }
    auto ws = occupants(std::move(*list));
    note_workloads(ws);
    return ws;
  }

  // A list that differs from the last one moves the revision (stored, so it never goes back).
  void note_workloads(const std::vector<Workload>& ws) {
    json::array a;
    for (const auto& w : ws) a.emplace_back(workload_json(w));
    std::string digest = json::serialize(a);
    if (digest == observed_digest) return;
    auto bumped = db.transaction([&](store::Tx&) -> std::expected<void, DbError> {
      auto meta = cached("UPDATE meta SET value = ?2 WHERE key = ?1");
      if (!meta) return std::unexpected(meta.error());
      if (auto b = (*meta)->bind_all("revision", std::to_string(revision + 1)); !b) return std::unexpected(b.error());
      return (*meta)->run();
    });
    if (!bumped) return;  // tried again with the next list
    revision += 1;
    observed_workloads = std::move(a);
    observed_digest = std::move(digest);
  }

  std::vector<Workload> occupants(std::vector<vmctl::Domain> list) const {
    const auto owner = unit_of_address();
    std::vector<Workload> out;
    for (auto& d : list) {
      std::set<std::string> ids;
      for (const auto& a : d.pci_addresses) {
        if (auto it = owner.find(a); it != owner.end()) ids.insert(it->second);
      }
      out.push_back(Workload{std::move(d), std::vector<std::string>(ids.begin(), ids.end())});
    }
    std::sort(out.begin(), out.end(), [](const Workload& a, const Workload& b) { return a.domain.name < b.domain.name; });
    return out;
  }

  static json::value opt_str(const std::optional<std::string>& s) { return s ? json::value(*s) : json::value(nullptr); }

  static json::object workload_json(const Workload& w) {
    const auto& d = w.domain;
    return json::object{{"vmId", d.label ? json::value(d.label->vm_id) : json::value(nullptr)},
                        {"domainUuid", d.uuid},
                        {"name", d.name},
                        {"org", d.label ? json::value(d.label->org) : json::value(nullptr)},
                        {"tier", d.label ? json::value(vmctl::to_string(d.label->tier)) : json::value(nullptr)},
                        {"state", d.state},
                        {"unitIds", strings_json(w.unit_ids)},
                        {"terminationReason", d.termination ? json::value(d.termination->reason) : json::value(nullptr)}};
  }

  ApiResponse workloads(const Caller& c) {
    if (!(c.who.admin() || c.who.operator_role() || r::is_owner(c.who, node()))) return forbidden("workloads are listed for operators and the owner");
    auto ws = workloads_now();
    if (!ws) return ws.error();
    json::array list;
    for (const auto& w : *ws) list.emplace_back(workload_json(w));
    return json_response(json::object{{"nodeId", opt.node_id}, {"workloads", std::move(list)}});
  }

  // Occupancy of `checked` units once the term has started: a workload that is not spot, of an
  // org outside the audience (or unlabelled), blocks (409 unit-occupied); spot workloads are
  // allowed and listed.
  std::optional<ApiResponse> check_occupancy(const r::Reservation& x, const std::vector<std::string>& checked, r::Time t,
                                             json::array& spot) {
    if (x.starts_at > t || checked.empty()) return std::nullopt;
    auto ws = workloads_now();
    if (!ws) return ws.error();
    json::array blockers;
    for (const auto& w : *ws) {
      if (!w.domain.active()) continue;
      if (std::none_of(w.unit_ids.begin(), w.unit_ids.end(), [&](const std::string& u) {
            return std::find(checked.begin(), checked.end(), u) != checked.end();
          })) {
        continue;
      }
      const auto& label = w.domain.label;
      if (label && label->tier == vmctl::Tier::spot) {
        spot.emplace_back(json::object{{"vmId", label->vm_id}, {"domainUuid", w.domain.uuid}, {"name", w.domain.name},
                                       {"org", label->org}, {"unitIds", strings_json(w.unit_ids)}});
        continue;
      }
      if (label && std::find(x.audience_org_ids.begin(), x.audience_org_ids.end(), label->org) != x.audience_org_ids.end()) continue;
      blockers.emplace_back(json::object{{"vmId", label ? json::value(label->vm_id) : json::value(nullptr)},
                                         {"domainUuid", w.domain.uuid}, {"name", w.domain.name}});
    }
    if (blockers.empty()) return std::nullopt;
    json::object extra{{"workloads", blockers}};
    return problem(409, "unit-occupied", "workloads of orgs outside the audience are running on the units", {}, &extra);
  }

  // ---- entitlement (CONTRACT §4 capacity and admission) ------------------------------------------
  struct Entitlement {
    std::string code;  // empty: entitled
    std::string message;
    std::optional<std::string> reservation_id;
  };

  const r::Reservation* active_holder(const std::string& unit_id) const {
    for (const auto& [id, x] : reservations) {
      if (x.state == r::State::active && x.holds_unit(unit_id)) return &x;
    }
    return nullptr;
  }

  Entitlement entitled(const std::string& org, vmctl::Tier tier, const std::string& unit_id) const {
    const auto* u = present_unit(unit_id);
    if (u == nullptr) {
      if (absent_units.contains(unit_id)) return {"absent", fmt::format("{} is no longer on the host", unit_id), {}};
      return {"unknown-unit", fmt::format("{} is not a unit of node {}", unit_id, opt.node_id), {}};
    }
    if (!u->sellable) {
      std::vector<std::string> why;
      for (const auto& rs : u->reasons) why.push_back(rs.code);
      return {"not-sellable", fmt::format("{} is not sellable: {}", unit_id, fmt::join(why, ", ")), {}};
    }
    const auto* holder = active_holder(unit_id);
    const bool released = holder && std::find(holder->released_unit_ids.begin(), holder->released_unit_ids.end(), unit_id) !=
                                        holder->released_unit_ids.end();
    switch (tier) {
      case vmctl::Tier::on_demand:
        if (holder) return {"unit-reserved", fmt::format("{} is held by an active reservation", unit_id), {}};
        return {};
      case vmctl::Tier::reserved:
        if (!holder) return {"not-reserved", fmt::format("no active reservation holds {}", unit_id), {}};
        if (std::find(holder->audience_org_ids.begin(), holder->audience_org_ids.end(), org) == holder->audience_org_ids.end()) {
          return {"not-in-audience", fmt::format("{} is reserved for other orgs", unit_id), {}};
        }
        if (released) return {"unit-released", fmt::format("{} is released to the spot market", unit_id), {}};
        return {"", "", holder->id};
      case vmctl::Tier::spot:
        if (!released) return {"not-released", fmt::format("{} is not released to the spot market", unit_id), {}};
        return {};
    }
    return {"invalid-tier", "unknown tier", {}};
  }

  ApiResponse capacity(const ApiRequest& q, const Caller& c) {
    if (!(c.who.admin() || c.who.operator_role())) return forbidden("capacity is answered for platform admins and operators");
    auto org = q.query_param("org");
    if (!org || org->empty()) return problem(400, "invalid-request", "org is required", {{"org", "is required"}});
    json::array entries;
    for (const auto& u : units) {
      for (auto tier : {vmctl::Tier::reserved, vmctl::Tier::spot, vmctl::Tier::on_demand}) {
        auto e = entitled(*org, tier, u.id);
        if (!e.code.empty()) continue;
        entries.emplace_back(json::object{{"unitId", u.id}, {"class", discovery::to_string(u.cls)}, {"gpuCount", u.gpu_count()},
                                          {"tier", vmctl::to_string(tier)}, {"reservationId", opt_str(e.reservation_id)}});
        break;  // one entry per unit
      }
    }
    return json_response(json::object{{"nodeId", opt.node_id}, {"orgId", *org}, {"units", std::move(entries)}});
  }

  ApiResponse admission(const ApiRequest& q, const Caller& c) {
    if (!(c.who.admin() || c.who.operator_role())) return forbidden("admission is answered for platform admins and operators");
    auto body = parse_object(q.body, false);
    if (!body) return problem(400, "invalid-request", "the body is not a valid admission request", body.error());
    Fields f(*body, {"orgId", "tier", "unitIds"});
    auto org = f.string("orgId");
    auto tier = f.string("tier");
    auto ids = f.strings("unitIds");
    if (!body->contains("orgId")) f.problems().push_back({"orgId", "is required"});
    if (!body->contains("tier")) f.problems().push_back({"tier", "is required"});
    if (!ids || ids->empty()) {
      if (std::none_of(f.problems().begin(), f.problems().end(), [](const FieldProblem& p) { return p.field == "unitIds"; })) {
        f.problems().push_back({"unitIds", "must name at least one unit"});
      }
    }
    if (!f.problems().empty()) return problem(400, "invalid-request", "the body is not a valid admission request", f.problems());
    json::array reasons;
    auto parsed = vmctl::parse_tier(*tier);
    if (!parsed) {
      reasons.emplace_back(json::object{{"code", "invalid-tier"}, {"message", fmt::format("tier must be spot, on-demand or reserved, not \"{}\"", *tier)},
                                        {"unitId", nullptr}});
    } else {
      for (const auto& id : *ids) {
        auto e = entitled(*org, *parsed, id);
        if (!e.code.empty()) reasons.emplace_back(json::object{{"code", e.code}, {"message", e.message}, {"unitId", id}});
      }
    }
    return json_response(json::object{{"allowed", reasons.empty()}, {"reasons", std::move(reasons)}});
  }

  // ---- release (CONTRACT §4) ---------------------------------------------------------------------
  ApiResponse release(const ApiRequest& q, const Caller& c, const r::Reservation& current) {
    if (!(c.who.admin() || r::manages(c.who, current))) return forbidden("only a platform admin or a managing org releases units");
    std::optional<IdempotencyDraft> idem;
    if (auto replay = idempotent_replay(q, c, idem)) return *replay;
    auto body = parse_object(q.body, false);
    if (!body) return problem(400, "invalid-request", "the body is not a valid release request", body.error());
    Fields f(*body, {"unitIds"});
    auto ids = f.strings("unitIds");
    if (!ids || ids->empty()) {
      if (f.problems().empty()) f.problems().push_back({"unitIds", "must name at least one unit"});
    }
    if (!f.problems().empty()) return problem(400, "invalid-request", "the body is not a valid release request", f.problems());
    if (current.state != r::State::active) return problem(409, "reservation-not-active", "units are released only from an active reservation");
    std::vector<FieldProblem> unknown;
    for (const auto& u : *ids) {
      if (!current.holds_unit(u)) unknown.push_back({"unitIds", fmt::format("{} is not a unit of reservation {}", u, current.id)});
    }
    if (!unknown.empty()) return problem(422, "unknown-unit", "some units are not units of this reservation", unknown);
    r::Reservation x = current;
    std::vector<std::string> newly;
    for (const auto& u : *ids) {
      if (std::find(x.released_unit_ids.begin(), x.released_unit_ids.end(), u) != x.released_unit_ids.end()) continue;
      if (std::find(newly.begin(), newly.end(), u) != newly.end()) continue;
      newly.push_back(u);
      x.released_unit_ids.push_back(u);
      std::erase(x.reclaiming_unit_ids, u);
    }
    if (newly.empty()) return json_response(json::object{{"reservation", to_json(current)}});  // already released: no-op
    std::sort(x.released_unit_ids.begin(), x.released_unit_ids.end());
    const r::Time t = now();
    x.version += 1;
    x.updated_at = t;
    Change ch{c, q.request_id, t, {x}, {}, {}, {}, {}, std::move(idem), {}};
    ch.audits.push_back(AuditDraft{"units.release", x.id, newly, {}, "ok", std::nullopt});
    ch.events.push_back(EventDraft{"units.released", json::object{{"reservationId", x.id}, {"unitIds", strings_json(newly)}}});
    return commit_response(ch, with_header(json_response(json::object{{"reservation", to_json(x)}}), "ETag", etag_of_version(x.version)));
  }

  // ---- the spot market: reclaim and terminate-spot (CONTRACT §4, §5, §7) ------------------------
  std::vector<std::string> node_unit_ids() const {
    std::vector<std::string> out;
    for (const auto& u : units) out.push_back(u.id);
    for (const auto& [id, doc] : absent_units) out.push_back(id);
    return out;
  }

  bool known_unit(const std::string& id) const { return present_unit(id) != nullptr || absent_units.contains(id); }

  // The active reservation holding one of the units (the first found), for workload.terminated.
  std::optional<std::string> holder_of(const std::vector<std::string>& unit_ids) const {
    for (const auto& u : unit_ids) {
      if (const auto* x = active_holder(u)) return x->id;
    }
    return std::nullopt;
  }

  static json::object left_json(const vmctl::Domain& d, const std::vector<std::string>& unit_ids, std::string_view reason) {
    return json::object{{"vmId", d.label ? json::value(d.label->vm_id) : json::value(nullptr)},
                        {"domainUuid", d.uuid},
                        {"name", d.name},
                        {"unitIds", strings_json(unit_ids)},
                        {"tier", d.label ? json::value(vmctl::to_string(d.label->tier)) : json::value(nullptr)},
                        {"reason", reason}};
  }

  // Reclaiming units that no active spot workload occupies any more leave reclaimingUnitIds.
  void vacate(const std::vector<Workload>& ws, Change& ch) {
    const auto occupied = spot::spot_occupied(ws);
    for (const auto& [id, current] : reservations) {
      if (current.state != r::State::active || current.reclaiming_unit_ids.empty()) continue;
      r::Reservation x = current;
      std::vector<std::string> vacated;
      std::erase_if(x.reclaiming_unit_ids, [&](const std::string& u) {
        if (occupied.contains(u)) return false;
        vacated.push_back(u);
        return true;
      });
      if (vacated.empty()) continue;
      x.version += 1;
      x.updated_at = ch.at;
      ch.upserts.push_back(x);
      ch.audits.push_back(AuditDraft{"units.reclaim", x.id, vacated, {}, "ok", "reclaim complete: no spot workload is left on the units"});
    }
  }

  // Writes the terminations ahead (each one's audit record, whose id goes into the domain's
  // termination record, and its pending row) together with `base` (a reclaim's change), then
  // hands the batch to the daemon. Without terminations, `base` is committed and answered at once.
  ApiResponse start_batch(Batch b, Change base, const spot::Plan& plan, std::chrono::seconds grace, const std::optional<std::string>& reason) {
    for (const auto& l : plan.left_running) b.left_running.emplace_back(left_json(l.vm->domain, l.unit_ids, l.reason));
    if (plan.terminate.empty()) {
      if (!base.upserts.empty() || !base.audits.empty()) {
        if (auto ok = commit(base); !ok) return problem(503, "storage-unavailable", "the change could not be stored; nothing was changed");
      }
      ApiResponse out = answer_batch(b, json::array{}, json::array(b.left_running));
      if (b.idempotency) store_idempotency(std::move(*b.idempotency), out);
      return out;
    }
    std::int64_t seq = audit_seq + static_cast<std::int64_t>(base.audits.size());
    const std::string at = r::format_time(base.at);
    for (const auto* vm : plan.terminate) {
      const auto& d = vm->domain;
      ++seq;
      vmctl::TerminationRecord record{"capacity-reclaim", at, b.caller.by(), store::format_audit_id(static_cast<std::uint64_t>(seq))};
      base.audits.push_back(AuditDraft{"workload.terminate", holder_of(vm->unit_ids), vm->unit_ids, {d.label->vm_id}, "ok",
                                       fmt::format("terminating spot VM {} (domain {} {}) for capacity reclaim, grace {}s{}", d.label->vm_id,
                                                   d.name, d.uuid, grace.count(), reason ? "; reason: " + *reason : std::string())});
      json::object doc{{"vmId", d.label->vm_id}, {"name", d.name}, {"unitIds", strings_json(vm->unit_ids)}, {"by", record.by},
                       {"at", at}, {"grace", grace.count()}};
      base.terminations.push_back(TerminationRow{seq, d.uuid, json::serialize(doc), "pending"});
      b.vms.push_back(BatchVm{seq, d, vm->unit_ids, std::move(record), grace});
    }
    if (auto ok = commit(base); !ok) return problem(503, "storage-unavailable", "the change could not be stored; nothing was changed or stopped");
    for (const auto& vm : b.vms) in_flight.insert(vm.audit_seq);
    const std::uint64_t id = next_batch++;
    say(LogLevel::info, fmt::format("REQUEST={} terminating {} spot VM(s) for {}", b.request_id.value_or("-"), b.vms.size(), b.caller.by()));
    batches.emplace(id, std::move(b));
    ApiResponse parked;
    parked.status = 0;
    parked.work = id;
    return parked;
  }

  ApiResponse answer_batch(const Batch& b, json::array terminated, json::array left) const {
    if (b.kind == Batch::Kind::reclaim && b.reservation_id) {
      const auto& x = reservations.at(*b.reservation_id);
      return with_header(json_response(json::object{{"reservation", to_json(x)}, {"terminated", std::move(terminated)}, {"leftRunning", std::move(left)}}),
                         "ETag", etag_of_version(x.version));
    }
    return json_response(json::object{{"terminated", std::move(terminated)}, {"leftRunning", std::move(left)}});
  }

  void store_idempotency(IdempotencyDraft d, const ApiResponse& resp) {
    d.response = resp;
    Change ch{Caller{}, std::nullopt, now(), {}, {}, {}, {}, {}, std::move(d), {}};
    // Only the idempotency row: commit() also moves the revision, which is harmless.
    if (auto ok = commit(ch); !ok) say(LogLevel::warning, "the idempotent answer could not be stored");
  }

  std::optional<Work> work_of(std::uint64_t id) const {
    auto it = batches.find(id);
    if (it == batches.end()) return std::nullopt;
    Work w{id, {}};
    for (const auto& vm : it->second.vms) w.jobs.push_back(vmctl::TerminationJob{vm.domain, vm.record, vm.grace});
    return w;
  }

  ApiResponse finish(std::uint64_t id, std::vector<vmctl::TerminationOutcome> outcomes,
                     const std::expected<std::vector<vmctl::Domain>, vmctl::VmError>& after) {
    auto it = batches.find(id);
    if (it == batches.end()) return problem(500, "internal", "unknown termination batch");
    Batch b = std::move(it->second);
    batches.erase(it);
    for (const auto& vm : b.vms) in_flight.erase(vm.audit_seq);
    const bool agent = b.kind == Batch::Kind::agent;
    Change ch{agent ? agent_caller() : b.caller, agent ? std::nullopt : b.request_id, now(), {}, {}, {}, {}, {}, {}, {}};
    json::array terminated, left = b.left_running;
    std::optional<std::string> unavailable;
    for (std::size_t i = 0; i < b.vms.size(); ++i) {
      const auto& vm = b.vms[i];
      const auto& d = vm.domain;
      const std::string vm_id = d.label ? d.label->vm_id : std::string();
      const auto result = i < outcomes.size() && outcomes[i].uuid == d.uuid
                              ? outcomes[i].result
                              : std::expected<vmctl::TerminateResult, vmctl::VmError>(std::unexpected(vmctl::VmError{vmctl::VmError::Kind::failed, "no outcome"}));
      const auto holder = holder_of(vm.unit_ids);
      auto row = pending.contains(vm.audit_seq) ? pending.at(vm.audit_seq) : TerminationRow{vm.audit_seq, d.uuid, "{}", "pending"};
      const std::string who = agent ? "finished by the agent: " : "";
      if (!result && result.error().kind == vmctl::VmError::Kind::unavailable) {
        unavailable = result.error().message;  // stays pending: finished once libvirt answers again
        continue;
      }
      if (result && result->terminated) {
        ch.audits.push_back(AuditDraft{"workload.terminate", holder, vm.unit_ids, {vm_id}, "ok",
                                       fmt::format("{}spot VM {} (domain {}) is stopped: {}", who, vm_id, d.name, result->detail)});
        ch.events.push_back(EventDraft{"workload.terminated",
                                       json::object{{"vmId", vm_id}, {"domainUuid", d.uuid}, {"unitIds", strings_json(vm.unit_ids)},
                                                    {"reservationId", opt_str(holder)}, {"by", vm.record.by},
                                                    {"auditId", vm.record.audit_id}, {"reason", "capacity-reclaim"}}});
        row.state = "done";
        terminated.emplace_back(json::object{{"vmId", vm_id}, {"domainUuid", d.uuid}, {"name", d.name}, {"unitIds", strings_json(vm.unit_ids)}});
        say(LogLevel::info, fmt::format("VM={} DOMAIN={} terminated for capacity reclaim by {} ({})", vm_id, d.uuid, vm.record.by, result->detail));
      } else {
        const std::string why = result ? result->detail : result.error().message;
        ch.audits.push_back(AuditDraft{"workload.terminate", holder, vm.unit_ids, {vm_id}, "failed",
                                       fmt::format("{}spot VM {} (domain {}) was not stopped: {}", who, vm_id, d.name, why)});
        row.state = "failed";
        if (result || result.error().kind != vmctl::VmError::Kind::not_found) left.emplace_back(left_json(d, vm.unit_ids, "terminate-failed"));
        say(LogLevel::warning, fmt::format("VM={} DOMAIN={} terminate failed: {}", vm_id, d.uuid, why));
      }
      ch.terminations.push_back(std::move(row));
    }
    if (after) {
      const auto ws = occupants(*after);
      note_workloads(ws);
      vacate(ws, ch);
    }
    if (!ch.audits.empty() || !ch.upserts.empty()) {
      if (auto ok = commit(ch); !ok) return problem(503, "storage-unavailable", "the outcome could not be stored; the agent records it once it can");
    }
    if (unavailable) {
      json::object extra{{"terminated", std::move(terminated)}, {"leftRunning", std::move(left)}};
      return problem(503, "hypervisor-unavailable",
                     fmt::format("the hypervisor went away during the termination ({}); the VMs not listed are finished by the agent once it answers", *unavailable),
                     {}, &extra);
    }
    ApiResponse out = answer_batch(b, std::move(terminated), std::move(left));
    if (b.idempotency) store_idempotency(std::move(*b.idempotency), out);
    return out;
  }

  // The agent's own work after a fresh list: vacated reclaiming units, and pending terminations.
  std::optional<Work> observe(const std::vector<vmctl::Domain>& domains) {
    const auto ws = occupants(domains);
    note_workloads(ws);
    Change ch{agent_caller(), std::nullopt, now(), {}, {}, {}, {}, {}, {}, {}};
    vacate(ws, ch);
    if (!ch.upserts.empty()) (void)commit(ch);
    Batch run, gone;
    run.kind = gone.kind = Batch::Kind::agent;
    std::vector<vmctl::TerminationOutcome> gone_outcomes;
    for (const auto& [seq, row] : pending) {
      if (in_flight.contains(seq)) continue;
      boost::system::error_code ec;
      auto doc = json::parse(row.doc, ec);
      const json::object empty;
      const json::object& o = !ec && doc.is_object() ? doc.get_object() : empty;
      auto str = [&](const char* k) { return o.contains(k) && o.at(k).is_string() ? std::string(o.at(k).get_string()) : std::string(); };
      std::vector<std::string> unit_ids;
      if (const auto* a = o.if_contains("unitIds"); a && a->is_array()) {
        for (const auto& u : a->get_array()) {
          if (u.is_string()) unit_ids.emplace_back(u.get_string());
        }
      }
      const auto grace = std::chrono::seconds(o.contains("grace") && o.at("grace").is_int64() ? o.at("grace").get_int64() : 0);
      vmctl::TerminationRecord record{"capacity-reclaim", str("at"), str("by"), store::format_audit_id(static_cast<std::uint64_t>(seq))};
      auto found = std::find_if(domains.begin(), domains.end(), [&](const vmctl::Domain& d) { return d.uuid == row.domain_uuid; });
      if (found == domains.end() || !found->active()) {
        vmctl::Domain d = found == domains.end() ? vmctl::Domain{} : *found;
        d.uuid = row.domain_uuid;
        if (d.name.empty()) d.name = str("name");
        if (!d.label) d.label = vmctl::WorkloadLabel{str("vmId"), "", vmctl::Tier::spot};
        gone.vms.push_back(BatchVm{seq, d, unit_ids, record, grace});
        gone_outcomes.push_back(vmctl::TerminationOutcome{row.domain_uuid, vmctl::TerminateResult{true, found == domains.end() ? "the domain is gone" : "the domain is " + found->state}});
        continue;
      }
      run.vms.push_back(BatchVm{seq, *found, unit_ids, record, grace});  // terminate_spot_all refuses it if no longer spot
      in_flight.insert(seq);
    }
    if (!gone.vms.empty()) {
      for (const auto& vm : gone.vms) in_flight.insert(vm.audit_seq);
      const std::uint64_t id = next_batch++;
      batches.emplace(id, std::move(gone));
      (void)finish(id, std::move(gone_outcomes), std::unexpected(vmctl::VmError{vmctl::VmError::Kind::failed, "not listed"}));
    }
    if (run.vms.empty()) return std::nullopt;
    const std::uint64_t id = next_batch++;
    batches.emplace(id, std::move(run));
    return work_of(id);
  }

  ApiResponse terminate_spot(const ApiRequest& q, const Caller& c) {
    const bool manager = std::any_of(reservations.begin(), reservations.end(), [&](const auto& kv) { return !kv.second.ended() && r::manages(c.who, kv.second); });
    if (!(c.who.admin() || r::is_owner(c.who, node()) || manager)) {
      return forbidden("spot workloads are terminated by platform admins, the node's owner and managing orgs");
    }
    std::optional<IdempotencyDraft> idem;
    if (auto replay = idempotent_replay(q, c, idem)) return *replay;
    auto body = parse_object(q.body, true);
    if (!body) return problem(400, "invalid-request", "the body is not a valid terminate-spot request", body.error());
    Fields f(*body, {"unitIds", "reservationId", "gracePeriodSeconds", "reason"});
    auto ids = f.strings("unitIds");
    if (f.has("unitIds") && ids && ids->empty()) f.problems().push_back({"unitIds", "must name at least one unit, or be left out"});
    auto rid = f.string("reservationId");
    auto grace_s = f.integer("gracePeriodSeconds", 0, 300);
    auto reason = f.string("reason");
    if (reason && reason->size() > r::kMaxNote) f.problems().push_back({"reason", "must be at most 1024 characters"});
    if (!f.problems().empty()) return problem(400, "invalid-request", "the body is not a valid terminate-spot request", f.problems());
    const auto grace = grace_s ? std::chrono::seconds(*grace_s) : opt.shutdown_grace;

    const auto reach = r::terminate_reach(c.who, node(), all_reservations(), node_unit_ids());
    const r::Reservation* rx = nullptr;
    if (rid) {
      auto it = reservations.find(*rid);
      if (it == reservations.end() || !r::sees_reservation(c.who, node(), it->second)) {
        return problem(422, "unknown-reservation", fmt::format("no reservation {} on node {} that you can see", *rid, opt.node_id),
                       {{"reservationId", "is not a reservation of this node"}});
      }
      rx = &it->second;
    }
    std::set<std::string> targets;
    if (ids) {
      std::vector<FieldProblem> unknown, outside;
      for (const auto& u : *ids) {
        if (!known_unit(u)) unknown.push_back({"unitIds", fmt::format("{} is not a unit of node {}", u, opt.node_id)});
        else if (rx && !rx->holds_unit(u)) unknown.push_back({"unitIds", fmt::format("{} is not a unit of reservation {}", u, rx->id)});
        else if (!reach.contains(u)) outside.push_back({"unitIds", fmt::format("{} is outside your reach", u)});
      }
      if (!unknown.empty()) return problem(422, "unknown-unit", "some units are not units of this node", unknown);
      if (!outside.empty()) return problem(403, "out-of-reach", "some units are outside your reach: a managing org reaches only the released and reclaiming units of its active reservations", outside);
      targets.insert(ids->begin(), ids->end());
    } else {
      for (const auto& u : reach) {
        if (!rx || rx->holds_unit(u)) targets.insert(u);
      }
    }
    auto ws = workloads_now();
    if (!ws) return ws.error();
    Batch b;
    b.kind = Batch::Kind::terminate_spot;
    b.caller = c;
    b.request_id = q.request_id;
    b.idempotency = std::move(idem);
    Change base{c, q.request_id, now(), {}, {}, {}, {}, {}, {}, {}};
    const bool whole_node = (c.who.admin() || r::is_owner(c.who, node())) && !ids && !rx;
    return start_batch(std::move(b), std::move(base), spot::plan(*ws, targets, reach, whole_node), grace, reason);
  }

  ApiResponse reclaim(const ApiRequest& q, const Caller& c, const r::Reservation& current) {
    if (!(c.who.admin() || r::manages(c.who, current))) return forbidden("only a platform admin or a managing org reclaims units");
    std::optional<IdempotencyDraft> idem;
    if (auto replay = idempotent_replay(q, c, idem)) return *replay;
    auto body = parse_object(q.body, false);
    if (!body) return problem(400, "invalid-request", "the body is not a valid reclaim request", body.error());
    Fields f(*body, {"unitIds", "terminateSpot"});
    auto ids = f.strings("unitIds");
    const bool terminate = f.boolean("terminateSpot").value_or(false);
    if (!ids || ids->empty()) {
      if (std::none_of(f.problems().begin(), f.problems().end(), [](const FieldProblem& p) { return p.field == "unitIds"; })) {
        f.problems().push_back({"unitIds", "must name at least one unit"});
      }
    }
    if (!f.problems().empty()) return problem(400, "invalid-request", "the body is not a valid reclaim request", f.problems());
    if (current.state != r::State::active) return problem(409, "reservation-not-active", "units are reclaimed only in an active reservation");
    std::vector<FieldProblem> unknown;
    for (const auto& u : *ids) {
      if (!current.holds_unit(u)) unknown.push_back({"unitIds", fmt::format("{} is not a unit of reservation {}", u, current.id)});
    }
    if (!unknown.empty()) return problem(422, "unknown-unit", "some units are not units of this reservation", unknown);
    // Without a list of the workloads, every reclaimed unit is taken to carry spot workloads: it
    // stays reclaiming (in its managers' reach) until a later list shows it vacated. Terminating
    // needs the list: 503 and nothing changed.
    auto ws = workloads_now();
    if (!ws && terminate) return ws.error();
    const std::set<std::string> named(ids->begin(), ids->end());
    const auto occupied = ws ? spot::spot_occupied(*ws) : named;
    auto has = [](const std::vector<std::string>& v, const std::string& u) { return std::find(v.begin(), v.end(), u) != v.end(); };
    r::Reservation x = current;
    std::vector<std::string> newly;
    for (const auto& u : named) {
      const bool released = has(x.released_unit_ids, u), reclaiming = has(x.reclaiming_unit_ids, u);
      if (!released && !reclaiming) continue;  // not on the spot market: nothing to do
      if (released) newly.push_back(u);
      std::erase(x.released_unit_ids, u);
      std::erase(x.reclaiming_unit_ids, u);
      if (occupied.contains(u)) x.reclaiming_unit_ids.push_back(u);
    }
    std::sort(x.reclaiming_unit_ids.begin(), x.reclaiming_unit_ids.end());
    const r::Time t = now();
    Change base{c, q.request_id, t, {}, {}, {}, {}, {}, {}, {}};
    if (x.released_unit_ids != current.released_unit_ids || x.reclaiming_unit_ids != current.reclaiming_unit_ids) {
      x.version += 1;
      x.updated_at = t;
      base.upserts.push_back(x);
      std::vector<std::string> still;
      for (const auto& u : newly) {
        if (has(x.reclaiming_unit_ids, u)) still.push_back(u);
      }
      base.audits.push_back(AuditDraft{"units.reclaim", x.id, newly.empty() ? std::vector<std::string>(named.begin(), named.end()) : newly, {}, "ok",
                                       still.empty() ? std::optional<std::string>()
                                                     : fmt::format("spot workloads still run on {}", fmt::join(still, ", "))});
      if (!newly.empty()) base.events.push_back(EventDraft{"units.reclaimed", json::object{{"reservationId", x.id}, {"unitIds", strings_json(newly)}}});
    }
    Batch b;
    b.kind = Batch::Kind::reclaim;
    b.caller = c;
    b.request_id = q.request_id;
    b.reservation_id = current.id;
    b.idempotency = std::move(idem);
    spot::Plan p;
    if (terminate) {
      std::set<std::string> targets, reach = r::terminate_reach(c.who, node(), all_reservations(), node_unit_ids());
      for (const auto& u : x.reclaiming_unit_ids) {
        if (named.contains(u)) targets.insert(u);
      }
      reach.insert(targets.begin(), targets.end());  // the caller manages these units: they are reclaiming now
      p = spot::plan(*ws, targets, reach);
    }
    return start_batch(std::move(b), std::move(base), p, opt.shutdown_grace, std::nullopt);
  }

  // GETs carry an ETag and answer If-None-Match with 304.
  ApiResponse conditional(const ApiRequest& q, ApiResponse resp) const {
    if (q.method != "GET" || resp.status != 200) return resp;
    std::string etag;
    if (auto e = resp.header("ETag")) {
      etag = std::string(*e);
    } else {
      etag = fmt::format("\"{}\"", store::sha256_hex(resp.body).value_or("0").substr(0, 20));
      resp.headers.emplace_back("ETag", etag);
    }
    if (auto inm = q.header("if-none-match"); inm && etag_matches(*inm, etag)) {
      ApiResponse not_modified;
      not_modified.status = 304;
      not_modified.headers.emplace_back("ETag", etag);
      return not_modified;
    }
    return resp;
  }
};

NodeService::NodeService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeService::~NodeService() = default;

std::expected<std::unique_ptr<NodeService>, std::string> NodeService::open(ServiceOptions options,
                                                                           std::shared_ptr<const auth::TokenVerifier> verifier,
                                                                           const discovery::PciIds* names, Clock clock,
                                                                           LogSink log) {
  const auto file = options.state_dir / "state.db";
  auto db = store::Database::open(file);
  if (!db) return std::unexpected(db.error().message);
  if (auto m = db->migrate(migrations()); !m) return std::unexpected(m.error().message);
  auto impl = std::make_unique<Impl>(std::move(options), std::move(*db));
  impl->verifier = std::move(verifier);
  impl->names = names;
  impl->clock = std::move(clock);
  impl->log = std::move(log);
  if (auto loaded = impl->load(); !loaded) return std::unexpected(loaded.error());
  impl->apply_terms();  // terms that came while the agent was down, in time order, before serving
  impl->scan(true);
  return std::unique_ptr<NodeService>(new NodeService(std::move(impl)));
}

ApiResponse NodeService::handle(const ApiRequest& request) {
  impl_->apply_terms();  // never answer with a term the clock has passed
  return impl_->conditional(request, impl_->route(request));
}

std::optional<reservations::Time> NodeService::tick() { return impl_->apply_terms(); }
void NodeService::rescan() { impl_->scan(false); }
void NodeService::set_hypervisor(std::shared_ptr<vmctl::Hypervisor> hypervisor) { impl_->hypervisor = std::move(hypervisor); }
void NodeService::set_verifier(std::shared_ptr<const auth::TokenVerifier> verifier) {
  impl_->verifier = std::move(verifier);
  impl_->token_cache.clear();
}
void NodeService::set_unsellable(std::vector<std::string> unsellable) {
  impl_->opt.policy.unsellable = std::move(unsellable);
  impl_->reader.reset();
  impl_->scan(false);
}
std::int64_t NodeService::revision() const { return impl_->revision; }

std::optional<Work> NodeService::work(std::uint64_t batch) const { return impl_->work_of(batch); }

ApiResponse NodeService::finish(std::uint64_t batch, std::vector<vmctl::TerminationOutcome> outcomes,
                                const std::expected<std::vector<vmctl::Domain>, vmctl::VmError>& after) {
  return impl_->finish(batch, std::move(outcomes), after);
}

std::optional<Work> NodeService::observe_workloads(const std::vector<vmctl::Domain>& domains) { return impl_->observe(domains); }

ApiResponse NodeService::handle_now(const ApiRequest& request, const vmctl::Sleeper& sleep) {
  ApiResponse resp = handle(request);
  if (resp.status != 0 || resp.work == 0) return resp;
  auto w = work(resp.work);
  std::vector<vmctl::TerminationOutcome> outcomes;
  if (w && impl_->hypervisor) outcomes = vmctl::terminate_spot_all(*impl_->hypervisor, w->jobs, sleep);
  auto after = impl_->hypervisor ? impl_->hypervisor->list() : std::unexpected(vmctl::VmError{vmctl::VmError::Kind::unavailable, "no hypervisor"});
  return finish(resp.work, std::move(outcomes), after);
}

void NodeService::refresh_now(const vmctl::Sleeper& sleep) {
  if (!impl_->hypervisor) return;
  auto list = impl_->hypervisor->list();
  if (!list) return;
  auto w = observe_workloads(*list);
  if (!w) return;
  auto outcomes = vmctl::terminate_spot_all(*impl_->hypervisor, w->jobs, sleep);
  (void)finish(w->batch, std::move(outcomes), impl_->hypervisor->list());
}

}  // namespace gpunode::service
