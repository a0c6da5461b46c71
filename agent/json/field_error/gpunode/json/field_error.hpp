// gpunode/json/field_error.hpp: a field of a request's body or query and what is wrong with it,
// one type for whoever finds the fault and whoever writes it into a problem+json answer's
// "errors". Header-only and dependency-free (its own include directory, the INTERFACE target
// gpunode::field_error), so that the reservation rules, which use no Boost and no JSON, return it
// as they are, and problem() (problem.hpp) takes it with nothing converted on the way.
#pragma once

#include <string>

namespace gpunode::json {

struct FieldError {
  std::string field;
  std::string message;
};

}  // namespace gpunode::json
