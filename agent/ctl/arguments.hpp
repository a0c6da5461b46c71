// gpunodectl's argument checks (CLI11 validators) and conversions, shared by the commands of
// app.cpp. Private to gpunode_ctl.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "gpunode/ctl/request.hpp"

namespace gpunode::ctl {

// A time as parse_when reads it (RFC 3339, or + a duration from `now`).
CLI::Validator time_validator(Time now);
// A comma-separated list of ids; `may_be_empty`: "" names no id (--managers "" empties the
// managing orgs).
CLI::Validator ids_validator(bool may_be_empty = false);
// What a validated option holds, converted (the validator has refused anything else).
std::vector<std::string> ids_of(const std::string& s);
Time when_of(const std::string& s, Time now);

}  // namespace gpunode::ctl
