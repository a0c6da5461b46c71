// gpunode/json/problem.hpp: the body of every error answer, application/problem+json (RFC 9457)
// with every key of CONTRACT §4/§7. One builder for the transport (413, 431, 400 before a
// request reaches the API) and for the API itself.
#pragma once

#include <boost/json/object.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace gpunode::json {

struct FieldError {
  std::string field;
  std::string message;
};

// {"type":"urn:gpunode:problem:CODE","title","status","detail","code","errors":[{"field","message"}]}
boost::json::object problem_body(unsigned status, std::string_view code, std::string_view title,
                                 std::string_view detail, const std::vector<FieldError>& errors = {});

}  // namespace gpunode::json
