// NodeService::Impl's state: loading, units and scan, terms, request plumbing, the committer;
// NodeService.
#include <algorithm>

#include "gpunode/discovery/json.hpp"
#include "gpunode/discovery/rules.hpp"
#include "gpunode/service/reservation_json.hpp"
#include "gpunode/store/audit_chain.hpp"
#include "impl.hpp"

namespace gpunode::service {
using namespace detail;

// ---- loading -----------------------------------------------------------------------------------
void NodeService::Impl::load() {
  auto loaded = store.take_loaded();
  state.load(std::move(loaded.reservations), loaded.absent_units);
  terminations.load(std::move(loaded.pending));
  health.enabled = opt.health.enabled;
  health.settings = opt.health.settings;
  health.devices = std::move(loaded.health_devices);
  health.verdicts = std::move(loaded.health_units);
  if (const auto n = terminations.pending().size(); n > 0) {
    say(LogLevel::warning,
        fmt::format("{} termination(s) were cut short: finishing them once libvirt answers", n));
  }
}

// ---- units ---------------------------------------------------------------------------------------
void NodeService::Impl::scan(bool first) {
  const auto started = std::chrono::steady_clock::now();
  if (!reader) reader = std::make_unique<discovery::SysfsReader>(opt.host_root, opt.policy, names);
  auto fingerprint = reader->fingerprint();  // before the read: a change during it is seen next time
  auto snapshot = reader->read();
  for (const auto& w : snapshot.warnings) say(LogLevel::warning, "discovery: " + w);
  auto fresh = discovery::build_units(snapshot, opt.policy);
  for (auto& u : fresh) discovery::apply_health(u, health.unit_health(u.id));  // as last judged (§13)
  health.built_for.clear();  // a device may be back at the same address: its files are opened again
  last_scan_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  auto next = inventory.scan(std::move(fresh), first ? store.present_unit_ids() : std::vector<std::string>{},
                             [this](const std::string& id) { return store.unit_doc(id); });
  if (!next.changed(store.inventory_digest())) {
    (void)state.replace_inventory(std::move(next.next), nullptr,
                                  clock());  // nothing to store: it cannot fail
    scanned_fingerprint = std::move(fingerprint);
    return;
  }
  Change c{.actor = agent_caller(), .at = now()};
  for (const auto& [id, doc] : next.newly_absent) {
    c.units.push_back({id, {json::serialize(doc), true}});
    c.audits.push_back(
        AuditDraft{"unit.absent", std::nullopt, {id}, {}, "ok", "the unit is no longer on the host"});
  }
  for (const auto& u : next.next.present())
    c.units.push_back({u.id, {json::serialize(discovery::unit_to_json(u)), false}});
  Caller admin{r::Caller{"gpunode-agent", std::nullopt, {"platform-admin"}, "agent"}};
  c.events.push_back(EventDraft{
      "inventory.changed", json::object{{"units", units_json(node(), reservations, next.next, admin.who)}}});
  c.inventory_digest = next.digest;
  // A failed commit keeps the old inventory: the next scan tries again (the stored digest is unchanged).
  if (auto stored = state.replace_inventory(std::move(next.next), &c, clock()); !stored) {
    say(LogLevel::error, fmt::format("state commit failed: {}", stored.error().to_string()));
    scanned_fingerprint.reset();
    return;
  }
  scanned_fingerprint = std::move(fingerprint);
  say(LogLevel::info, fmt::format("inventory changed: {} present unit(s), {} absent",
                                  inventory.present().size(), inventory.absent().size()));
}

void NodeService::Impl::backstop_scan() {
  if (reader && scanned_fingerprint && reader->fingerprint() == scanned_fingerprint) return;
  scan(false);
}

metrics::NodeGauges NodeService::Impl::gauges() const {
  metrics::NodeGauges g = counted;
  constexpr std::size_t kNone = 2;  // metrics::kUnitClasses: a class it does not name counts as none
  auto unit = [&](std::string_view cls, bool reservable) {
    ++g.units[metrics::index_of(metrics::kUnitClasses, cls).value_or(kNone)][reservable ? 1 : 0];
  };
  // As units_json() lists them: every present unit, and each absent one not present again.
  for (const auto& u : inventory.present()) unit(discovery::to_string(u.cls), u.reservable);
  for (const auto& [id, doc] : inventory.absent()) {
    if (inventory.find(id)) continue;
    const auto* cls = doc.if_contains("class");
    const auto* res = doc.if_contains("reservable");
    unit(cls && cls->is_string() ? std::string_view(cls->get_string()) : std::string_view("none"),
         res && res->is_bool() && res->get_bool());
  }
  for (const auto& x : reservations) {
    if (auto i = metrics::index_of(metrics::kReservationStates, r::to_string(x.state))) ++g.reservations[*i];
  }
  if (auto i = metrics::index_of(metrics::kReservationStates, r::to_string(r::State::ended)))
    g.reservations[*i] += store.ended_reservations();
  g.revision = store.revision();
  g.discovery_seconds = last_scan_seconds;
  g.unentitled_workloads = static_cast<std::int64_t>(unentitled.size());
  health_gauges(g);
  return g;
}

// ---- terms ---------------------------------------------------------------------------------------
std::optional<r::Time> NodeService::Impl::apply_terms() {
  const r::Time t = now();
  std::vector<r::Reservation> due;
  for (auto it = term_queue.begin(); it != term_queue.end() && it->first <= t; ++it)
    due.push_back(reservations.at(it->second));
  for (const auto& tr : r::due_transitions(due, t)) {
    r::Reservation x = reservations.at(tr.reservation_id);
    r::apply(x, tr);
    x.updated_at = t;
    x.version += 1;
    const bool activate = tr.kind == r::Transition::Kind::activate;
    Change c{.actor = agent_caller(), .at = t, .upserts = {x}};
    c.audits.push_back(
        AuditDraft{activate ? "reservation.activate" : "reservation.expire",
                   x.id,
                   x.unit_ids,
                   {},
                   "ok",
                   fmt::format("term {} at {}", activate ? "started" : "ended", r::format_time(tr.at))});
    c.events.push_back(EventDraft{activate ? "reservation.activated" : "reservation.expired",
                                  json::object{{"reservation", to_json(x)}}});
    if (!carry_out(c)) break;  // next_term() says to retry in a second
    say(LogLevel::info, fmt::format("RESERVATION={} {}", x.id, activate ? "activated" : "expired"));
  }
  return next_term();
}

std::optional<r::Time> NodeService::Impl::next_term() const {
  if (term_queue.empty()) return std::nullopt;
  const r::Time t = now();
  // Still due after apply_terms(): its commit failed (a full disk); try again in a second.
  return term_queue.begin()->first <= t ? t + std::chrono::seconds(1) : term_queue.begin()->first;
}

// ---- request plumbing ------------------------------------------------------------------------
std::expected<Caller, ApiResponse> NodeService::Impl::authenticate(const ApiRequest& q) {
  auto who = authenticator.authenticate(q, clock());
  if (!who) {
    const std::string& why = who.error().why;
    say(LogLevel::info,
        fmt::format("REQUEST={} unauthenticated: {}", q.request_id, why.empty() ? "no token" : why));
    return std::unexpected(std::move(who.error().answer));
  }
  return std::move(*who);
}

// ---- what a route may ask (decision.hpp's Lookups) ----------------------------------------------
// Idempotency-Key: the draft to store with the change, or the answer to give now (a replay, a 409
// while the first call runs, a 422 for another request under the same key).
std::expected<std::optional<IdempotencyDraft>, ApiResponse> NodeService::Impl::Asks::idempotency(
    const ApiRequest& q, const Caller& c) const {
  auto key = q.header("idempotency-key");
  if (!key) return std::nullopt;
  if (key->empty() || key->size() > 256)
    return std::unexpected(problem(400, "invalid-request", "Idempotency-Key must be 1 to 256 characters",
                                   {{"Idempotency-Key", "must be 1 to 256 characters"}}));
  auto fp = store::sha256_hex(q.method + " " + q.path + "\n" + q.body);
  IdempotencyDraft d{c.key(), std::string(*key), fp.value_or(""), {}};
  // A call with this key still running (terminations waiting out their grace): its answer is not
  // stored yet, and a second call must neither start again nor overwrite it.
  if (impl_.terminations.running_key(d.caller, d.key)) {
    return std::unexpected(
        with_header(problem(409, "idempotency-key-in-use",
                            "a request with this Idempotency-Key is still running; retry to get its answer"),
                    "Retry-After", "1"));
  }
  if (auto kept = impl_.store.idempotent_answer(d.caller, d.key);
      kept && impl_.now().time_since_epoch().count() - kept->created_at < kIdempotencyWindow.count()) {
    if (kept->fingerprint != d.fingerprint)
      return std::unexpected(
          problem(422, "idempotency-key-reuse", "this Idempotency-Key was used with another request"));
    kept->response.headers.emplace_back("Idempotent-Replayed", "true");
    return std::unexpected(std::move(kept->response));
  }
  return d;
}

// The request's own list (max_age zero asks for one), else the kept one while events say it holds
// and it is young enough.
detail::WorkloadsOrNot NodeService::Impl::Asks::workloads(std::chrono::milliseconds max_age) const {
  if (!impl_.has_hypervisor)
    return std::unexpected(problem(503, "hypervisor-unavailable", "no hypervisor is configured"));
  const auto& kept = impl_.listed;
  const bool own = q_.workloads != nullptr && q_.workloads == kept;
  const bool usable = kept && impl_.listed_current && max_age.count() > 0 &&
                      (max_age == kAnyListAge || std::chrono::steady_clock::now() - kept->at <= max_age);
  if (!own && !usable) return std::unexpected(NeedsWorkloads{});
  if (!kept->domains) {
    impl_.say(LogLevel::warning, "hypervisor: " + kept->domains.error().detail);
    return std::unexpected(
        problem(503, "hypervisor-unavailable",
                fmt::format("the hypervisor cannot be reached: {}", kept->domains.error().detail)));
  }
  return &impl_.listed_workloads;
}

std::vector<detail::Workload> NodeService::Impl::Asks::starting() const {
  std::vector<detail::Workload> out;
  for (const auto& [uuid, e] : impl_.admitted.starting(impl_.clock())) out.push_back({e.domain, e.unit_ids});
  return out;
}

const r::Reservation* NodeService::Impl::Asks::reservation(std::string_view id,
                                                           std::optional<r::Reservation>& kept) const {
  return impl_.find_reservation(id, kept);
}

std::string NodeService::Impl::Asks::new_id(std::string_view prefix) const {
  return detail::new_id(prefix, impl_.clock());
}

// ---- the committer ---------------------------------------------------------------------------------
detail::Facts NodeService::Impl::facts(const Asks& asks) const {
  return detail::Facts{.node = node(),
                       .reservations = reservations,
                       .live = live,
                       .inventory = inventory,
                       .now = now(),
                       .shutdown_grace = opt.shutdown_grace,
                       .ask = asks};
}

Outcome NodeService::Impl::carry_out(detail::Decision d) {
  if (auto* t = std::get_if<detail::Terminate>(&d)) {
    if (auto instead = without_batch(*t)) {
      d = std::move(*instead);  // no VM to stop: carried out as what it is instead
    } else {
      const auto audit_of = write_ahead(*t);
      auto done = carry_out(t->change);
      if (!done)
        return storage_problem(done.error(), "the change could not be stored",
                               "nothing was changed or stopped");
      return run_batch(std::move(*t), audit_of, *done);
    }
  }
  if (auto* c = std::get_if<detail::CommitThen>(&d)) {
    if (c->change.idempotency) c->change.idempotency->response = c->answer;
    const auto done = carry_out(c->change);
    if (done) {
      counted.terminations_ok += c->terminations_ok;
      counted.terminations_failed += c->terminations_failed;
    }
    ApiResponse out = done || c->answer_anyway
                          ? std::move(c->answer)
                          : storage_problem(done.error(), c->unstored_what, c->unstored_after);
    if (c->log && out.status < 300) say(LogLevel::info, *c->log);
    if (c->apply_terms) apply_terms();
    return out;
  }
  if (auto* n = std::get_if<NeedsWorkloads>(&d)) return *n;
  return std::move(std::get<ApiResponse>(d));
}

// The one way a change is stored: `state` commits it and moves what follows (memory, the generation);
// then, when reservations moved, entitlement moved with them: the last listing is judged again.
std::expected<detail::Committed, store::DbError> NodeService::Impl::carry_out(const Change& c) {
  auto done = state.apply(c, clock());
  if (!done) {
    say(LogLevel::error, fmt::format("state commit failed: {}", done.error().to_string()));
    return done;
  }
  if (!c.upserts.empty()) rejudge();
  return done;
}

// ---- the domains as listed -----------------------------------------------------------------------
void NodeService::Impl::take_listing(std::shared_ptr<const WorkloadListing> listing) {
  listed = std::move(listing);
  listed_workloads.clear();
  if (!listed->domains) {
    state.set_workloads_current(false);
    return;
  }
  listed_workloads = occupants(*listed->domains);
  // Served from the snapshot only while the snapshot shows this very list.
  const bool shown = note_workloads(listed_workloads);
  state.set_workloads_current(listed->current && shown);
  admitted.seen(*listed->domains);
}

void NodeService::Impl::listing_stale() {
  state.set_workloads_current(false);
}

// Idempotency rows are kept 24 h (CONTRACT §4 Conventions), then deleted: at most once a minute,
// from the clock's tick.
void NodeService::Impl::purge_idempotency() {
  const auto t = now();
  if (t - last_purge < std::chrono::minutes(1)) return;
  last_purge = t;
  const auto cutoff = static_cast<std::int64_t>(t.time_since_epoch().count()) - kIdempotencyWindow.count();
  if (auto purged = store.purge_idempotency(cutoff); !purged)
    say(LogLevel::warning, "idempotency retention: " + purged.error().to_string());
}

// ---- NodeService ---------------------------------------------------------------------------------
NodeService::NodeService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeService::~NodeService() = default;

error::Result<std::unique_ptr<NodeService>> NodeService::open(
    ServiceOptions options, std::shared_ptr<const auth::TokenVerifier> verifier,
    const discovery::PciIds* names, Clock clock, LogSink log) {
  auto stored = detail::StateStore::open(options.state_dir / "state.db", options.node_id);
  if (!stored) return std::unexpected(error::with_kind(std::move(stored.error())));
  auto impl = std::make_unique<Impl>(std::move(options), std::move(*stored));
  impl->authenticator.set_verifier(std::move(verifier));
  impl->names = names;
  impl->clock = std::move(clock);
  impl->log = std::move(log);
  if (auto z = impl->store.preallocate_wal(); !z) {
    impl->say(LogLevel::warning, fmt::format("the WAL is not preallocated ({}): commits extend it as they go",
                                             z.error().to_string()));
  }
  impl->load();
  impl->apply_terms();  // terms that came while the agent was down, in time order, before serving
  impl->scan(true);
  impl->poll_health();  // a restart keeps what was latched; the first poll takes the baselines
  impl->snapshot();     // published before the first request: reads need no hop from the start
  return std::unique_ptr<NodeService>(new NodeService(std::move(impl)));
}

Outcome NodeService::handle(const ApiRequest& request, HeldLog& held) {
  impl_->held_log = &held;
  struct Release {
    Impl& impl;
    ~Release() { impl.held_log = nullptr; }
  } release{*impl_};
  return impl_->respond(request);  // published by after_answer()
}

// After the answer: a read that comes before the publish finds the snapshot behind the generation
// (the commit moved it) and is answered here, on the state thread, which publishes before it
// answers anything else. Read-your-writes holds either way; the copy is off the answer's path.
void NodeService::after_answer(HeldLog& held) {
  impl_->publish();
  for (const auto& [level, text] : held.lines) {
    if (impl_->log) impl_->log(level, text);
  }
  held.lines.clear();
}

Outcome NodeService::handle(const ApiRequest& request) {
  Outcome out = impl_->respond(request);
  impl_->publish();  // before the answer goes out
  return out;
}

Outcome NodeService::Impl::respond(const ApiRequest& request) {
  apply_terms();  // never answer with a term the clock has passed
  if (request.workloads && request.workloads != listed) take_listing(request.workloads);
  Outcome out = route(request);
  if (auto* resp = std::get_if<ApiResponse>(&out)) *resp = conditional(request, std::move(*resp));
  return out;
}

std::optional<reservations::Time> NodeService::tick() {
  impl_->purge_idempotency();
  auto next = impl_->apply_terms();
  impl_->publish();
  return next;
}
void NodeService::rescan() {
  impl_->scan(false);
  impl_->publish();
}
void NodeService::poll_health() {
  impl_->poll_health();
  impl_->publish();
}
std::optional<std::chrono::milliseconds> NodeService::health_interval() const {
  if (!impl_->opt.health.enabled) return std::nullopt;
  return impl_->opt.health.interval;
}
void NodeService::rescan_if_changed() {
  impl_->backstop_scan();
  impl_->publish();
}
void NodeService::set_has_hypervisor(bool has) {
  impl_->has_hypervisor = has;
}
void NodeService::set_enforcement(config::EnforcementMode mode) {
  impl_->state.set_enforcement(mode);
  impl_->publish();
}
void NodeService::set_verifier(std::shared_ptr<const auth::TokenVerifier> verifier) {
  impl_->authenticator.set_verifier(std::move(verifier));
}
void NodeService::set_unsellable(std::vector<std::string> unsellable) {
  impl_->opt.policy.unsellable = std::move(unsellable);
  impl_->reader.reset();
  impl_->scan(false);  // the units as the policy makes them now: the inventory is replaced
  impl_->publish();
}
std::int64_t NodeService::revision() const {
  return impl_->store.revision();
}
std::optional<reservations::Time> NodeService::next_term() const {
  return impl_->next_term();
}
std::optional<ApiResponse> NodeService::read(const ApiRequest& request,
                                             std::chrono::system_clock::time_point now) const {
  return impl_->read(request, now);
}
metrics::NodeGauges NodeService::gauges() const {
  return impl_->gauges();
}

ApiResponse NodeService::finish(std::uint64_t batch, std::vector<vmctl::TerminationOutcome> outcomes,
                                const std::expected<std::vector<vmctl::Domain>, vmctl::VmError>& after) {
  impl_->listing_stale();  // domains were stopped: the next request that needs them lists them
  auto answer = impl_->finish(batch, std::move(outcomes), after);
  impl_->publish();
  return answer;
}

std::optional<Work> NodeService::observe_workloads(std::shared_ptr<const WorkloadListing> listing) {
  impl_->take_listing(std::move(listing));
  std::optional<Work> work;
  if (impl_->listed->domains) work = impl_->observe(*impl_->listed->domains);
  impl_->publish();
  return work;
}

void NodeService::workloads_changed() {
  impl_->listing_stale();
  impl_->publish();
}

}  // namespace gpunode::service
