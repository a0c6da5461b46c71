// gpunode/ctl/model.hpp: the agent's answers as plain data for the pictures and tables. The JSON
// comes from a socket: it is read with Boost.JSON's non-throwing accessors only, and an answer of
// the wrong shape is an error naming the place ("reservations[2].unitIds[0]: not a string").
// Keys the contract adds later are ignored; a missing optional key reads as empty.
#pragma once

#include <boost/json/value.hpp>
#include <cstdint>
#include <expected>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/ctl/request.hpp"
#include "gpunode/error/error.hpp"

namespace gpunode::ctl {

struct Reason {
  std::string code, message;
};

struct Device {
  std::string pci_address, role, vendor_id, device_id, class_code;
  std::optional<std::string> driver;
};

struct Gpu {
  std::string pci_address;
  std::optional<std::string> name;
};

// A unit's health (CONTRACT §13): its state and reasons.
struct HealthReason {
  std::string code, pci_address, detail, since;
};
struct Health {
  std::string state = "ok";  // ok, warning, failing
  std::vector<HealthReason> reasons;
};

struct Unit {
  std::string id;
  std::optional<std::int64_t> iommu_group;
  std::string cls;
  std::int64_t gpu_count = 0;
  std::vector<std::int64_t> numa_nodes;
  bool sellable = false, reservable = false;
  std::vector<Reason> reasons;
  std::vector<Gpu> gpus;
  std::vector<Device> devices;
  std::vector<std::string> reservation_ids;
  Health health;
};

// GET /v1/admin/health (or one unit's): each unit's health and what its functions showed last.
struct HealthDevice {
  std::string pci_address, role;
  std::optional<std::string> power_state, link_speed;
  std::optional<std::int64_t> link_width, max_link_width, widest_link_width;
  std::optional<std::vector<std::optional<std::int64_t>>> aer;  // fatal, nonfatal, correctable
};
struct UnitHealthView {
  std::string unit_id;
  Health health;
  std::vector<HealthDevice> devices;
};
// `body`: {"units": [...]} or one unit's object.
error::Result<std::vector<UnitHealthView>> decode_health(const boost::json::value& body);

struct Reservation {
  std::string id, state;
  std::vector<std::string> unit_ids, audience, managers, released, reclaiming;
  std::string starts_at, ends_at;    // as the agent wrote them
  std::optional<Time> starts, ends;  // parsed; nullopt when unreadable
  std::optional<std::string> ended_at, end_reason;
  std::string note;
  std::int64_t version = 0;
};

struct Workload {
  std::optional<std::string> vm_id, org, tier, termination_reason;
  std::string name, domain_uuid, state;
  std::vector<std::string> unit_ids;
};

// GET .../state (CONTRACT §4): what the pictures are drawn from.
struct NodeState {
  std::string node_id;
  std::int64_t revision = 0;
  std::vector<Unit> units;
  std::vector<Reservation> reservations;
  std::vector<Workload> workloads;
  // GET /v1/admin/unentitled (CONTRACT §9): domain uuid -> why it is not entitled to its units
  // ("UNIT: CODE, ..."); nullopt when the agent does not say (an agent without the route).
  std::optional<std::map<std::string, std::string>> unentitled;
};

error::Result<NodeState> decode_state(const boost::json::value& body);
// GET /v1/admin/unentitled: domain uuid -> "UNIT: CODE, ..." (escaped for people).
error::Result<std::map<std::string, std::string>> decode_unentitled(const boost::json::value& body);
error::Result<std::vector<Reservation>> decode_reservations(const boost::json::value& body,
                                                            std::string_view key = "reservations");
error::Result<Reservation> decode_reservation(const boost::json::value& body);
error::Result<std::vector<Workload>> decode_workloads(const boost::json::value& body);

// A value of the Prometheus text format (`name value` or `name{labels} value`; the first sample
// of that name), nullopt when absent or unreadable.
std::optional<double> metric_value(std::string_view text, std::string_view name);

}  // namespace gpunode::ctl
