// Health's documents in the state database (see state_json.hpp).
#include "gpunode/health/state_json.hpp"

#include <fmt/format.h>

#include "gpunode/reservations/model.hpp"

namespace gpunode::health {
namespace json = boost::json;
namespace {

json::value opt_count(const std::optional<std::uint64_t>& n) {
  return n ? json::value(*n) : json::value(nullptr);
}

json::value opt_time(const std::optional<Time>& t) {
  return t ? json::value(reservations::format_time(*t)) : json::value(nullptr);
}

// Reads field `key` of `o` (absent or null: nothing) into `out`; false when it has another type.
bool read_count(const json::object& o, std::string_view key, std::optional<std::uint64_t>& out) {
  const auto* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return true;
  if (const auto* u = v->if_uint64()) {
    out = *u;
    return true;
  }
  if (const auto* i = v->if_int64(); i != nullptr && *i >= 0) {
    out = static_cast<std::uint64_t>(*i);
    return true;
  }
  return false;
}

bool read_time(const json::value* v, std::optional<Time>& out) {
  if (v == nullptr || v->is_null()) return true;
  if (!v->is_string()) return false;
  out = reservations::parse_time(v->get_string());
  return out.has_value();
}

bool read_rises(const json::object& o, DeviceState& s) {
  const auto* v = o.if_contains("nonfatalRises");
  if (v == nullptr) return true;
  if (!v->is_array()) return false;
  for (const auto& e : v->get_array()) {
    const auto* pair = e.if_array();
    std::optional<Time> at;
    std::optional<std::uint64_t> n;
    if (pair == nullptr || pair->size() != 2 || !read_time(&(*pair)[0], at) || !at) return false;
    json::object holder{{"n", (*pair)[1]}};
    if (!read_count(holder, "n", n) || !n) return false;
    s.nonfatal_rises.emplace_back(*at, *n);
  }
  return true;
}

std::unexpected<error::Error> bad(std::string_view what) {
  return error::fail(error::Errc::invalid, fmt::format("not a health document: {}", what));
}

}  // namespace

json::object to_json(const DeviceState& s) {
  json::array rises;
  for (const auto& [at, n] : s.nonfatal_rises)
    rises.emplace_back(json::array{json::value(reservations::format_time(at)), json::value(n)});
  return json::object{{"fatal", opt_count(s.fatal)},
                      {"nonfatal", opt_count(s.nonfatal)},
                      {"widest", s.widest ? json::value(*s.widest) : json::value(nullptr)},
                      {"nonfatalRises", std::move(rises)},
                      {"degradedSince", opt_time(s.degraded_since)},
                      {"degradedDetail", s.degraded_detail},
                      {"backSince", opt_time(s.back_since)}};
}

error::Result<DeviceState> device_state_from_json(const json::value& v) {
  const auto* o = v.if_object();
  if (o == nullptr) return bad("not an object");
  DeviceState s;
  if (!read_count(*o, "fatal", s.fatal) || !read_count(*o, "nonfatal", s.nonfatal)) return bad("a count");
  std::optional<std::uint64_t> widest;
  if (!read_count(*o, "widest", widest) || (widest && *widest > 32)) return bad("widest");
  if (widest) s.widest = static_cast<int>(*widest);
  if (!read_rises(*o, s)) return bad("nonfatalRises");
  if (!read_time(o->if_contains("degradedSince"), s.degraded_since) ||
      !read_time(o->if_contains("backSince"), s.back_since))
    return bad("a time");
  if (const auto* d = o->if_contains("degradedDetail"); d != nullptr && d->is_string())
    s.degraded_detail = std::string(d->get_string());
  return s;
}

json::array to_json(const Verdict& v) {
  json::array out;
  for (const auto& r : v) {
    out.emplace_back(json::object{{"code", r.code},
                                  {"pciAddress", r.pci_address},
                                  {"detail", r.detail},
                                  {"since", reservations::format_time(r.since)}});
  }
  return out;
}

error::Result<Verdict> verdict_from_json(const json::value& v) {
  const auto* a = v.if_array();
  if (a == nullptr) return bad("not a list of reasons");
  Verdict out;
  for (const auto& e : *a) {
    const auto* o = e.if_object();
    const auto str = [&](std::string_view key) -> const json::string* {
      const auto* f = o == nullptr ? nullptr : o->if_contains(key);
      return f == nullptr ? nullptr : f->if_string();
    };
    std::optional<Time> since;
    if (!str("code") || !str("pciAddress") || !str("detail") || !read_time(o->if_contains("since"), since) ||
        !since)
      return bad("a reason");
    out.push_back(
        {std::string(*str("code")), std::string(*str("pciAddress")), std::string(*str("detail")), *since});
  }
  return out;
}

}  // namespace gpunode::health
