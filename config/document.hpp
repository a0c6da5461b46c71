// Internal: agent.yaml's text as one YAML document. yaml-cpp parses it, behind a first pass that
// works around two yaml-cpp 0.7 defects (see document.cpp); every syntax error becomes a Problem
// with its position. Nothing here throws for any input.
#pragma once

#include <yaml-cpp/yaml.h>

#include <optional>
#include <string_view>

#include "problems.hpp"

namespace gpunode::config::document {

// The first document of `source` (a null node when it has none), or nothing when the stream
// does not parse. A second document is reported, and the first still returned.
std::optional<YAML::Node> parse(std::string_view source, Problems& problems);

}  // namespace gpunode::config::document
