#include "gpunode/service/reservation_json.hpp"

#include <fmt/format.h>

#include <boost/json.hpp>

#include "gpunode/json/strict.hpp"

namespace gpunode::service {
namespace r = gpunode::reservations;

namespace {

constexpr std::size_t kMaxBodyDepth = 64;  // CONTRACT §7 JSON bodies

boost::json::value opt_time(const std::optional<r::Time>& t) {
  if (!t) return nullptr;
  return boost::json::value(r::format_time(*t));
}

std::optional<std::vector<std::string>> string_list(const boost::json::value* v) {
  if (v == nullptr || !v->is_array()) return std::nullopt;
  std::vector<std::string> out;
  for (const auto& e : v->get_array()) {
    if (!e.is_string()) return std::nullopt;
    out.emplace_back(e.get_string());
  }
  return out;
}

}  // namespace

boost::json::array strings_json(const std::vector<std::string>& list) {
  boost::json::array a;
  a.reserve(list.size());
  for (const auto& s : list) a.emplace_back(s);
  return a;
}

boost::json::object to_json(const r::Reservation& x) {
  boost::json::object o;
  o["id"] = x.id;
  o["nodeId"] = x.node_id;
  o["unitIds"] = strings_json(x.unit_ids);
  o["audienceOrgIds"] = strings_json(x.audience_org_ids);
  o["managingOrgIds"] = strings_json(x.managing_org_ids);
  o["startsAt"] = r::format_time(x.starts_at);
  o["endsAt"] = r::format_time(x.ends_at);
  o["state"] = r::to_string(x.state);
  o["endedAt"] = opt_time(x.ended_at);
  o["endReason"] =
      x.end_reason ? boost::json::value(r::to_string(*x.end_reason)) : boost::json::value(nullptr);
  o["releasedUnitIds"] = strings_json(x.released_unit_ids);
  o["reclaimingUnitIds"] = strings_json(x.reclaiming_unit_ids);
  o["note"] = x.note;
  o["createdAt"] = r::format_time(x.created_at);
  o["updatedAt"] = r::format_time(x.updated_at);
  o["version"] = x.version;
  return o;
}

error::Result<r::Reservation> reservation_from_json(const boost::json::value& v) {
  const auto bad = [](const char* what) { return error::fail(error::Errc::invalid, what); };
  if (!v.is_object()) return bad("not an object");
  const auto& o = v.get_object();
  r::Reservation x;
  auto str = [&](const char* k, std::string& out) -> bool {
    const auto* p = o.if_contains(k);
    if (p == nullptr || !p->is_string()) return false;
    out = std::string(p->get_string());
    return true;
  };
  auto time = [&](const char* k, r::Time& out) -> bool {
    std::string s;
    if (!str(k, s)) return false;
    auto t = r::parse_time(s);
    if (!t) return false;
    out = *t;
    return true;
  };
  auto list = [&](const char* k, std::vector<std::string>& out) -> bool {
    auto l = string_list(o.if_contains(k));
    if (!l) return false;
    out = std::move(*l);
    return true;
  };
  std::string state;
  if (!str("id", x.id)) return bad("id");
  if (!str("nodeId", x.node_id)) return bad("nodeId");
  if (!list("unitIds", x.unit_ids) || !list("audienceOrgIds", x.audience_org_ids) ||
      !list("managingOrgIds", x.managing_org_ids) || !list("releasedUnitIds", x.released_unit_ids) ||
      !list("reclaimingUnitIds", x.reclaiming_unit_ids)) {
    return bad("a list of ids");
  }
  if (!time("startsAt", x.starts_at) || !time("endsAt", x.ends_at) || !time("createdAt", x.created_at) ||
      !time("updatedAt", x.updated_at)) {
    return bad("a time");
  }
  if (!str("state", state) || !r::parse_state(state)) return bad("state");
  x.state = *r::parse_state(state);
  if (const auto* e = o.if_contains("endedAt"); e != nullptr && e->is_string()) {
    x.ended_at = r::parse_time(e->get_string());
  }
  if (const auto* e = o.if_contains("endReason"); e != nullptr && e->is_string()) {
    x.end_reason = e->get_string() == "ended-early" ? r::EndReason::ended_early : r::EndReason::term_expired;
  }
  str("note", x.note);
  const auto* ver = o.if_contains("version");
  if (ver == nullptr || !ver->is_int64()) return bad("version");
  x.version = ver->get_int64();
  return x;
}

std::expected<boost::json::object, ApiResponse> parse_object(const std::string& body, bool empty_ok) {
  auto bad = [](const std::string& what) {
    return std::unexpected(problem(400, "invalid-request", "the body " + what, {{"body", what}}));
  };
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) {
    if (empty_ok) return boost::json::object{};
    return bad("must be a JSON object; it is empty");
  }
  auto v = json::parse_strict(body, kMaxBodyDepth);
  if (!v) return bad("is not valid JSON: " + v.error().to_string());
  if (!v->is_object()) return bad("must be a JSON object");
  return std::move(v->get_object());
}

Fields::Fields(const boost::json::object& o, std::vector<std::string> known) : o_(o) {
  for (const auto& kv : o) {
    if (std::find(known.begin(), known.end(), std::string_view(kv.key())) == known.end()) {
      problems_.push_back({std::string(kv.key()), "unknown field"});
    }
  }
}

std::optional<std::vector<std::string>> Fields::strings(const char* name) {
  const auto* v = o_.if_contains(name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) {
    problems_.push_back({name, "must be an array of strings"});
    return std::nullopt;
  }
  std::vector<std::string> out;
  for (const auto& e : v->get_array()) {
    if (!e.is_string() || e.get_string().empty() || e.get_string().size() > 256) {
      problems_.push_back({name, "must be an array of non-empty strings (at most 256 characters each)"});
      return std::nullopt;
    }
    out.emplace_back(e.get_string());
  }
  return out;
}

std::optional<std::string> Fields::string(const char* name, bool nullable) {
  const auto* v = o_.if_contains(name);
  if (v == nullptr || (nullable && v->is_null())) return std::nullopt;
  if (!v->is_string()) {
    problems_.push_back({name, "must be a string"});
    return std::nullopt;
  }
  return std::string(v->get_string());
}

std::optional<r::Time> Fields::time(const char* name) {
  const auto* v = o_.if_contains(name);
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) {
    if (auto t = r::parse_time(v->get_string())) return t;
  }
  problems_.push_back({name, "must be an RFC 3339 time from 1970 to 2199, e.g. 2027-01-31T00:00:00Z"});
  return std::nullopt;
}

std::optional<bool> Fields::boolean(const char* name) {
  const auto* v = o_.if_contains(name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_bool()) {
    problems_.push_back({name, "must be true or false"});
    return std::nullopt;
  }
  return v->get_bool();
}

std::optional<std::int64_t> Fields::integer(const char* name, std::int64_t min, std::int64_t max) {
  const auto* v = o_.if_contains(name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_int64() || v->get_int64() < min || v->get_int64() > max) {
    problems_.push_back({name, fmt::format("must be an integer from {} to {}", min, max)});
    return std::nullopt;
  }
  return v->get_int64();
}

}  // namespace gpunode::service
