#include "gpunode/discovery/json.hpp"

#include <fmt/format.h>

namespace gpunode::discovery {
namespace {

boost::json::value opt_string(const std::optional<std::string>& s) {
  if (!s) return nullptr;
  return boost::json::value(*s);
}

boost::json::value opt_hex4(const std::optional<std::uint16_t>& v) {
  if (!v) return nullptr;
  return boost::json::value(hex4(*v));
}

}  // namespace

boost::json::object health_to_json(const UnitHealth& health) {
  boost::json::array reasons;
  for (const auto& r : health.reasons) {
    reasons.emplace_back(boost::json::object{
        {"code", r.code}, {"pciAddress", r.pci_address}, {"detail", r.detail}, {"since", r.since}});
  }
  return boost::json::object{{"state", to_string(health.state())}, {"reasons", std::move(reasons)}};
}

std::string hex4(std::uint16_t value) {
  return fmt::format("{:04x}", value);
}

std::string class_hex(std::uint32_t class_code) {
  return fmt::format("{:04x}", class_code >> 8);
}

boost::json::object unit_to_json(const Unit& unit, const std::vector<std::string>& reservation_ids) {
  boost::json::object o;
  o["id"] = unit.id;
  o["iommuGroup"] = unit.iommu_group ? boost::json::value(*unit.iommu_group) : boost::json::value(nullptr);
  o["class"] = to_string(unit.cls);
  o["gpuCount"] = unit.gpu_count();
  boost::json::array numa;
  for (int n : unit.numa_nodes) numa.emplace_back(n);
  o["numaNodes"] = std::move(numa);
  o["sellable"] = unit.sellable;
  o["reservable"] = unit.reservable;
  boost::json::array reasons;
  for (const auto& r : unit.reasons)
    reasons.emplace_back(boost::json::object{{"code", r.code}, {"message", r.message}});
  o["notReservableReasons"] = std::move(reasons);
  boost::json::array gpus, devices;
  for (const auto& m : unit.devices) {
    const DeviceRecord& d = m.device;
    if (m.role == Role::gpu) {
      gpus.emplace_back(boost::json::object{
          {"pciAddress", d.address.to_string()},
          {"vendorId", opt_hex4(d.vendor_id)},
          {"deviceId", opt_hex4(d.device_id)},
          {"name", opt_string(d.name)},
          {"driver", opt_string(d.driver)},
          {"numaNode", d.numa_node ? boost::json::value(*d.numa_node) : boost::json::value(nullptr)},
      });
    }
    devices.emplace_back(boost::json::object{
        {"pciAddress", d.address.to_string()},
        {"vendorId", opt_hex4(d.vendor_id)},
        {"deviceId", opt_hex4(d.device_id)},
        {"classCode",
         d.class_code ? boost::json::value(class_hex(*d.class_code)) : boost::json::value(nullptr)},
        {"role", to_string(m.role)},
        {"driver", opt_string(d.driver)},
    });
  }
  o["gpus"] = std::move(gpus);
  o["devices"] = std::move(devices);
  boost::json::array ids;
  for (const auto& id : reservation_ids) ids.emplace_back(id);
  o["reservationIds"] = std::move(ids);
  o["health"] = health_to_json(unit.health);
  return o;
}

boost::json::object units_body(const std::string& node_id, const std::vector<Unit>& units) {
  boost::json::array list;
  list.reserve(units.size());
  for (const auto& u : units) list.emplace_back(unit_to_json(u));
  return boost::json::object{{"nodeId", node_id}, {"units", std::move(list)}};
}

}  // namespace gpunode::discovery
