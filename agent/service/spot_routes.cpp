// NodeService::Impl's spot market: reclaim, terminate-spot, termination batches, finish, observe, vacate.
#include <fmt/ranges.h>

#include <algorithm>

#include "gpunode/service/reservation_json.hpp"
#include "gpunode/store/audit_chain.hpp"
#include "impl.hpp"

namespace gpunode::service {
using namespace detail;

// ---- the spot market: reclaim and terminate-spot (CONTRACT §4, §5, §7) --------------------------
// A list that differs from the last one moves the revision (stored, so it never goes back).
// Returns whether observed_workloads shows `ws` now.
bool NodeService::Impl::note_workloads(const std::vector<Workload>& ws) {
  // At every listing: a reservation may have started under an unchanged list.
  if (&ws != &last_workloads) last_workloads = ws;
  rejudge();
  json::array a;
  for (const auto& w : ws) a.emplace_back(workload_json(w));
  std::string digest = json::serialize(a);
  if (auto shown = state.replace_workloads(std::move(a), std::move(digest)); !shown) {
    say(LogLevel::warning,
        "workloads changed but the revision could not be stored (tried again with the next list): " +
            shown.error().to_string());
    return false;
  }
  return true;
}

// The active reservation holding one of the units (the first found), for workload.terminated.
std::optional<std::string> NodeService::Impl::holder_of(const std::vector<std::string>& unit_ids) const {
  for (const auto& u : unit_ids) {
    if (const auto* x = r::active_holder(all_reservations(), u)) return x->id;
  }
  return std::nullopt;
}

json::object NodeService::Impl::left_json(const vmctl::Domain& d, const std::vector<std::string>& unit_ids,
                                          std::string_view reason) {
  auto o = vm_json({d.label, d.uuid, d.name, unit_ids},
                   {VmKey::vm_id, VmKey::domain_uuid, VmKey::name, VmKey::unit_ids, VmKey::tier});
  o["reason"] = reason;
  return o;
}

// Reclaiming units that no active spot workload occupies any more leave reclaimingUnitIds.
void NodeService::Impl::vacate(const std::vector<Workload>& ws, Change& ch) {
  const auto occupied = spot::spot_occupied(ws);
  for (const auto& current : reservations) {
    if (current.state != r::State::active || current.reclaiming_unit_ids.empty()) continue;
    r::Reservation x = current;
    const auto vacated = r::vacate(x, occupied);
    if (vacated.empty()) continue;
    x.version += 1;
    x.updated_at = ch.at;
    ch.upserts.push_back(x);
    ch.audits.push_back(AuditDraft{
        "units.reclaim", x.id, vacated, {}, "ok", "reclaim complete: no spot workload is left on the units"});
  }
}

// A batch with no VM to stop is no batch: a dry run's answer, a no-op's, or `t.change` (a reclaim's)
// committed with its idempotent answer. A domain whose termination another call (or the agent) has
// already started is not started again: it is listed as `terminating`, and that other termination
// reports it. Nothing when VMs are to be stopped.
std::optional<Decision> NodeService::Impl::without_batch(Terminate& t) {
  auto& b = t.batch;
  for (const auto& l : t.plan.left_running)
    b.left_running.emplace_back(left_json(l.vm->domain, l.unit_ids, l.reason));
  const auto underway = terminations.underway_domains();
  std::erase_if(t.plan.terminate, [&](const spot::Occupant* vm) {
    if (!underway.contains(vm->domain.uuid)) return false;
    b.terminating.emplace_back(terminated_json(vm->domain, vm->unit_ids));
    return true;
  });
  if (t.dry_run) return dry_run_answer(t);
  if (!t.plan.terminate.empty()) return std::nullopt;
  auto& base = t.change;
  ApiResponse out = answer_batch(b, json::array{}, json::array(b.left_running), base.upserts);
  base.idempotency = std::move(b.idempotency);
  if (base.upserts.empty() && base.audits.empty() && !base.idempotency) return out;  // a no-op
  // The change and its idempotent answer: one commit.
  return CommitThen{.change = std::move(base), .answer = std::move(out)};
}

// Each termination written ahead into `t.change` (with a reclaim's change): its audit record, whose
// id goes into the domain's termination record, its pending row, and its notice. Returns each VM's
// record's index in the change's audits.
std::vector<std::size_t> NodeService::Impl::write_ahead(Terminate& t) {
  const auto& b = t.batch;
  auto& base = t.change;
  const auto grace = t.grace;
  const auto& reason = t.reason;
  const std::string at = r::format_time(base.at);
  std::vector<std::size_t> audit_of;  // per VM: its write-ahead record's index in base.audits
  for (const auto* vm : t.plan.terminate) {
    const auto& d = vm->domain;
    const auto holder = holder_of(vm->unit_ids);
    audit_of.push_back(base.audits.size());
    // Written ahead: `pending` (CONTRACT §7); the second record of the same vmIds gives the outcome.
    base.audits.push_back(AuditDraft{
        "workload.terminate",
        holder,
        vm->unit_ids,
        {d.label->vm_id},
        "pending",
        fmt::format("terminating spot VM {} (domain {} {}) for capacity reclaim, grace {}s{}", d.label->vm_id,
                    d.name, d.uuid, grace.count(), reason ? "; reason: " + *reason : std::string())});
    auto doc = vm_json({d.label, d.uuid, d.name, vm->unit_ids}, {VmKey::vm_id, VmKey::name, VmKey::unit_ids});
    doc["by"] = b.caller.by();
    doc["at"] = at;
    doc["grace"] = grace.count();
    base.terminations.push_back(TerminationRow{0, d.uuid, json::serialize(doc), "pending", audit_of.back()});
    // CONTRACT §12: the notice, stored with the write-ahead record and before the guest is asked
    // to shut down (the batch runs after this commit); the destroy comes no earlier than `deadline`.
    if (grace.count() > 0) {
      auto data = vm_json({d.label, d.uuid, d.name, vm->unit_ids},
                          {VmKey::vm_id, VmKey::domain_uuid, VmKey::unit_ids});
      data["reservationId"] = opt_str(holder);
      data["by"] = b.caller.by();
      data["auditId"] = nullptr;  // the commit sets it
      data["deadline"] = r::format_time(base.at + grace);
      base.events.push_back(EventDraft{"workload.terminating", std::move(data), audit_of.back()});
    }
  }
  return audit_of;
}

// Once written ahead: the audit ids the store assigned go into each domain's termination record,
// and the batch goes to the daemon.
Outcome NodeService::Impl::run_batch(Terminate t, const std::vector<std::size_t>& audit_of,
                                     const Committed& done) {
  auto& b = t.batch;
  const std::string at = r::format_time(t.change.at);
  for (std::size_t i = 0; i < t.plan.terminate.size(); ++i) {
    const auto* vm = t.plan.terminate[i];
    const std::int64_t seq = done.audit_seqs[audit_of[i]];
    vmctl::TerminationRecord record{"capacity-reclaim", at, b.caller.by(),
                                    store::format_audit_id(static_cast<std::uint64_t>(seq))};
    b.vms.push_back(BatchVm{seq, vm->domain, vm->unit_ids, std::move(record), t.grace});
  }
  say(LogLevel::info, fmt::format("REQUEST={} terminating {} spot VM(s) for {}", b.request_id.value_or("-"),
                                  b.vms.size(), b.caller.by()));
  return RunBatch{*terminations.work(terminations.start(std::move(b)))};
}

// CONTRACT §12 Dry runs: the answer the call would give now, and nothing else. The VMs it would
// terminate are `terminated`; a reclaim's reservation is as the call would leave it once they are
// gone (its reclaiming units without a spot VM left are vacated, a second version as for real).
ApiResponse NodeService::Impl::dry_run_answer(const Terminate& t) {
  json::array would;
  std::set<const spot::Occupant*> going(t.plan.terminate.begin(), t.plan.terminate.end());
  for (const auto* vm : t.plan.terminate) would.emplace_back(terminated_json(vm->domain, vm->unit_ids));
  std::vector<r::Reservation> after = t.change.upserts;
  if (t.workloads != nullptr && !going.empty()) {
    std::vector<spot::Occupant> staying;
    for (const auto& w : *t.workloads) {
      if (!going.contains(&w)) staying.push_back(w);
    }
    for (auto& x : after) {
      if (!r::vacate(x, spot::spot_occupied(staying)).empty()) x.version += 1;
    }
  }
  return answer_batch(t.batch, std::move(would), json::array(t.batch.left_running), after, true);
}

json::object NodeService::Impl::terminated_json(const vmctl::Domain& d,
                                                const std::vector<std::string>& unit_ids) {
  return vm_json({d.label, d.uuid, d.name, unit_ids},
                 {VmKey::vm_id, VmKey::domain_uuid, VmKey::name, VmKey::unit_ids});
}

ApiResponse NodeService::Impl::answer_batch(const Batch& b, json::array terminated, json::array left,
                                            const std::vector<r::Reservation>& upserts, bool dry_run) {
  json::object out{{"terminated", std::move(terminated)}, {"leftRunning", std::move(left)}};
  if (!b.terminating.empty()) out["terminating"] = b.terminating;  // only then: the contract's keys otherwise
  if (dry_run) out["dryRun"] = true;
  if (b.kind == Batch::Kind::reclaim && b.reservation_id) {
    // The reservation as the answer's commit leaves it: from `upserts` when it changes there.
    auto changed = std::find_if(upserts.begin(), upserts.end(),
                                [&](const r::Reservation& u) { return u.id == *b.reservation_id; });
    std::optional<r::Reservation> kept;  // it may have ended meanwhile
    const auto* x = changed != upserts.end() ? &*changed : find_reservation(*b.reservation_id, kept);
    if (x != nullptr) {
      out["reservation"] = to_json(*x);
      return with_header(json_response(out), "ETag", entity_tag(x->version));
    }
  }
  return json_response(out);
}

// One VM's outcome: its audit record, its event and its row in the batch's commit, and where it goes
// in the answer. An outcome of `unavailable` leaves the VM pending (the agent finishes it once
// libvirt answers again) and is noted in `t.unavailable`.
void NodeService::Impl::record_outcome(const BatchVm& vm, const TermResult& result, bool agent, Change& ch,
                                       BatchTally& t) {
  const auto& d = vm.domain;
  const std::string vm_id = d.label ? d.label->vm_id : std::string();
  const auto holder = holder_of(vm.unit_ids);
  auto row = terminations.row_of(vm);
  const std::string who = agent ? "finished by the agent: " : "";
  if (!result && result.error().code == error::Errc::unavailable) {
    t.unavailable = result.error().detail;
    say(LogLevel::warning, fmt::format("VM={} DOMAIN={} termination cut short, left pending for the agent to "
                                       "finish: {}",
                                       vm_id, d.uuid, result.error().detail));
    return;
  }
  if (result && result->terminated) {
    ch.audits.push_back(AuditDraft{
        "workload.terminate",
        holder,
        vm.unit_ids,
        {vm_id},
        "ok",
        fmt::format("{}spot VM {} (domain {}) is stopped: {}", who, vm_id, d.name, result->detail)});
    auto data =
        vm_json({d.label, d.uuid, d.name, vm.unit_ids}, {VmKey::vm_id, VmKey::domain_uuid, VmKey::unit_ids});
    data["reservationId"] = opt_str(holder);
    data["by"] = vm.record.by;
    data["auditId"] = vm.record.audit_id;
    data["reason"] = "capacity-reclaim";
    ch.events.push_back(EventDraft{"workload.terminated", std::move(data)});
    row.state = "done";
    ++t.ok;
    t.terminated.emplace_back(terminated_json(d, vm.unit_ids));
    say(LogLevel::info, fmt::format("VM={} DOMAIN={} terminated for capacity reclaim by {} ({}{})", vm_id,
                                    d.uuid, vm.record.by, who, result->detail));
  } else {
    const std::string why = result ? result->detail : result.error().detail;
    ch.audits.push_back(
        AuditDraft{"workload.terminate",
                   holder,
                   vm.unit_ids,
                   {vm_id},
                   "failed",
                   fmt::format("{}spot VM {} (domain {}) was not stopped: {}", who, vm_id, d.name, why)});
    row.state = "failed";
    ++t.failed;
    if (result || result.error().code != error::Errc::not_found)
      t.left.emplace_back(left_json(d, vm.unit_ids, "terminate-failed"));
    say(LogLevel::warning, fmt::format("VM={} DOMAIN={} terminate failed: {}", vm_id, d.uuid, why));
  }
  ch.terminations.push_back(std::move(row));
}

ApiResponse NodeService::Impl::finish(
    std::uint64_t id, std::vector<vmctl::TerminationOutcome> outcomes,
    const std::expected<std::vector<vmctl::Domain>, vmctl::VmError>& after) {
  auto taken = terminations.take(id);
  if (!taken) return internal_error("unknown termination batch");
  return std::get<ApiResponse>(carry_out(finished(std::move(*taken), std::move(outcomes), after)));
}

// A batch's outcomes as a decision: each VM's records and rows in one change, and the answer it
// gives once stored (a 503 when libvirt went away: not a final answer, not kept for Idempotency-Key
// replays); the outcomes count in gpunode_terminations_total once their records are stored.
Decision NodeService::Impl::finished(Batch b, std::vector<vmctl::TerminationOutcome> outcomes,
                                     const std::expected<std::vector<vmctl::Domain>, vmctl::VmError>& after) {
  const bool agent = b.kind == Batch::Kind::agent;
  Change ch{.actor = agent ? agent_caller() : b.caller,
            .request_id = agent ? std::nullopt : b.request_id,
            .at = now()};
  BatchTally t;
  t.left = b.left_running;
  for (std::size_t i = 0; i < b.vms.size(); ++i) {
    const auto& vm = b.vms[i];
    const TermResult result =
        i < outcomes.size() && outcomes[i].uuid == vm.domain.uuid
            ? outcomes[i].result
            : TermResult(std::unexpected(vmctl::VmError{error::Errc::internal, "no outcome"}));
    record_outcome(vm, result, agent, ch, t);
  }
  if (after) {
    const auto ws = occupants(*after);
    note_workloads(ws);
    vacate(ws, ch);
  }
  const bool changes = !ch.audits.empty() || !ch.upserts.empty();
  ApiResponse answer;
  if (t.unavailable) {
    json::object extra{{"terminated", std::move(t.terminated)}, {"leftRunning", std::move(t.left)}};
    answer = problem(503, "hypervisor-unavailable",
                     fmt::format("the hypervisor went away during the termination ({}); the VMs not listed "
                                 "are finished by the agent once it answers",
                                 *t.unavailable),
                     {}, &extra);
  } else {
    answer = answer_batch(b, std::move(t.terminated), std::move(t.left), ch.upserts);
    ch.idempotency = std::move(b.idempotency);  // the outcome and its idempotent answer: one commit
  }
  if (!changes && !ch.idempotency) return answer;
  return CommitThen{.change = std::move(ch),
                    .answer = std::move(answer),
                    .unstored_what = "the outcome could not be stored",
                    .unstored_after = "the agent records it once it can",
                    .terminations_ok = t.ok,
                    .terminations_failed = t.failed};
}

// The agent's own work after a fresh list: vacated reclaiming units, and pending terminations.
std::optional<Work> NodeService::Impl::observe(const std::vector<vmctl::Domain>& domains) {
  const auto ws = occupants(domains);
  note_workloads(ws);
  admitted.seen(domains);
  Change ch{.actor = agent_caller(), .at = now()};
  vacate(ws, ch);
  if (!ch.upserts.empty()) (void)carry_out(ch);
  Batch run, gone;
  run.kind = gone.kind = Batch::Kind::agent;
  std::vector<vmctl::TerminationOutcome> gone_outcomes;
  for (const auto& [seq, row] : terminations.pending()) {
    if (terminations.held(seq)) continue;
    boost::system::error_code ec;
    auto doc = json::parse(row.doc, ec);
    const json::object empty;
    const json::object& o = !ec && doc.is_object() ? doc.get_object() : empty;
    auto str = [&](const char* k) {
      return o.contains(k) && o.at(k).is_string() ? std::string(o.at(k).get_string()) : std::string();
    };
    std::vector<std::string> unit_ids;
    if (const auto* a = o.if_contains("unitIds"); a && a->is_array()) {
      for (const auto& u : a->get_array()) {
        if (u.is_string()) unit_ids.emplace_back(u.get_string());
      }
    }
    // What is left of its grace (CONTRACT §11): counted from when it was written ahead, so that a
    // restart never gives a VM more time than the caller granted.
    const auto granted =
        std::chrono::seconds(o.contains("grace") && o.at("grace").is_int64() ? o.at("grace").get_int64() : 0);
    const auto written = r::parse_time(str("at"));
    const auto grace =
        written ? std::clamp(std::chrono::duration_cast<std::chrono::seconds>(*written + granted - now()),
                             std::chrono::seconds(0), granted)
                : granted;
    vmctl::TerminationRecord record{"capacity-reclaim", str("at"), str("by"),
                                    store::format_audit_id(static_cast<std::uint64_t>(seq))};
    auto found = std::find_if(domains.begin(), domains.end(),
                              [&](const vmctl::Domain& d) { return d.uuid == row.domain_uuid; });
    if (found == domains.end() || !found->active()) {
      vmctl::Domain d = found == domains.end() ? vmctl::Domain{} : *found;
      d.uuid = row.domain_uuid;
      if (d.name.empty()) d.name = str("name");
      if (!d.label) d.label = vmctl::WorkloadLabel{str("vmId"), "", vmctl::Tier::spot};
      gone.vms.push_back(BatchVm{seq, d, unit_ids, record, grace});
      gone_outcomes.push_back(vmctl::TerminationOutcome{
          row.domain_uuid,
          vmctl::TerminateResult{
              true, found == domains.end() ? "the domain is gone" : "the domain is " + found->state}});
      continue;
    }
    run.vms.push_back(
        BatchVm{seq, *found, unit_ids, record, grace});  // terminate_spot_all refuses it if no longer spot
  }
  if (!gone.vms.empty()) {
    const auto id = terminations.start(std::move(gone));
    (void)finish(id, std::move(gone_outcomes),
                 std::unexpected(vmctl::VmError{error::Errc::internal, "not listed"}));
  }
  if (run.vms.empty()) return std::nullopt;
  return terminations.work(terminations.start(std::move(run)));
}

}  // namespace gpunode::service
