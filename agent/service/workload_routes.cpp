// NodeService::Impl's workload routes: workloads, occupancy, entitlement (capacity, admission), release.
#include <fmt/ranges.h>

#include <algorithm>

#include "gpunode/discovery/rules.hpp"
#include "gpunode/service/reservation_json.hpp"
#include "impl.hpp"

namespace gpunode::service {
using namespace detail;

// ---- workloads (CONTRACT §5, §7 Occupancy) -----------------------------------------------------
std::expected<std::vector<NodeService::Impl::Workload>, Outcome> NodeService::Impl::workloads_now(
    std::chrono::milliseconds max_age) {
  if (!has_hypervisor)
    return std::unexpected(problem(503, "hypervisor-unavailable", "no hypervisor is configured"));
  if (listing == nullptr)
    return std::unexpected(NeedsWorkloads{max_age});  // listed off this thread, then handled again
  const auto& list = listing->domains;
  if (!list) {
    say(LogLevel::warning, "hypervisor: " + list.error().message);
    return std::unexpected(
        problem(503, "hypervisor-unavailable",
                fmt::format("the hypervisor cannot be reached: {}", list.error().message)));
  }
  auto ws = occupants(*list);
  note_workloads(ws);
  admitted.seen(*list);
  return ws;
}

std::vector<NodeService::Impl::Workload> NodeService::Impl::occupants(std::vector<vmctl::Domain> list) const {
  const auto owner = inventory.unit_of_address();
  std::vector<Workload> out;
  for (auto& d : list) {
    std::set<std::string> ids;
    for (const auto& a : d.pci_addresses) {
      if (auto it = owner.find(a); it != owner.end()) ids.insert(it->second);
    }
    out.push_back(Workload{std::move(d), std::vector<std::string>(ids.begin(), ids.end())});
  }
  std::sort(out.begin(), out.end(),
            [](const Workload& a, const Workload& b) { return a.domain.name < b.domain.name; });
  return out;
}

json::object NodeService::Impl::workload_json(const Workload& w) {
  const auto& d = w.domain;
  return json::object{
      {"vmId", d.label ? json::value(d.label->vm_id) : json::value(nullptr)},
      {"domainUuid", d.uuid},
      {"name", d.name},
      {"org", d.label ? json::value(d.label->org) : json::value(nullptr)},
      {"tier", d.label ? json::value(vmctl::to_string(d.label->tier)) : json::value(nullptr)},
      {"state", d.state},
      {"unitIds", strings_json(w.unit_ids)},
      {"terminationReason", d.termination ? json::value(d.termination->reason) : json::value(nullptr)}};
}

Outcome NodeService::Impl::workloads(const Caller& c) {
  if (!allowed(r::Action::list_workloads, c))
    return forbidden("workloads are listed for operators and the owner");
  auto ws = workloads_now();
  if (!ws) return ws.error();
  json::array list;
  for (const auto& w : *ws) list.emplace_back(workload_json(w));
  return json_response(json::object{{"nodeId", opt.node_id}, {"workloads", std::move(list)}});
}

// Occupancy of `checked` units once the term has started: a workload that is not spot, of an
// org outside the audience (or unlabelled), blocks (409 unit-occupied); spot workloads are
// allowed and listed.
std::optional<Outcome> NodeService::Impl::check_occupancy(const r::Reservation& x,
                                                          const std::vector<std::string>& checked, r::Time t,
                                                          json::array& spot) {
  if (x.starts_at > t || checked.empty()) return std::nullopt;
  auto ws = workloads_now(kOccupancyListAge);
  if (!ws) return ws.error();
  // Active domains hold their units; so do those the hook let through that are still starting
  // (the start race, CONTRACT §9): libvirt lists them only once they run.
  std::vector<const Workload*> holding;
  for (const auto& w : *ws) {
    if (w.domain.active()) holding.push_back(&w);
  }
  std::vector<Workload> starting;
  for (const auto& [uuid, e] : admitted.starting(clock())) starting.push_back(Workload{e.domain, e.unit_ids});
  for (const auto& w : starting) holding.push_back(&w);
  json::array blockers;
  for (const auto* held : holding) {
    const auto& w = *held;
    if (std::none_of(w.unit_ids.begin(), w.unit_ids.end(), [&](const std::string& u) {
          return std::find(checked.begin(), checked.end(), u) != checked.end();
        })) {
      continue;
    }
    const auto& label = w.domain.label;
    if (label && label->tier == vmctl::Tier::spot) {
      spot.emplace_back(json::object{{"vmId", label->vm_id},
                                     {"domainUuid", w.domain.uuid},
                                     {"name", w.domain.name},
                                     {"org", label->org},
                                     {"unitIds", strings_json(w.unit_ids)}});
      continue;
    }
    if (label && std::find(x.audience_org_ids.begin(), x.audience_org_ids.end(), label->org) !=
                     x.audience_org_ids.end())
      continue;
    blockers.emplace_back(json::object{{"vmId", label ? json::value(label->vm_id) : json::value(nullptr)},
                                       {"domainUuid", w.domain.uuid},
                                       {"name", w.domain.name}});
  }
  if (blockers.empty()) return std::nullopt;
  json::object extra{{"workloads", blockers}};
  return problem(409, "unit-occupied", "workloads of orgs outside the audience are running on the units", {},
                 &extra);
}

// ---- entitlement (CONTRACT §4 capacity and admission): the rule is reservations::entitled ----
// CONTRACT §9 "What the hook cannot see": every active domain of a listing judged by the
// entitlement table, as the hook's admission judges a start. A domain on a unit it is not entitled
// to (a hostdev hot-plugged, a reservation started under it, a start while mode was audit or off or
// the agent down) gives one workload.unentitled event and a warning line when first found, and
// counts in gpunode_unentitled_workloads while it stays. The agent never stops it. A spot domain on
// a unit its reservation is reclaiming is not counted: it is there on the reclaim's own terms,
// within its managers' reach until it goes.
void NodeService::Impl::judge_workloads(const std::vector<Workload>& ws) {
  if (judging) return;  // its own commit (events only) calls back through commit()
  judging = true;
  struct Done {
    bool& flag;
    ~Done() { flag = false; }
  } done{judging};
  if (&ws != &last_workloads) last_workloads = ws;
  std::map<std::string, json::object> found;
  Change ch{.actor = agent_caller(), .at = now()};
  std::vector<std::string> fresh;
  for (const auto& w : ws) {
    const auto& d = w.domain;
    if (!d.active() || w.unit_ids.empty() || d.uuid.empty()) continue;
    const std::string org = d.label ? d.label->org : std::string();
    const auto tier = d.label ? d.label->tier : vmctl::Tier::on_demand;
    json::array reasons;
    for (const auto& u : w.unit_ids) {
      const auto e = entitled(org, tier, u);
      if (e.allowed()) continue;
      if (tier == vmctl::Tier::spot) {
        const auto* holder = r::active_holder(all_reservations(), u);
        if (holder != nullptr &&
            std::find(holder->reclaiming_unit_ids.begin(), holder->reclaiming_unit_ids.end(), u) !=
                holder->reclaiming_unit_ids.end()) {
          continue;
        }
      }
      reasons.emplace_back(json::object{{"code", e.code}, {"message", e.message}, {"unitId", u}});
    }
    if (reasons.empty()) continue;
    json::object data{{"name", d.name},
                      {"domainUuid", d.uuid},
                      {"vmId", d.label ? json::value(d.label->vm_id) : json::value(nullptr)},
                      {"org", org.empty() ? json::value(nullptr) : json::value(org)},
                      {"tier", vmctl::to_string(tier)},
                      {"unitIds", strings_json(w.unit_ids)},
                      {"reasons", reasons}};
    if (!unentitled_reported.contains(d.uuid)) {
      std::vector<std::string> why;
      for (const auto& rv : reasons) {
        const auto& o = rv.get_object();
        why.push_back(fmt::format("{}: {}", std::string(o.at("unitId").get_string()),
                                  std::string(o.at("code").get_string())));
      }
      say(LogLevel::warning, fmt::format("DOMAIN={} {} ({} {}) runs on units it is not entitled to, which "
                                         "the hook never saw it start on; "
                                         "the agent leaves it running: {}",
                                         d.name, d.uuid, vmctl::to_string(tier),
                                         org.empty() ? "unlabelled" : "of " + org, fmt::join(why, "; ")));
      ch.events.push_back(EventDraft{"workload.unentitled", data});
      fresh.push_back(d.uuid);
    }
    found.emplace(d.uuid, std::move(data));
  }
  unentitled = std::move(found);
  std::erase_if(unentitled_reported, [&](const std::string& uuid) { return !unentitled.contains(uuid); });
  // Reported once stored; an event that could not be stored is tried again at the next listing.
  if (!ch.events.empty() && commit(ch)) unentitled_reported.insert(fresh.begin(), fresh.end());
}

// GET /v1/admin/unentitled (admin socket): the last listing's unentitled domains, for gpunodectl.
ApiResponse NodeService::Impl::unentitled_route() const {
  json::array out;
  for (const auto& [uuid, data] : unentitled) out.emplace_back(data);
  return json_response(json::object{{"workloads", std::move(out)}});
}

r::Entitlement NodeService::Impl::entitled(const std::string& org, vmctl::Tier tier,
                                           const std::string& unit_id) const {
  return r::entitled(org, tier, unit_id, inventory.facts(unit_id), all_reservations(), opt.node_id);
}

ApiResponse NodeService::Impl::admission(const ApiRequest& q, const Caller& c) {
  if (!allowed(r::Action::ask_admission, c))
    return forbidden("admission is answered for platform admins and operators");
  // A POST: an Idempotency-Key replays the first answer (CONTRACT §4 Conventions), even though
  // the question changes nothing.
  std::optional<IdempotencyDraft> idem;
  if (auto replay = idempotent_replay(q, c, idem)) return *replay;
  auto body = parse_object(q.body, false);
  if (!body) return body.error();
  Fields f(*body, {"orgId", "tier", "unitIds"});
  auto org = f.string("orgId");
  auto tier = f.string("tier");
  auto ids = f.strings("unitIds");
  if (!body->contains("orgId")) f.problems().push_back({"orgId", "is required"});
  if (!body->contains("tier")) f.problems().push_back({"tier", "is required"});
  if (!ids || ids->empty()) {
    if (std::none_of(f.problems().begin(), f.problems().end(),
                     [](const FieldProblem& p) { return p.field == "unitIds"; })) {
      f.problems().push_back({"unitIds", "must name at least one unit"});
    }
  }
  if (!f.problems().empty())
    return problem(400, "invalid-request", "the body is not a valid admission request", f.problems());
  json::array reasons;
  auto parsed = vmctl::parse_tier(*tier);
  if (!parsed) {
    reasons.emplace_back(
        json::object{{"code", "invalid-tier"},
                     {"message", fmt::format("tier must be spot, on-demand or reserved, not \"{}\"", *tier)},
                     {"unitId", nullptr}});
  } else {
    for (const auto& id : *ids) {
      auto e = entitled(*org, *parsed, id);
      if (!e.allowed())
        reasons.emplace_back(json::object{{"code", e.code}, {"message", e.message}, {"unitId", id}});
    }
  }
  auto answer = json_response(json::object{{"allowed", reasons.empty()}, {"reasons", std::move(reasons)}});
  if (!idem) return answer;
  Change keep{.actor = c,
              .request_id = q.request_id,
              .at = now(),
              .idempotency = std::move(idem)};  // the answer alone: no revision moves
  return commit_response(keep, std::move(answer));
}

// ---- the libvirt hook's admission (CONTRACT §9) ---------------------------------------------------
namespace {

// One reason in domain-admission's answer.
void add_refusal(json::array& reasons, std::string code, std::string message,
                 const std::optional<std::string>& unit) {
  reasons.emplace_back(json::object{{"code", std::move(code)},
                                    {"message", std::move(message)},
                                    {"unitId", unit ? json::value(*unit) : json::value(nullptr)}});
}

}  // namespace

// The units a domain's PCI hostdevs are members of. A hostdev that is a GPU of no unit, a device
// discovery never saw, or an address that cannot be read, adds an unknown-unit reason: nothing
// unaccounted for reaches a guest.
std::vector<std::string> NodeService::Impl::hostdev_units(const vmctl::DomainXmlFacts& facts,
                                                          json::array& reasons) const {
  std::set<std::string> unit_set;
  auto refuse = [&](std::string code, std::string message, const std::optional<std::string>& unit) {
    add_refusal(reasons, std::move(code), std::move(message), unit);
  };
  const auto owner = inventory.unit_of_address();
  for (const auto& a : facts.pci_addresses) {
    if (auto it = owner.find(a); it != owner.end()) {
      unit_set.insert(it->second);
      continue;
    }
    // Not a unit's: read what the function is (one small sysfs file, only for such hostdevs).
    const auto cls = discovery::pci_class_of(opt.host_root, a);
    if (!cls) {
      refuse("unknown-unit", fmt::format("hostdev {} is no PCI function of node {}", a, opt.node_id),
             std::nullopt);
    } else if (discovery::is_gpu_class(*cls)) {
      refuse("unknown-unit", fmt::format("hostdev {} is a GPU of no unit of node {}", a, opt.node_id),
             std::nullopt);
    }  // else not a GPU (a NIC, a disk controller): not the agent's to decide
  }
  if (facts.unreadable_pci_hostdevs > 0) {
    refuse("unknown-unit",
           fmt::format("{} PCI hostdev(s) without a readable source address", facts.unreadable_pci_hostdevs),
           std::nullopt);
  }
  return {unit_set.begin(), unit_set.end()};
}

// A refusal (or, in audit mode, what would have been one): the warning line, and a workload.refused
// event. The refusal stands even if it cannot be stored: the event is lost, the log line is not.
void NodeService::Impl::report_refusal(const ApiRequest& q, const vmctl::DomainXmlFacts& facts,
                                       const std::vector<std::string>& unit_ids, const json::array& reasons) {
  const auto mode = opt.enforcement;
  const std::string org = facts.label ? facts.label->org : std::string();
  const auto tier = facts.label ? facts.label->tier : vmctl::Tier::on_demand;
  const std::string name = facts.name.empty() ? "(unnamed)" : facts.name;
  std::vector<std::string> why;
  for (const auto& rv : reasons) {
    const auto& o = rv.get_object();
    why.push_back(fmt::format(
        "{}: {}", o.at("unitId").is_string() ? std::string(o.at("unitId").get_string()) : std::string("-"),
        std::string(o.at("code").get_string())));
  }
  say(LogLevel::warning,
      fmt::format("DOMAIN={} {} refused{} ({} {}): {}", name, facts.uuid,
                  mode == config::EnforcementMode::audit ? " (audit mode: let start)" : "",
                  vmctl::to_string(tier), org.empty() ? "unlabelled" : "of " + org, fmt::join(why, "; ")));
  Change c{.actor = agent_caller(), .request_id = q.request_id, .at = now()};
  c.events.push_back(
      EventDraft{"workload.refused",
                 json::object{{"name", facts.name},
                              {"domainUuid", facts.uuid},
                              {"vmId", facts.label ? json::value(facts.label->vm_id) : json::value(nullptr)},
                              {"org", org.empty() ? json::value(nullptr) : json::value(org)},
                              {"tier", vmctl::to_string(tier)},
                              {"unitIds", strings_json(unit_ids)},
                              {"reasons", reasons},
                              {"mode", config::to_string(mode)}}});
  (void)commit(c);
}

// The domain's units are those its PCI hostdevs belong to; its org and tier come from its label
// (unlabelled: on-demand of no org). Allowed exactly when entitled to every unit. A hostdev that
// is a GPU of no unit, a device discovery never saw, or an address that cannot be read, is
// unknown-unit: nothing unaccounted for reaches a guest.
ApiResponse NodeService::Impl::domain_admission(const ApiRequest& q) {
  auto body = parse_object(q.body, false);
  if (!body) return body.error();
  Fields f(*body, {"domainXml"});
  auto xml = f.string("domainXml");
  if (!body->contains("domainXml")) f.problems().push_back({"domainXml", "is required"});
  if (!f.problems().empty())
    return problem(400, "invalid-request", "the body is not a valid domain admission request", f.problems());
  const auto facts = vmctl::parse_domain_xml(*xml);
  if (!facts.is_domain) {
    return problem(400, "invalid-request", "domainXml is not a libvirt domain definition",
                   {{"domainXml", "must be <domain> XML"}});
  }
  const auto mode = opt.enforcement;
  const std::string org = facts.label ? facts.label->org : std::string();
  const auto tier = facts.label ? facts.label->tier : vmctl::Tier::on_demand;
  json::array reasons;
  const std::vector<std::string> unit_ids = hostdev_units(facts, reasons);
  if (mode == config::EnforcementMode::off) {
    return json_response(json::object{
        {"allowed", true}, {"mode", "off"}, {"unitIds", strings_json(unit_ids)}, {"reasons", json::array{}}});
  }
  for (const auto& u : unit_ids) {
    if (auto e = entitled(org, tier, u); !e.allowed()) add_refusal(reasons, e.code, e.message, u);
  }
  const bool allowed = reasons.empty();
  if (allowed || mode == config::EnforcementMode::audit) {
    // It will start: until libvirt lists it running, a create must see it on its units.
    vmctl::Domain d{facts.uuid, facts.name, "starting", facts.pci_addresses, facts.label, std::nullopt};
    if (!facts.uuid.empty() && !unit_ids.empty()) admitted.admit(std::move(d), unit_ids, clock());
  }
  if (allowed) {
    counted.count_admission(metrics::Admission::allowed);
  } else {
    counted.count_admission(mode == config::EnforcementMode::audit ? metrics::Admission::audit_refused
                                                                   : metrics::Admission::refused);
    report_refusal(q, facts, unit_ids, reasons);
  }
  return json_response(json::object{{"allowed", allowed},
                                    {"mode", config::to_string(mode)},
                                    {"unitIds", strings_json(unit_ids)},
                                    {"reasons", std::move(reasons)}});
}

// ---- release (CONTRACT §4) -----------------------------------------------------------------------
ApiResponse NodeService::Impl::release(const ApiRequest& q, const Caller& c, const r::Reservation& current) {
  if (!allowed(r::Action::release, c, &current))
    return forbidden("only a platform admin or a managing org releases units");
  std::optional<IdempotencyDraft> idem;
  if (auto replay = idempotent_replay(q, c, idem)) return *replay;
  auto body = parse_object(q.body, false);
  if (!body) return body.error();
  Fields f(*body, {"unitIds"});
  auto ids = f.strings("unitIds");
  if (!ids || ids->empty()) {
    if (f.problems().empty()) f.problems().push_back({"unitIds", "must name at least one unit"});
  }
  if (!f.problems().empty())
    return problem(400, "invalid-request", "the body is not a valid release request", f.problems());
  if (current.state != r::State::active)
    return problem(409, "reservation-not-active", "units are released only from an active reservation");
  if (auto unknown = units_not_held(current, *ids)) return *unknown;
  r::Reservation x = current;
  std::vector<std::string> newly;
  for (const auto& u : *ids) {
    if (std::find(x.released_unit_ids.begin(), x.released_unit_ids.end(), u) != x.released_unit_ids.end())
      continue;
    if (std::find(newly.begin(), newly.end(), u) != newly.end()) continue;
    newly.push_back(u);
    x.released_unit_ids.push_back(u);
    std::erase(x.reclaiming_unit_ids, u);
  }
  if (newly.empty()) {  // already released: a no-op, answered like a change (with its ETag)
    auto answer = with_header(json_response(json::object{{"reservation", to_json(current)}}), "ETag",
                              etag_of_version(current.version));
    if (!idem) return answer;
    // Its Idempotency-Key keeps this answer too: a retry (after a lost answer or a crash) must
    // replay it, not release again once the units were reclaimed meanwhile. The answer alone is
    // stored; no revision moves.
    Change keep{.actor = c, .request_id = q.request_id, .at = now(), .idempotency = std::move(idem)};
    return commit_response(keep, std::move(answer));
  }
  std::sort(x.released_unit_ids.begin(), x.released_unit_ids.end());
  const r::Time t = now();
  x.version += 1;
  x.updated_at = t;
  Change ch{.actor = c, .request_id = q.request_id, .at = t, .upserts = {x}, .idempotency = std::move(idem)};
  ch.audits.push_back(AuditDraft{"units.release", x.id, newly, {}, "ok", std::nullopt});
  ch.events.push_back(
      EventDraft{"units.released", json::object{{"reservationId", x.id}, {"unitIds", strings_json(newly)}}});
  return commit_response(ch, with_header(json_response(json::object{{"reservation", to_json(x)}}), "ETag",
                                         etag_of_version(x.version)));
}

}  // namespace gpunode::service
