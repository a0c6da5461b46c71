// NodeService::Impl's workload routes: GET workloads, entitlement of what runs (unentitled domains)
// and of what starts (the hook's domain admission).
#include <fmt/ranges.h>

#include <algorithm>

#include "gpunode/discovery/rules.hpp"
#include "gpunode/service/reservation_json.hpp"
#include "impl.hpp"

namespace gpunode::service {
using namespace detail;

json::object detail::vm_json(const VmRef& vm, std::initializer_list<VmKey> keys) {
  const auto& label = vm.label;
  json::object o;
  for (const auto key : keys) {
    switch (key) {
      case VmKey::vm_id:
        o["vmId"] = label ? json::value(label->vm_id) : json::value(nullptr);
        break;
      case VmKey::domain_uuid:
        o["domainUuid"] = vm.uuid;
        break;
      case VmKey::name:
        o["name"] = vm.name;
        break;
      case VmKey::org:
        o["org"] = label ? json::value(label->org) : json::value(nullptr);
        break;
      case VmKey::tier:
        o["tier"] = label ? json::value(vmctl::to_string(label->tier)) : json::value(nullptr);
        break;
      case VmKey::unit_ids:
        o["unitIds"] = strings_json(vm.unit_ids);
        break;
    }
  }
  return o;
}

// ---- workloads (CONTRACT §5) ---------------------------------------------------------------------
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
  auto o = vm_json({d.label, d.uuid, d.name, w.unit_ids},
                   {VmKey::vm_id, VmKey::domain_uuid, VmKey::name, VmKey::org, VmKey::tier});
  o["state"] = d.state;
  o["unitIds"] = strings_json(w.unit_ids);
  o["terminationReason"] = d.termination ? json::value(d.termination->reason) : json::value(nullptr);
  return o;
}

// GET workloads: the list kept current by the hypervisor's events, or one listed for this request.
Outcome NodeService::Impl::workloads(const Asks& asks, const Caller& c) {
  if (!allowed(r::Action::list_workloads, c))
    return forbidden("workloads are listed for operators and the owner");
  auto ws = asks.workloads(kAnyListAge);
  if (!ws) return std::visit([](auto&& v) -> Outcome { return std::move(v); }, std::move(ws.error()));
  json::array list;
  for (const auto& w : **ws) list.emplace_back(workload_json(w));
  return detail::workloads_answer(opt.node_id, std::move(list));
}

// ---- entitlement (CONTRACT §4 capacity and admission): the rule is reservations::entitled ----
// CONTRACT §9 "What the hook cannot see": every active domain of a listing judged by the
// entitlement table, as the hook's admission judges a start. A domain on a unit it is not entitled
// to (a hostdev hot-plugged, a reservation started under it, a start while mode was audit or off or
// the agent down) gives one workload.unentitled event and a warning line when first found, and
// counts in gpunode_unentitled_workloads while it stays. The agent never stops it. A spot domain on
// a unit its reservation is reclaiming is not counted: it is there on the reclaim's own terms,
// within its managers' reach until it goes. Judging changes nothing: rejudge() stores its events.
NodeService::Impl::Judged NodeService::Impl::judged(const std::vector<Workload>& ws) const {
  Judged j{.unentitled = {}, .events = Change{.actor = agent_caller(), .at = now()}, .fresh = {}};
  for (const auto& w : ws) {
    const auto& d = w.domain;
    if (!d.active() || w.unit_ids.empty() || d.uuid.empty()) continue;
    const std::string org = d.label ? d.label->org : std::string();
    const auto tier = d.label ? d.label->tier : vmctl::Tier::on_demand;
    json::array reasons;
    for (const auto& u : w.unit_ids) {
      const auto e = entitled(org, tier, u, false);  // health refuses new starts only (CONTRACT §13)
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
    auto data =
        vm_json({d.label, d.uuid, d.name, w.unit_ids}, {VmKey::name, VmKey::domain_uuid, VmKey::vm_id});
    data["org"] = org.empty() ? json::value(nullptr) : json::value(org);
    data["tier"] = vmctl::to_string(tier);
    data["unitIds"] = strings_json(w.unit_ids);
    data["reasons"] = reasons;
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
      j.events.events.push_back(EventDraft{"workload.unentitled", data});
      j.fresh.push_back(d.uuid);
    }
    j.unentitled.emplace(d.uuid, std::move(data));
  }
  return j;
}

