#include "gpunode/ctl/request.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <charconv>
#include <limits>

#include "gpunode/reservations/model.hpp"

namespace gpunode::ctl {
namespace json = boost::json;
using namespace std::chrono_literals;

namespace {

// A termination waits for its grace period and then for the destroys; the agent's own default
// grace (libvirt.shutdown_grace) is at most 300 s.
constexpr std::chrono::seconds kMaxGrace{300};
constexpr std::chrono::seconds kAfterGrace{60};

struct OffsetUnit {
  char name;
  std::int64_t seconds;
};
constexpr std::array<OffsetUnit, 5> kOffsetUnits{
    {{'w', 604800}, {'d', 86400}, {'h', 3600}, {'m', 60}, {'s', 1}}};

json::array strings(const std::vector<std::string>& v) {
  json::array a;
  for (const auto& s : v) a.emplace_back(s);
  return a;
}

Request get(std::string target) {
  Request r;
  r.target = std::move(target);
  return r;
}

Request post(std::string target, const json::object& body) {
  Request r;
  r.method = "POST";
  r.target = std::move(target);
  r.body = json::serialize(body);
  r.content_type = "application/json";
  return r;
}

std::string node_path(std::string_view node, std::string_view rest = {}) {
  return fmt::format("/v1/nodes/{}{}", encode_component(node), rest);
}

std::string reservation_path(std::string_view node, std::string_view id, std::string_view rest = {}) {
  return node_path(node, fmt::format("/reservations/{}{}", encode_component(id), rest));
}

// One page of a list route: ?limit=N[&FILTER=VALUE][&pageToken=TOKEN].
Request list_page(std::string_view node, std::string_view list, std::string_view filter_key,
                  std::optional<std::string_view> filter, std::size_t limit,
                  std::optional<std::string_view> page_token) {
  std::string q = fmt::format("{}?limit={}", list, limit);
  if (filter) q += fmt::format("&{}={}", filter_key, encode_component(*filter));
  if (page_token) q += "&pageToken=" + encode_component(*page_token);
  return get(node_path(node, q));
}

}  // namespace

error::Result<std::chrono::seconds> parse_offset(std::string_view text) {
  if (text.empty()) return error::fail(error::Errc::invalid, "a duration is missing after '+', e.g. +30d");
  std::int64_t total = 0;
  std::size_t last_rank = kOffsetUnits.size();
  std::string_view rest = text;
  while (!rest.empty()) {
    std::int64_t n = 0;
    if (rest.front() < '0' || rest.front() > '9')
      return error::fail(error::Errc::invalid, fmt::format("expected a number at \"{}\", e.g. +30d", rest));
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), n);
    if (ec != std::errc{}) return error::fail(error::Errc::invalid, "the duration is too large");
    rest.remove_prefix(static_cast<std::size_t>(p - rest.data()));
    if (rest.empty())
      return error::fail(error::Errc::invalid,
                         fmt::format("\"+{}\" needs a unit: w, d, h, m or s (e.g. +30d)", text));
    const auto* u = std::find_if(kOffsetUnits.begin(), kOffsetUnits.end(),
                                 [&](const OffsetUnit& x) { return x.name == rest.front(); });
    if (u == kOffsetUnits.end()) {
      return error::fail(
          error::Errc::invalid,
          fmt::format("unknown unit '{}' in \"+{}\": use w, d, h, m or s (e.g. +30d, +12h, +90m)",
                      rest.front(), text));
    }
    const auto rank = static_cast<std::size_t>(u - kOffsetUnits.begin());
    if (last_rank != kOffsetUnits.size() && rank <= last_rank) {
      return error::fail(
          error::Errc::invalid,
          fmt::format("units go from largest to smallest, each once, e.g. +1d12h (not \"+{}\")", text));
    }
    last_rank = rank;
    std::int64_t part = 0;
    if (__builtin_mul_overflow(n, u->seconds, &part) || __builtin_add_overflow(total, part, &total) ||
        total > std::int64_t{100} * 366 * 86400) {
      return error::fail(error::Errc::invalid, "the duration is too large (at most 100 years)");
    }
    rest.remove_prefix(1);
  }
  return std::chrono::seconds(total);
}

error::Result<Time> parse_when(std::string_view text, Time now) {
  if (text.starts_with('+')) {
    auto d = parse_offset(text.substr(1));
    if (!d) return std::unexpected(d.error());
    return now + *d;
  }
  if (auto t = reservations::parse_time(text)) return *t;
  return error::fail(error::Errc::invalid,
                     fmt::format("\"{}\" is not a time: use RFC 3339 (2027-01-31T00:00:00Z) or +DURATION "
                                 "from now (+30d, +12h, +90m)",
                                 text));
}

std::string format_time(Time t) {
  return reservations::format_time(t);
}

