// NodeService::Impl's state: loading, migrations, commit, units and scan, terms, request plumbing; NodeService.
#include <algorithm>
#include <charconv>
#include <random>

#include "gpunode/discovery/json.hpp"
#include "gpunode/discovery/rules.hpp"
#include "gpunode/service/reservation_json.hpp"
#include "gpunode/store/audit_chain.hpp"
#include "gpunode/store/canonical_json.hpp"
#include "impl.hpp"

namespace gpunode::service {
using namespace detail;

namespace {

constexpr std::int64_t kIdempotencyWindowSeconds = 24 * 3600;

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

}  // namespace

namespace detail {

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

}  // namespace detail

const std::vector<r::Reservation>& NodeService::Impl::all_reservations() const {
  if (list_stale) {
    list_cache.clear();
    list_cache.reserve(reservations.size());
    for (const auto& [id, x] : reservations) list_cache.push_back(x);
    list_stale = false;
  }
  return list_cache;
}

// ---- loading -----------------------------------------------------------------------------------
std::expected<void, std::string> NodeService::Impl::load() {
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

std::expected<store::Statement*, DbError> NodeService::Impl::cached(std::string_view sql) {
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

// ---- the one way state changes ----------------------------------------------------------------
std::expected<void, std::string> NodeService::Impl::commit(Change& c) {
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
      // The first answer stays for its 24 hours; only an expired row is replaced.
      auto st = cached(
          "INSERT INTO idempotency (caller, key, fingerprint, status, headers, body, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) "
          "ON CONFLICT(caller, key) DO UPDATE SET fingerprint = excluded.fingerprint, status = excluded.status, headers = excluded.headers, "
          "body = excluded.body, created_at = excluded.created_at WHERE idempotency.created_at <= excluded.created_at - 86400");
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
  // The rules' list follows in place (it is in id order, like the map): no copy of every
  // reservation per commit, which made a create cost grow with the number of reservations.
  if (!list_stale) {
    for (const auto& x : c.upserts) {
      auto at = std::lower_bound(list_cache.begin(), list_cache.end(), x.id,
                                 [](const r::Reservation& a, const std::string& id) { return a.id < id; });
      if (at != list_cache.end() && at->id == x.id) *at = x;
      else list_cache.insert(at, x);
    }
  }
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

// ---- units ---------------------------------------------------------------------------------------
json::object NodeService::Impl::unit_view(const discovery::Unit& u, const Caller& caller) const {
  return discovery::unit_to_json(u, r::visible_reservation_ids(caller.who, node(), all_reservations(), u.id));
}

json::object NodeService::Impl::absent_view(const std::string& id, json::object doc, const Caller& caller) const {
  doc["reservationIds"] = strings_json(r::visible_reservation_ids(caller.who, node(), all_reservations(), id));
  return doc;
}

json::array NodeService::Impl::units_json(const Caller& caller) const {
  std::map<std::string, json::object> all;
  for (const auto& u : units) all.emplace(u.id, unit_view(u, caller));
  for (const auto& [id, doc] : absent_units) {
    if (!all.contains(id)) all.emplace(id, absent_view(id, doc, caller));
  }
  json::array out;
  for (auto& [id, o] : all) out.emplace_back(std::move(o));
  return out;
}

const discovery::Unit* NodeService::Impl::present_unit(const std::string& id) const {
  auto it = std::lower_bound(units.begin(), units.end(), id, [](const discovery::Unit& u, const std::string& k) { return u.id < k; });
  return it != units.end() && it->id == id ? &*it : nullptr;
}

void NodeService::Impl::scan(bool first) {
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

// ---- terms ---------------------------------------------------------------------------------------
std::optional<r::Time> NodeService::Impl::apply_terms() {
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

// ---- request plumbing ------------------------------------------------------------------------
std::expected<Caller, ApiResponse> NodeService::Impl::authenticate(const ApiRequest& q) {
  std::string why;
  auto who = authenticator.authenticate(q, clock(), why);
  if (!who) {
    say(LogLevel::info, fmt::format("REQUEST={} unauthenticated: {}", q.request_id, why.empty() ? "no token" : why));
    return std::unexpected(std::move(who.error()));
  }
  return Caller{std::move(*who)};
}

std::string NodeService::Impl::caller_key(const Caller& c) {
  return fmt::format("{}|{}|{}", c.who.via, c.who.sub, c.who.org.value_or(""));
}

// Idempotency-Key: a stored response to replay, a 422, or nothing (go on).
std::optional<ApiResponse> NodeService::Impl::idempotent_replay(const ApiRequest& q, const Caller& c, std::optional<IdempotencyDraft>& draft) {
  auto key = q.header("idempotency-key");
  if (!key) return std::nullopt;
  if (key->empty() || key->size() > 256) return problem(400, "invalid-request", "Idempotency-Key must be 1 to 256 characters", {{"Idempotency-Key", "must be 1 to 256 characters"}});
  auto fp = store::sha256_hex(q.method + " " + q.path + "\n" + q.body);
  IdempotencyDraft d{caller_key(c), std::string(*key), fp.value_or(""), {}};
  // A call with this key still running (terminations waiting out their grace): its answer is not
  // stored yet, and a second call must neither start again nor overwrite it.
  for (const auto& [id, b] : batches) {
    if (b.idempotency && b.idempotency->caller == d.caller && b.idempotency->key == d.key) {
      return with_header(problem(409, "idempotency-key-in-use", "a request with this Idempotency-Key is still running; retry to get its answer"),
                         "Retry-After", "1");
    }
  }
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

// Idempotency rows are kept 24 h (CONTRACT §4 Conventions), then deleted: at most once a minute,
// from the clock's tick.
void NodeService::Impl::purge_idempotency() {
  const auto t = now();
  if (t - last_purge < std::chrono::minutes(1)) return;
  last_purge = t;
  auto st = cached("DELETE FROM idempotency WHERE created_at < ?1");
  if (!st) return;
  const auto cutoff = static_cast<std::int64_t>(t.time_since_epoch().count()) - kIdempotencyWindowSeconds;
  if (auto b = (*st)->bind_all(cutoff); !b) return;
  if (auto run = (*st)->run(); !run) say(LogLevel::warning, "idempotency retention: " + run.error().message);
}

ApiResponse NodeService::Impl::commit_response(Change& c, ApiResponse resp) {
  if (c.idempotency) c.idempotency->response = resp;
  if (auto ok = commit(c); !ok) return problem(503, "storage-unavailable", "the change could not be stored; nothing was changed");
  return resp;
}

// ---- NodeService ---------------------------------------------------------------------------------
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
  impl->authenticator.set_verifier(std::move(verifier));
  impl->names = names;
  impl->clock = std::move(clock);
  impl->log = std::move(log);
  if (auto loaded = impl->load(); !loaded) return std::unexpected(loaded.error());
  impl->apply_terms();  // terms that came while the agent was down, in time order, before serving
  impl->scan(true);
  return std::unique_ptr<NodeService>(new NodeService(std::move(impl)));
}

Outcome NodeService::handle(const ApiRequest& request) {
  impl_->apply_terms();  // never answer with a term the clock has passed
  impl_->listing = request.workloads.get();
  struct Clear {
    Impl& impl;
    ~Clear() { impl.listing = nullptr; }
  } clear{*impl_};
  Outcome out = impl_->route(request);
  if (auto* resp = std::get_if<ApiResponse>(&out)) *resp = impl_->conditional(request, std::move(*resp));
  return out;
}

std::optional<reservations::Time> NodeService::tick() {
  impl_->purge_idempotency();
  return impl_->apply_terms();
}
void NodeService::rescan() { impl_->scan(false); }
void NodeService::set_has_hypervisor(bool has) { impl_->has_hypervisor = has; }
void NodeService::set_verifier(std::shared_ptr<const auth::TokenVerifier> verifier) {
  impl_->authenticator.set_verifier(std::move(verifier));
}
void NodeService::set_unsellable(std::vector<std::string> unsellable) {
  impl_->opt.policy.unsellable = std::move(unsellable);
  impl_->reader.reset();
  impl_->scan(false);
}
std::int64_t NodeService::revision() const { return impl_->revision; }

ApiResponse NodeService::finish(std::uint64_t batch, std::vector<vmctl::TerminationOutcome> outcomes,
                                const std::expected<std::vector<vmctl::Domain>, vmctl::VmError>& after) {
  return impl_->finish(batch, std::move(outcomes), after);
}

std::optional<Work> NodeService::observe_workloads(const std::vector<vmctl::Domain>& domains) { return impl_->observe(domains); }

}  // namespace gpunode::service
