// gpunode/discovery/json.hpp: unit JSON exactly as CONTRACT §3 spells it.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <string>
#include <vector>

#include "gpunode/discovery/model.hpp"

namespace gpunode::discovery {

std::string hex4(std::uint16_t value);            // "10de"
std::string class_hex(std::uint32_t class_code);  // top 16 bits: "0302"

// CONTRACT §13's `health` object: {"state", "reasons": [{"code", "pciAddress", "detail", "since"}]}.
boost::json::object health_to_json(const UnitHealth& health);

// One unit; `reservation_ids` are those the caller may see (CONTRACT §3).
boost::json::object unit_to_json(const Unit& unit, const std::vector<std::string>& reservation_ids = {});

// {"nodeId": ..., "units": [...]} with units in the given (sorted) order and no reservations.
boost::json::object units_body(const std::string& node_id, const std::vector<Unit>& units);

}  // namespace gpunode::discovery
