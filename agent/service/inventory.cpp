// The node's units (see inventory.hpp).
#include "inventory.hpp"

#include <algorithm>
#include <set>

#include "gpunode/discovery/json.hpp"
#include "gpunode/discovery/rules.hpp"
#include "gpunode/store/audit_chain.hpp"
#include "gpunode/store/canonical_json.hpp"

namespace gpunode::service::detail {
namespace json = boost::json;

const discovery::Unit* Inventory::find(std::string_view id) const {
  auto it = std::lower_bound(present_.begin(), present_.end(), id,
                             [](const discovery::Unit& u, std::string_view k) { return u.id < k; });
  return it != present_.end() && it->id == id ? &*it : nullptr;
}

const json::object* Inventory::absent_doc(std::string_view id) const {
  auto it = absent_.find(id);
  return it == absent_.end() ? nullptr : &it->second;
}

std::vector<std::string> Inventory::ids() const {
  std::vector<std::string> out;
  out.reserve(present_.size() + absent_.size());
  for (const auto& u : present_) out.push_back(u.id);
  for (const auto& [id, doc] : absent_) out.push_back(id);
  return out;
}

reservations::UnitFacts Inventory::facts(std::string_view id, bool health) const {
  reservations::UnitFacts facts;
  if (const auto* u = find(id)) {
    facts.presence = reservations::UnitFacts::Presence::present;
    discovery::Unit without;  // the unit as if nothing were failing
    if (!health && u->health.state() == discovery::HealthState::failing) {
      without = *u;
      discovery::apply_health(without, {});
      u = &without;
    }
    facts.sellable = u->sellable;
    for (const auto& rs : u->reasons) facts.not_sellable_codes.push_back(rs.code);
  } else if (absent_doc(id) != nullptr) {
    facts.presence = reservations::UnitFacts::Presence::absent;
  }
  return facts;
}

std::map<std::string, std::string> Inventory::unit_of_address() const {
  std::map<std::string, std::string> out;
  for (const auto& u : present_) {
    for (const auto& m : u.devices) out[m.device.address.to_string()] = u.id;
  }
  for (const auto& [id, doc] : absent_) {  // stored JSON: read without throwing
    const auto* ds = doc.if_contains("devices");
    if (ds == nullptr || !ds->is_array()) continue;
    for (const auto& d : ds->get_array()) {
      if (const auto* a = d.is_object() ? d.get_object().if_contains("pciAddress") : nullptr;
          a && a->is_string()) {
        out.emplace(std::string(a->get_string()), id);
      }
    }
  }
  return out;
}

InventoryScan Inventory::scan(
    std::vector<discovery::Unit> fresh, const std::vector<std::string>& stored_present,
    const std::function<std::optional<json::object>(const std::string&)>& stored_doc) const {
  InventoryScan out;
  std::set<std::string> fresh_ids;
  for (const auto& u : fresh) fresh_ids.insert(u.id);

  // Units seen before (present last time, or stored as present) that are gone now become absent.
  std::set<std::string> known(stored_present.begin(), stored_present.end());
  for (const auto& u : present_) known.insert(u.id);
  for (const auto& id : known) {
    if (fresh_ids.contains(id) || absent_.contains(id)) continue;
    json::object doc;
    if (const auto* u = find(id)) {
      doc = discovery::unit_to_json(*u);
    } else if (auto stored = stored_doc(id)) {
      doc = std::move(*stored);
    }
    if (doc.empty()) continue;
    auto& reasons = doc["notReservableReasons"];
    if (!reasons.is_array()) reasons = json::array{};
    reasons.get_array().emplace_back(
        json::object{{"code", "absent"}, {"message", "the unit was seen before and is gone now"}});
    doc["reservable"] = false;
    doc["sellable"] = false;
    out.newly_absent.emplace(id, std::move(doc));
  }
  for (const auto& u : fresh) {
    if (absent_.contains(u.id)) out.back.push_back(u.id);
  }

  out.next.present_ = std::move(fresh);
  out.next.absent_ = absent_;
  for (const auto& [id, doc] : out.newly_absent) out.next.absent_.insert_or_assign(id, doc);
  for (const auto& id : out.back) out.next.absent_.erase(id);
  out.digest = out.next.digest();
  return out;
}

std::string Inventory::digest() const {
  // The full answer: what discovery says (reservationIds empty), then the absent units.
  json::array full;
  for (const auto& u : present_) full.emplace_back(discovery::unit_to_json(u));
  for (const auto& [id, doc] : absent_) {
    if (find(id) == nullptr) full.emplace_back(doc);
  }
  auto canon = store::canonical_json(full);
  return canon ? store::sha256_hex(*canon).value_or("") : "";
}

Inventory Inventory::with_health(
    const std::function<discovery::UnitHealth(std::string_view)>& health_of) const {
  Inventory out = *this;
  for (auto& u : out.present_) discovery::apply_health(u, health_of(u.id));
  return out;
}

}  // namespace gpunode::service::detail
