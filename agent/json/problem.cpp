// problem+json bodies (see problem.hpp).
#include "gpunode/json/problem.hpp"

#include <boost/json.hpp>

namespace gpunode::json {

boost::json::object problem_body(unsigned status, std::string_view code, std::string_view title,
                                 std::string_view detail, const std::vector<FieldError>& errors) {
  boost::json::object o;
  o["type"] = "urn:gpunode:problem:" + std::string(code);
  o["title"] = title;
  o["status"] = status;
  o["detail"] = detail;
  o["code"] = code;
  boost::json::array list;
  for (const auto& e : errors)
    list.emplace_back(boost::json::object{{"field", e.field}, {"message", e.message}});
  o["errors"] = std::move(list);
  return o;
}

}  // namespace gpunode::json
