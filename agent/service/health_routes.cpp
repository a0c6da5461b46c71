// NodeService::Impl's unit health (CONTRACT §13): the poll (read, judge, commit what changed), the
// admin socket's routes (GET /v1/admin/health, GET /v1/admin/units/{unitId}/health, POST
// /v1/admin/units/{unitId}/health/clear as a decision) and the numbers /metrics shows.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpunode/discovery/json.hpp"
#include "gpunode/discovery/rules.hpp"
#include "gpunode/service/reservation_json.hpp"
#include "gpunode/text/printable.hpp"
#include "impl.hpp"

namespace gpunode::service {
using namespace detail;
namespace dh = discovery::health;

namespace {

// The 404 of a unit id that is not this node's (the admin socket's routes: nothing is hidden there).
ApiResponse no_such_unit() {
  return problem(404, "not-found", "no such unit on this node");
}

// What a unit is judged on, as a key: its id and members' addresses (a scan that changes it
// rebuilds the targets).
std::string membership(const Inventory& inventory) {
  std::string key;
  for (const auto& u : inventory.present()) {
    key += u.id + ":";
    for (const auto& m : u.devices) key += m.device.address.to_string() + ",";
    key += ";";
  }
  return key;
}

std::vector<std::pair<std::string, std::vector<health::Finding>>> findings_of(
    const std::vector<std::size_t>& targets, const std::vector<dh::Reading>& readings,
    std::map<std::string, std::vector<health::Finding>, std::less<>>& found) {
  std::vector<std::pair<std::string, std::vector<health::Finding>>> out;
  for (const auto i : targets) {
    if (i < readings.size()) out.emplace_back(readings[i].address, found[readings[i].address]);
  }
  return out;
}

json::value opt_int(const std::optional<int>& v) {
  return v ? json::value(*v) : json::value(nullptr);
}

json::value opt_count(const std::optional<std::uint64_t>& v) {
  return v ? json::value(*v) : json::value(nullptr);
}

// power_state as the last poll read it; nothing when it was not read (a function judged on neither
// link nor config) or could not be.
json::value power_json(const dh::Reading* r) {
  if (r == nullptr) return nullptr;
  if (!r->power_text.empty()) return json::value(r->power_text);
  return r->power == dh::Power::d0 ? json::value("D0") : json::value(nullptr);
}

}  // namespace

// ---- the targets and the poll ----------------------------------------------------------------------
void NodeService::Impl::refresh_health_targets() {
  auto key = membership(inventory);
  if (health.reader && key == health.built_for) return;
  if (!health.reader) health.reader = std::make_unique<dh::Reader>(opt.host_root);
  std::vector<dh::Target> all;
  std::map<std::string, std::size_t> index;
  health.unit_targets.clear();
  for (const auto& u : inventory.present()) {
    auto& mine = health.unit_targets[u.id];
    for (const auto& t :
         dh::targets_of(u, [&](const discovery::PciAddress& a) { return health.reader->parent_of(a); })) {
      auto [at, fresh] = index.emplace(t.address.to_string(), all.size());
      if (fresh) {
        all.push_back(t);
      } else {  // shared with another unit (a switch's port): judged as the most either needs
        all[at->second].gpu = all[at->second].gpu || t.gpu;
        all[at->second].link_judged = all[at->second].link_judged || t.link_judged;
      }
      mine.push_back(at->second);
    }
  }
  std::erase_if(health.memos, [&](const auto& m) { return !index.contains(m.first); });
  std::erase_if(health.errors_seen, [&](const auto& e) {
    return !index.contains(e.first.second) || !health.unit_targets.contains(e.first.first);
  });
  health.reader->watch(std::move(all));
  health.last.clear();
  health.built_for = std::move(key);
}

void NodeService::Impl::poll_health() {
  if (!health.enabled) return;
  refresh_health_targets();
  auto readings = health.reader->read();
  const auto& targets = health.reader->targets();
  const health::Time t = now();
  HealthRows rows;
  std::map<std::string, std::vector<health::Finding>, std::less<>> found;
  std::vector<health::Rises> rises(readings.size());
  for (std::size_t i = 0; i < readings.size() && i < targets.size(); ++i) {
    const auto& addr = readings[i].address;
    const auto kept = health.devices.find(addr);
    const health::DeviceState before = kept == health.devices.end() ? health::DeviceState{} : kept->second;
    auto dv = health::judge_device(before, health.memos[addr], readings[i], targets[i], t, health.settings);
    health.memos[addr] = std::move(dv.memo);
    if (kept == health.devices.end() || dv.state != before)
      rows.devices.emplace_back(addr, std::move(dv.state));
    found[addr] = std::move(dv.findings);
    rises[i] = dv.rises;
  }
  for (const auto& [addr, kept] : health.devices) {
    if (!found.contains(addr)) rows.devices_gone.push_back(addr);
  }
  for (const auto& [unit, mine] : health.unit_targets) {
    const auto kept = health.verdicts.find(unit);
    const health::Verdict before = kept == health.verdicts.end() ? health::Verdict{} : kept->second;
    auto after = health::judge_unit(before, findings_of(mine, readings, found), t);
    if (after != before) rows.units.emplace_back(unit, std::move(after));
  }
  health.last = std::move(readings);
  health.polled_at = t;
  bool stored = true;  // a poll that finds nothing new changes nothing: no commit, no revision, no event
  if (!rows.empty()) {
    Change c{.actor = agent_caller(), .at = t};
    auto said = add_health_change(c, std::move(rows), inventory, health);
    stored = carry_out(c).has_value();
    if (stored) {
      for (const auto& [level, line] : said) say(level, line);
    }
  }
  count_rises(rises, stored);
}

// gpunode_pcie_errors_total: what this poll saw rise, for each unit judged on the function. A
// fatal or non-fatal rise counts once its baseline is stored (else the next poll sees it again).
void NodeService::Impl::count_rises(const std::vector<health::Rises>& rises, bool stored) {
  for (const auto& [unit, mine] : health.unit_targets) {
    for (const auto i : mine) {
      if (i >= rises.size() || i >= health.last.size()) continue;
      auto& seen = health.errors_seen[{unit, health.last[i].address}];
      if (stored) {
        seen[0] += rises[i].fatal;
        seen[1] += rises[i].nonfatal;
      }
      seen[2] += rises[i].correctable;
    }
  }
}

void NodeService::Impl::health_gauges(metrics::NodeGauges& g) const {
  for (const auto& u : inventory.present())
    g.unit_failing.emplace_back(u.id, u.health.state() == discovery::HealthState::failing);
  for (const auto& [id, doc] : inventory.absent()) {
    if (inventory.find(id) != nullptr) continue;
    const auto* h = doc.if_contains("health");
    const auto* st = h != nullptr && h->is_object() ? h->get_object().if_contains("state") : nullptr;
    g.unit_failing.emplace_back(id, st != nullptr && st->is_string() && st->get_string() == "failing");
  }
  for (const auto& [key, counts] : health.errors_seen)
    g.pcie_errors.push_back({key.first, key.second, counts});
}

// ---- the admin socket's routes --------------------------------------------------------------------
json::object NodeService::Impl::unit_health_json(const discovery::Unit& u) const {
  json::array devices;
  const auto mine = health.unit_targets.find(u.id);
  for (const auto i : mine == health.unit_targets.end() ? std::vector<std::size_t>{} : mine->second) {
    const auto& t = health.reader->targets()[i];
    const auto* r = health.last_reading(t.address.to_string());
    const auto kept = health.devices.find(t.address.to_string());
    const auto member = std::find_if(u.devices.begin(), u.devices.end(),
                                     [&](const auto& m) { return m.device.address == t.address; });
    json::object d{{"pciAddress", t.address.to_string()},
                   {"role", member == u.devices.end() ? "upstream-port" : discovery::to_string(member->role)},
                   {"powerState", power_json(r)},
                   {"linkWidth", r ? opt_int(r->width) : nullptr},
                   {"maxLinkWidth", r ? opt_int(r->max_width) : nullptr},
                   {"widestLinkWidth", kept == health.devices.end() ? nullptr : opt_int(kept->second.widest)},
                   {"linkSpeed", nullptr}};
    // The speed is read now, for people: a poll reads it only for a narrow link (never judged).
    if (r != nullptr && r->power == dh::Power::d0 && t.link_judged) {
      if (auto speed = health.reader->speed(t.address)) d["linkSpeed"] = *speed;
    }
    d["aer"] = r && r->aer_monitored
                   ? json::value(json::object{{"fatal", opt_count(r->counts.fatal)},
                                              {"nonfatal", opt_count(r->counts.nonfatal)},
                                              {"correctable", opt_count(r->counts.correctable)}})
                   : json::value(nullptr);
    devices.emplace_back(std::move(d));
  }
  auto h = discovery::health_to_json(u.health);
  return json::object{
      {"unitId", u.id}, {"state", h["state"]}, {"reasons", h["reasons"]}, {"devices", devices}};
}

ApiResponse NodeService::Impl::health_answer() const {
  json::array units;
  for (const auto& u : inventory.present()) units.emplace_back(unit_health_json(u));
  return json_response(json::object{
      {"nodeId", opt.node_id},
      {"enabled", health.enabled},
      {"polledAt", health.polled_at ? json::value(r::format_time(*health.polled_at)) : json::value(nullptr)},
      {"units", std::move(units)}});
}

ApiResponse NodeService::Impl::unit_health_answer(std::string_view unit_id) const {
  const auto* u = inventory.find(unit_id);
  if (u == nullptr) return no_such_unit();
  return json_response(unit_health_json(*u));
}

// ---- POST /v1/admin/units/{unitId}/health/clear, as a decision ------------------------------------
namespace detail::routes {

Decision health_clear(const Facts& f, const ApiRequest& q, const Caller& c, const std::string& unit_id) {
  if (f.health == nullptr || !f.inventory.known(unit_id)) return no_such_unit();
  auto idem = f.ask.idempotency(q, c);
  if (!idem) return std::move(idem.error());
  const auto reason = reason_of(q.body, true);
  if (!reason) return reason.error();
  const HealthBook& book = *f.health;
  const auto was = book.unit_health(unit_id);
  // Every function the unit is judged on begins again from what it showed last.
  HealthRows rows;
  std::vector<std::pair<std::string, std::vector<health::Finding>>> standing;
  const auto mine = book.unit_targets.find(unit_id);
  for (const auto i : mine == book.unit_targets.end() ? std::vector<std::size_t>{} : mine->second) {
    const auto& t = book.reader->targets()[i];
    const auto* last = book.last_reading(t.address.to_string());
    dh::Reading none;  // never read: nothing kept but the address
    none.address = t.address.to_string();
    auto state = health::cleared(last ? *last : none);
    standing.emplace_back(none.address,
                          health::standing(state, {}, last ? *last : none, t, f.now, book.settings));
    rows.devices.emplace_back(none.address, std::move(state));
    rows.restart.push_back(none.address);
  }
  rows.units.emplace_back(unit_id, health::judge_unit({}, standing, f.now));
  std::vector<std::string> cleared;
  for (const auto& rsn : was.reasons) cleared.push_back(fmt::format("{} on {}", rsn.code, rsn.pci_address));
  const std::string detail = fmt::format(
      "cleared {}: {}", cleared.empty() ? "nothing" : fmt::format("{}", fmt::join(cleared, ", ")), **reason);
  Change ch{.actor = c, .request_id = q.request_id, .at = f.now, .idempotency = std::move(*idem)};
  ch.audits.push_back(AuditDraft{"unit.health-clear", std::nullopt, {unit_id}, {}, "ok", detail});
  const health::Verdict after = rows.units.front().second;
  add_health_change(ch, std::move(rows), f.inventory, book);
  json::object answer;
  if (const auto* u = f.inventory.find(unit_id)) {
    discovery::Unit now_unit = *u;
    discovery::apply_health(now_unit, health::unit_health(after, book.settings));
    answer = unit_json(f.node, f.reservations, now_unit, c.who);
  } else {
    answer = absent_unit_json(f.node, f.reservations, unit_id, *f.inventory.absent_doc(unit_id), c.who);
  }
  return CommitThen{
      .change = std::move(ch),
      .answer = json_response(answer),
      .log = text::printable(fmt::format("UNIT={} health cleared by {}: {}", unit_id, c.who.sub, detail))};
}

}  // namespace detail::routes

}  // namespace gpunode::service
