// gpunode/health/state_json.hpp: what the agent keeps of health in its state database, as JSON
// documents (one per function, one per unit). Reading one never throws: a document that is not
// what this writes is Errc::invalid, its detail saying where.
#pragma once

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include "gpunode/error/error.hpp"
#include "gpunode/health/judge.hpp"

namespace gpunode::health {

boost::json::object to_json(const DeviceState& s);
error::Result<DeviceState> device_state_from_json(const boost::json::value& v);

boost::json::array to_json(const Verdict& v);
error::Result<Verdict> verdict_from_json(const boost::json::value& v);

}  // namespace gpunode::health