// The last listing judged again (at every listing, and after every change that moved reservations:
// entitlement moves with them). Its events carry no reservation, so storing them moves no
// entitlement: they are stored through `state` directly, never through carry_out, and nothing
// re-enters the committer.
void NodeService::Impl::rejudge() {
  auto j = judged(last_workloads);
  unentitled = std::move(j.unentitled);
  std::erase_if(unentitled_reported, [&](const std::string& uuid) { return !unentitled.contains(uuid); });
  if (j.events.events.empty()) return;
  // Reported once stored; an event that could not be stored is tried again at the next listing.
  if (auto stored = state.apply(j.events, clock()); stored)
    unentitled_reported.insert(j.fresh.begin(), j.fresh.end());
  else
    say(LogLevel::error, fmt::format("state commit failed: {}", stored.error().to_string()));
}

// GET /v1/admin/unentitled (admin socket): the last listing's unentitled domains, for gpunodectl.
ApiResponse NodeService::Impl::unentitled_route() const {
  json::array out;
  for (const auto& [uuid, data] : unentitled) out.emplace_back(data);
  return json_response(json::object{{"workloads", std::move(out)}});
}

r::Entitlement NodeService::Impl::entitled(const std::string& org, vmctl::Tier tier,
                                           const std::string& unit_id, bool count_health) const {
  return r::entitled(org, tier, unit_id, inventory.facts(unit_id, count_health), all_reservations(),
                     opt.node_id);
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

// A refusal (or, in audit mode, what would have been one): the warning line, and the change that
// stores its workload.refused event.
NodeService::Impl::Change NodeService::Impl::refusal(const ApiRequest& q, const vmctl::DomainXmlFacts& facts,
                                                     const std::vector<std::string>& unit_ids,
                                                     const json::array& reasons) const {
  const auto mode = state.enforcement();
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
  auto data = vm_json({facts.label, facts.uuid, facts.name, unit_ids},
                      {VmKey::name, VmKey::domain_uuid, VmKey::vm_id});
  data["org"] = org.empty() ? json::value(nullptr) : json::value(org);
  data["tier"] = vmctl::to_string(tier);
  data["unitIds"] = strings_json(unit_ids);
  data["reasons"] = reasons;
  data["mode"] = config::to_string(mode);
  c.events.push_back(EventDraft{"workload.refused", std::move(data)});
  return c;
}

// The domain's units are those its PCI hostdevs belong to; its org and tier come from its label
// (unlabelled: on-demand of no org). Allowed exactly when entitled to every unit. A hostdev that
// is a GPU of no unit, a device discovery never saw, or an address that cannot be read, is
// unknown-unit: nothing unaccounted for reaches a guest.
ApiResponse NodeService::Impl::domain_admission(const ApiRequest& q) {
  return std::get<ApiResponse>(carry_out(admission_decision(q)));
}

// The answer, and with a refusal the change that stores its event: the refusal stands even if that
// cannot be stored (the event is lost, the log line is not).
Decision NodeService::Impl::admission_decision(const ApiRequest& q) {
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
  const auto mode = state.enforcement();
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
  std::optional<Change> refused;
  if (allowed) {
    counted.count_admission(metrics::Admission::allowed);
  } else {
    counted.count_admission(mode == config::EnforcementMode::audit ? metrics::Admission::audit_refused
                                                                   : metrics::Admission::refused);
    refused = refusal(q, facts, unit_ids, reasons);
  }
  auto answer = json_response(json::object{{"allowed", allowed},
                                           {"mode", config::to_string(mode)},
                                           {"unitIds", strings_json(unit_ids)},
                                           {"reasons", std::move(reasons)}});
  if (!refused) return answer;
  return CommitThen{.change = std::move(*refused), .answer = std::move(answer), .answer_anyway = true};
}

}  // namespace gpunode::service