error::Result<std::vector<std::string>> parse_ids(std::string_view text) {
  std::vector<std::string> out;
  std::string_view rest = text;
  while (true) {
    const auto comma = rest.find(',');
    std::string_view id = rest.substr(0, comma);
    while (!id.empty() && id.front() == ' ') id.remove_prefix(1);
    while (!id.empty() && id.back() == ' ') id.remove_suffix(1);
    if (id.empty())
      return error::fail(error::Errc::invalid,
                         fmt::format("\"{}\" has an empty entry: ids are comma-separated, e.g. a,b", text));
    if (std::find(out.begin(), out.end(), id) != out.end())
      return error::fail(error::Errc::invalid, fmt::format("\"{}\" is named twice", id));
    out.emplace_back(id);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return out;
}

std::string encode_component(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if ((u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') || c == '-' || c == '.' ||
        c == '_' || c == '~') {
      out.push_back(c);
    } else {
      out += fmt::format("%{:02X}", u);
    }
  }
  return out;
}

Request healthz_request() {
  return get("/healthz");
}
Request units_request(std::string_view node) {
  return get(node_path(node, "/units"));
}
Request state_request(std::string_view node) {
  return get(node_path(node, "/state"));
}
Request workloads_request(std::string_view node) {
  return get(node_path(node, "/workloads"));
}
Request metrics_request() {
  return get("/metrics");
}
Request unentitled_request() {
  return get("/v1/admin/unentitled");
}

Request checkpoint_request() {
  Request r = post("/v1/admin/audit/checkpoint", json::object{});
  r.body.clear();
  return r;
}

Request rescan_request() {
  // A scan of a large host takes a while; it is the agent's, not a request's, cost.
  Request r = post("/v1/admin/rescan", json::object{});
  r.body.clear();
  r.timeout = 120s;
  return r;
}

Request health_request(std::optional<std::string_view> unit) {
  if (!unit) return get("/v1/admin/health");
  return get("/v1/admin/units/" + encode_component(*unit) + "/health");
}

Request health_clear_request(std::string_view unit, std::string_view reason) {
  return post("/v1/admin/units/" + encode_component(unit) + "/health/clear",
              json::object{{"reason", reason}});
}

Request capacity_request(std::string_view node, std::string_view org) {
  return get(node_path(node, "/capacity?org=" + encode_component(org)));
}

Request reservation_request(std::string_view node, std::string_view id) {
  return get(reservation_path(node, id));
}

Request reservations_page(std::string_view node, std::optional<std::string_view> state, std::size_t limit,
                          std::optional<std::string_view> page_token) {
  return list_page(node, "/reservations", "state", state, limit, page_token);
}

Request audit_page(std::string_view node, std::optional<std::string_view> after, std::size_t limit,
                   std::optional<std::string_view> page_token) {
  return list_page(node, "/audit", "after", after, limit, page_token);
}

Request checkpoints_page(std::string_view node, std::optional<std::string_view> after, std::size_t limit,
                         std::optional<std::string_view> page_token) {
  return list_page(node, "/audit/checkpoints", "after", after, limit, page_token);
}

Request reserve_request(std::string_view node, const ReserveArgs& a) {
  json::object b{{"unitIds", strings(a.units)},
                 {"audienceOrgIds", strings(a.audience)},
                 {"managingOrgIds", strings(a.managers)},
                 {"endsAt", format_time(a.ends)}};
  if (a.starts) b["startsAt"] = format_time(*a.starts);
  if (a.note) b["note"] = *a.note;
  return post(node_path(node, "/reservations"), b);
}

Request amend_request(std::string_view node, std::string_view id, const AmendArgs& a) {
  json::object b;
  if (a.units) b["unitIds"] = strings(*a.units);
  if (a.audience) b["audienceOrgIds"] = strings(*a.audience);
  if (a.managers) b["managingOrgIds"] = strings(*a.managers);
  if (a.starts) b["startsAt"] = format_time(*a.starts);
  if (a.ends) b["endsAt"] = format_time(*a.ends);
  if (a.note) b["note"] = *a.note;
  Request r = post(reservation_path(node, id), b);
  r.method = "PATCH";
  r.content_type = "application/merge-patch+json";
  if (a.if_match) {
    // The ETag is the version in quotes; a bare version is quoted here.
    const bool quoted = a.if_match->size() >= 2 && a.if_match->front() == '"' && a.if_match->back() == '"';
    r.headers.emplace_back("If-Match", quoted ? *a.if_match : fmt::format("\"{}\"", *a.if_match));
  }
  return r;
}

Request end_request(std::string_view node, std::string_view id, const std::optional<std::string>& reason) {
  json::object b;
  if (reason) b["reason"] = *reason;
  return post(reservation_path(node, id, "/end"), b);
}

Request release_request(std::string_view node, std::string_view id, const std::vector<std::string>& units) {
  return post(reservation_path(node, id, "/release"), json::object{{"unitIds", strings(units)}});
}

Request reclaim_request(std::string_view node, std::string_view id, const std::vector<std::string>& units,
                        bool terminate_spot, bool dry_run) {
  json::object b{{"unitIds", strings(units)}, {"terminateSpot", terminate_spot}};
  if (dry_run) b["dryRun"] = true;
  Request r = post(reservation_path(node, id, "/reclaim"), b);
  if (terminate_spot && !dry_run) r.timeout = kMaxGrace + kAfterGrace;
  return r;
}

Request terminate_spot_request(std::string_view node, const TerminateArgs& a) {
  json::object b;
  if (a.units) b["unitIds"] = strings(*a.units);
  if (a.reservation) b["reservationId"] = *a.reservation;
  if (a.grace_seconds) b["gracePeriodSeconds"] = *a.grace_seconds;
  if (a.reason) b["reason"] = *a.reason;
  if (a.dry_run) b["dryRun"] = true;
  Request r = post(node_path(node, "/terminate-spot"), b);
  if (!a.dry_run)
    r.timeout = (a.grace_seconds ? std::chrono::seconds(*a.grace_seconds) : kMaxGrace) + kAfterGrace;
  return r;
}

}  // namespace gpunode::ctl
