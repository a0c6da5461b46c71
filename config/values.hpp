// Internal: the value rules of agent.yaml (CONTRACT §2) as pure functions over text.
//
// Each parser takes a scalar's text and returns the typed value, or an error (Errc::invalid) whose
// detail is a reason that completes `invalid value "X" for KEY: <reason>`. No I/O, no exceptions.
#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

#include "gpunode/config/config.hpp"
#include "gpunode/error/error.hpp"

namespace gpunode::config::values {

template <class T>
using Parsed = error::Result<T>;

// Any text without NUL characters (paths, URIs, group names, the issuer).
Parsed<std::string> text(std::string_view s);
// An absolute path without NUL characters.
Parsed<std::string> absolute_path(std::string_view s);
// An absolute path short enough for sockaddr_un (at most 107 bytes).
Parsed<std::string> socket_path(std::string_view s);
// 1 to 128 characters of [A-Za-z0-9._-] (node.id, node.owner_org).
Parsed<std::string> name(std::string_view s);
// Not empty, no NUL (auth.audience).
Parsed<std::string> non_empty_text(std::string_view s);
// 4 hex digits, returned in lower case.
Parsed<std::string> gpu_vendor(std::string_view s);
// vfio-group or device-request.
Parsed<std::string> reservable_class(std::string_view s);
// u-DDDD-BB-SS-F or DDDD:BB:SS.F (hex), returned in lower case.
Parsed<std::string> unit_ref(std::string_view s);
// HOST:PORT or [IPv6]:PORT (see parse_listen), returned unchanged.
Parsed<std::string> listen(std::string_view s);
// Empty (not listening), or as listen().
Parsed<std::string> optional_listen(std::string_view s);
// A connection cap (CONTRACT §10): a whole number from 1 to 1000000.
Parsed<std::size_t> connection_cap(std::string_view s);
// true or false (YAML 1.2's core schema; not yes/no/on/off).
Parsed<bool> boolean(std::string_view s);
// Whether a valid HOST:PORT listens on loopback only: localhost, 127.0.0.0/8 or ::1.
bool is_loopback_listen(std::string_view s);
// Empty, or an absolute https URL with a host (Boost.URL's grammar), no user info, query or fragment.
Parsed<std::string> central_url(std::string_view s);
// A decimal integer in [0, 2^32).
Parsed<std::uint32_t> uid(std::string_view s);
Parsed<LogLevel> log_level(std::string_view s);
Parsed<LogFormat> log_format(std::string_view s);
Parsed<EnforcementMode> enforcement_mode(std::string_view s);
Parsed<WhenAgentDown> when_agent_down(std::string_view s);
// parse_duration, at least 1s.
Parsed<Duration> rescan_interval(std::string_view s);
// parse_duration, 1s to 1h (central.heartbeat_interval).
Parsed<Duration> heartbeat_interval(std::string_view s);
// parse_duration, 1s to 24h (audit.checkpoint_interval).
Parsed<Duration> checkpoint_interval(std::string_view s);
// CONTRACT §13: health.interval (1s to 1h), health.recovery (0s to 24h), health.nonfatal_threshold (1 to
// 1000000), an entry of health.ignore (one of the four failing codes).
Parsed<Duration> health_interval(std::string_view s);
Parsed<Duration> health_recovery(std::string_view s);
Parsed<std::uint64_t> nonfatal_threshold(std::string_view s);
Parsed<std::string> failing_code(std::string_view s);
// Empty, or an absolute path.
Parsed<std::string> optional_absolute_path(std::string_view s);
// parse_duration, 0s to 300s.
Parsed<Duration> shutdown_grace(std::string_view s);

}  // namespace gpunode::config::values
