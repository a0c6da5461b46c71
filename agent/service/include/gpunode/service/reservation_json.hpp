// gpunode/service/reservation_json.hpp: reservation JSON (CONTRACT §4) and request bodies.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>
#include <expected>
#include <optional>
#include <string>
#include <vector>

#include "gpunode/error/error.hpp"
#include "gpunode/reservations/rules.hpp"
#include "gpunode/service/api.hpp"

namespace gpunode::service {

boost::json::object to_json(const reservations::Reservation& r);
// The inverse, for what the agent itself stored; an error (invalid) says which key is wrong.
error::Result<reservations::Reservation> reservation_from_json(const boost::json::value& v);

// Parses a request body that must be a JSON object (an empty body is `{}` when allowed), strictly
// (gpunode::json::parse_strict, nesting up to 64). The error is the 400 invalid-request to answer,
// its detail saying what and where ("the body is not valid JSON: line 1, column 22 (byte 21): ...").
std::expected<boost::json::object, ApiResponse> parse_object(const std::string& body, bool empty_ok);

boost::json::array strings_json(const std::vector<std::string>& list);

// Reads typed members of a request object, collecting a problem per bad or unknown member.
class Fields {
 public:
  Fields(const boost::json::object& o, std::vector<std::string> known);
  std::optional<std::vector<std::string>> strings(const char* name);  // array of non-empty strings
  std::optional<std::string> string(const char* name, bool nullable = false);
  std::optional<reservations::Time> time(const char* name);
  std::optional<bool> boolean(const char* name);
  std::optional<std::int64_t> integer(const char* name, std::int64_t min, std::int64_t max);
  bool has(const char* name) const { return o_.contains(name); }
  std::vector<gpunode::json::FieldError>& problems() { return problems_; }

 private:
  const boost::json::object& o_;
  std::vector<gpunode::json::FieldError> problems_;
};

}  // namespace gpunode::service
