// gpunode/ctl/request.hpp: what gpunodectl sends, as plain data (CONTRACT §8). Pure: no I/O, no clock
// (the caller passes `now`), so every command's request is tested without a socket.
#pragma once

#include <chrono>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpunode/error/error.hpp"

namespace gpunode::ctl {

using Time = std::chrono::sys_seconds;

// One HTTP request to the admin socket. `target` is path?query, already percent-encoded.
struct Request {
  std::string method = "GET";
  std::string target;
  std::string body;          // empty: no body
  std::string content_type;  // set when there is a body
  std::vector<std::pair<std::string, std::string>> headers;
  std::chrono::seconds timeout{30};  // for the whole exchange (connect, write, answer)
};

// A time on the command line (CONTRACT §8): RFC 3339 ("2027-01-31T00:00:00Z", an offset is turned
// into UTC, fractions of a second are dropped as the agent drops them), or `+` and a duration from
// `now`: one or more NUMBER UNIT pairs, units w, d, h, m, s from largest to smallest ("+30d",
// "+12h", "+90m", "+1d12h"). The error says what is wrong with the text.
error::Result<Time> parse_when(std::string_view text, Time now);
// "+30d" without the '+': the duration alone.
error::Result<std::chrono::seconds> parse_offset(std::string_view text);
// RFC 3339 UTC to the second, as the API writes times: "2027-01-31T00:00:00Z".
std::string format_time(Time t);

// A comma-separated list of ids ("u-0000-23-00-0,u-0000-24-00-0"): no empty entries, no repeats.
error::Result<std::vector<std::string>> parse_ids(std::string_view text);

// Percent-encoding of one path segment or query value: RFC 3986 unreserved characters pass.
std::string encode_component(std::string_view text);

// ---- the routes (CONTRACT §4), for node `node` -----------------------------------------------
Request healthz_request();
Request units_request(std::string_view node);
Request state_request(std::string_view node);
Request workloads_request(std::string_view node);
Request metrics_request();
Request unentitled_request();  // GET /v1/admin/unentitled (CONTRACT §9)
Request rescan_request();
// Unit health (CONTRACT §13, admin socket): every unit's (GET /v1/admin/health), one unit's (GET
// /v1/admin/units/{unitId}/health), and the operator's clear of a unit (POST .../health/clear).
Request health_request(std::optional<std::string_view> unit);
Request health_clear_request(std::string_view unit, std::string_view reason);
Request checkpoint_request();  // POST /v1/admin/audit/checkpoint (CONTRACT §12)
Request capacity_request(std::string_view node, std::string_view org);
Request reservation_request(std::string_view node, std::string_view id);
// One page of a list: `limit` per page and the previous page's nextPageToken.
Request reservations_page(std::string_view node, std::optional<std::string_view> state, std::size_t limit,
                          std::optional<std::string_view> page_token);
Request audit_page(std::string_view node, std::optional<std::string_view> after, std::size_t limit,
                   std::optional<std::string_view> page_token);
// GET .../audit/checkpoints (CONTRACT §12): `after` a checkpoint's seq, in decimal.
Request checkpoints_page(std::string_view node, std::optional<std::string_view> after, std::size_t limit,
                         std::optional<std::string_view> page_token);

struct ReserveArgs {
  std::vector<std::string> units, audience, managers;
  std::optional<Time> starts;
  Time ends{};
  std::optional<std::string> note;
};
Request reserve_request(std::string_view node, const ReserveArgs& a);

struct AmendArgs {
  std::optional<std::vector<std::string>> units, audience, managers;
  std::optional<Time> starts, ends;
  std::optional<std::string> note;
  std::optional<std::string> if_match;  // a version ("3") or an entity tag ("\"3\"")
};
Request amend_request(std::string_view node, std::string_view id, const AmendArgs& a);
Request end_request(std::string_view node, std::string_view id, const std::optional<std::string>& reason);
Request release_request(std::string_view node, std::string_view id, const std::vector<std::string>& units);
// A reclaim that terminates waits for the grace period the agent has configured (at most 300 s).
// `dry_run`: the agent answers what the call would do, and does nothing (CONTRACT §12).
Request reclaim_request(std::string_view node, std::string_view id, const std::vector<std::string>& units,
                        bool terminate_spot, bool dry_run = false);

struct TerminateArgs {
  std::optional<std::vector<std::string>> units;
  std::optional<std::string> reservation;
  std::optional<int> grace_seconds;  // 0..300; unset: the agent's libvirt.shutdown_grace
  std::optional<std::string> reason;
  bool dry_run = false;  // what it would do, nothing done (CONTRACT §12)
};
Request terminate_spot_request(std::string_view node, const TerminateArgs& a);

}  // namespace gpunode::ctl
