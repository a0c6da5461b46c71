// The node's units as the agent knows them: present (what discovery reads now) and absent (seen
// before, gone now, kept with their last JSON). Private to gpunode_service. A value: a scan builds
// the next inventory beside the current one, and the service adopts it once the store committed
// the change.
#pragma once

#include <boost/json.hpp>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/discovery/model.hpp"
#include "gpunode/reservations/entitlement.hpp"

namespace gpunode::service::detail {

struct InventoryScan;

class Inventory {
 public:
  const std::vector<discovery::Unit>& present() const { return present_; }  // sorted by id
  using AbsentMap = std::map<std::string, boost::json::object, std::less<>>;
  const AbsentMap& absent() const { return absent_; }  // last seen JSON, `absent` applied

  const discovery::Unit* find(std::string_view id) const;
  const boost::json::object* absent_doc(std::string_view id) const;
  bool known(std::string_view id) const { return find(id) != nullptr || absent_doc(id) != nullptr; }
  std::vector<std::string> ids() const;  // present, then absent
  // What the entitlement table needs to know about a unit. `health`: its failing health codes count
  // (a new start); without, they do not (a VM already running: health never makes it unentitled).
  reservations::UnitFacts facts(std::string_view id, bool health = true) const;
  // Every unit's member PCI addresses, present and absent units alike: address -> unit id.
  std::map<std::string, std::string> unit_of_address() const;

  void set_absent(const std::map<std::string, boost::json::object>& absent) {
    absent_ = AbsentMap(absent.begin(), absent.end());
  }

  // The same units, each present one with the health `health_of` gives it (CONTRACT §13).
  Inventory with_health(
      const std::function<discovery::UnitHealth(std::string_view unit_id)>& health_of) const;
  // The digest of the full answer (present units as discovery reads them, then the absent ones):
  // what the store keeps to tell whether inventory.changed is due.
  std::string digest() const;

  // What a discovery pass changes. `fresh` is what discovery reads now; `stored_present` the
  // units the store holds as present (read on the first scan after a start: a unit gone while
  // the agent was down becomes absent too); `stored_doc` a stored unit's JSON.
  InventoryScan scan(
      std::vector<discovery::Unit> fresh, const std::vector<std::string>& stored_present,
      const std::function<std::optional<boost::json::object>(const std::string&)>& stored_doc) const;

 private:
  std::vector<discovery::Unit> present_;
  AbsentMap absent_;
};

struct InventoryScan {
  Inventory next;
  std::map<std::string, boost::json::object> newly_absent;
  std::vector<std::string> back;  // absent units present again
  std::string digest;             // of the full answer (present and absent), canonical
  bool changed(std::string_view stored_digest) const {
    return digest != stored_digest || !newly_absent.empty() || !back.empty();
  }
};

}  // namespace gpunode::service::detail
