// The value rules of agent.yaml (CONTRACT §2): durations, addresses, ids. Pure functions over text.
#include "values.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/un.h>

#include <algorithm>
#include <array>
#include <boost/url/parse.hpp>
#include <charconv>
#include <cstdint>
#include <limits>
#include <optional>

#include "gpunode/text/ascii.hpp"
#include "text.hpp"

namespace gpunode::config {
namespace {

using std::unexpected;

// Every value rule's failure: the text is wrong.
std::unexpected<error::Error> invalid(std::string why) {
  return error::fail(error::Errc::invalid, std::move(why));
}

constexpr bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
constexpr bool is_hex(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
constexpr bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
constexpr bool is_alnum(char c) {
  return is_digit(c) || is_alpha(c);
}

bool all_of(std::string_view s, bool (*pred)(char)) {
  return std::all_of(s.begin(), s.end(), pred);
}

// A whole decimal number of digits only (no sign, no spaces), or nothing when it does not fit.
std::optional<std::uint64_t> decimal(std::string_view s) {
  if (s.empty() || !all_of(s, is_digit)) return std::nullopt;
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return value;
}

std::optional<std::uint64_t> hex(std::string_view s) {
  if (s.empty() || !all_of(s, is_hex)) return std::nullopt;
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value, 16);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return value;
}

// --- durations ---------------------------------------------------------------------------------

struct DurationUnit {
  std::string_view name;
  std::int64_t millis;
  int rank;  // units must appear in decreasing rank, each once
};

constexpr std::array<DurationUnit, 4> kDurationUnits{{
    {"h", 3'600'000, 3},
    {"m", 60'000, 2},
    {"s", 1'000, 1},
    {"ms", 1, 0},
}};

const DurationUnit* find_duration_unit(std::string_view name) {
  for (const auto& unit : kDurationUnits) {
    if (unit.name == name) return &unit;
  }
  return nullptr;
}

constexpr std::string_view kNeedsUnit = "duration needs a unit, e.g. 30s";
constexpr std::string_view kTooLarge = "duration is too large";

// One "<number><unit>" taken from the front of `rest`.
struct DurationPart {
  std::int64_t millis;
  int rank;
};

error::Result<DurationPart> take_duration_part(std::string_view& rest) {
  const auto digits =
      static_cast<std::size_t>(std::find_if_not(rest.begin(), rest.end(), is_digit) - rest.begin());
  if (digits == 0) return invalid(fmt::format("expected a number at {}, e.g. 30s", text::quote(rest)));
  const auto number = decimal(rest.substr(0, digits));
  rest.remove_prefix(digits);
  if (!number || *number > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return invalid(std::string(kTooLarge));
  }
  if (rest.empty()) return invalid(std::string(kNeedsUnit));
  if (rest.front() == '.' || rest.front() == ',') {
    return invalid("use whole numbers, e.g. 1500ms instead of 1.5s");
  }
  const auto letters =
      static_cast<std::size_t>(std::find_if_not(rest.begin(), rest.end(), is_alpha) - rest.begin());
  if (letters == 0)
    return invalid(fmt::format("unexpected {} in duration, e.g. 1m30s", text::quote(rest.substr(0, 1))));
  const std::string_view name = rest.substr(0, letters);
  rest.remove_prefix(letters);
  const DurationUnit* unit = find_duration_unit(name);
  if (unit == nullptr) return invalid(fmt::format("unknown unit {} (use ms, s, m or h)", text::quote(name)));
  std::int64_t millis = 0;
  if (__builtin_mul_overflow(static_cast<std::int64_t>(*number), unit->millis, &millis)) {
    return invalid(std::string(kTooLarge));
  }
  return DurationPart{millis, unit->rank};
}

// --- listen addresses --------------------------------------------------------------------------

constexpr std::string_view kListenForm = "expected HOST:PORT or [IPv6]:PORT, e.g. 0.0.0.0:8443";

error::Result<std::uint16_t> listen_port(std::string_view s) {
  const auto value = s.size() <= 5 ? decimal(s) : std::nullopt;
  if (!value || *value < 1 || *value > 65535) {
    return invalid("the port must be a number from 1 to 65535");
  }
  return static_cast<std::uint16_t>(*value);
}

bool is_ipv4(std::string_view s) {
  const std::string z(s);
  in_addr addr{};
  return inet_pton(AF_INET, z.c_str(), &addr) == 1;
}

bool is_ipv6(std::string_view s) {
  const std::string z(s);
  in6_addr addr{};
  return inet_pton(AF_INET6, z.c_str(), &addr) == 1;
}

// RFC 1123 host name: dot-separated labels of 1..63 letters, digits and '-', not at either end.
bool is_host_name(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  if (s.back() == '.') s.remove_suffix(1);  // a fully qualified name may end in a dot
  while (true) {
    const auto dot = s.find('.');
    const std::string_view label = s.substr(0, dot);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') return false;
    if (!all_of(label, [](char c) { return is_alnum(c) || c == '-'; })) return false;
    if (dot == std::string_view::npos) return true;
    s.remove_prefix(dot + 1);
  }
}

error::Result<ListenAddress> bracketed_listen(std::string_view text) {
  const auto close = text.find(']');
  if (close == std::string_view::npos) return invalid("missing ']' after the IPv6 address");
  const std::string_view host = text.substr(1, close - 1);
  if (!is_ipv6(host)) return invalid(fmt::format("{} is not an IPv6 address", text::quote(host)));
  const std::string_view rest = text.substr(close + 1);
  if (rest.empty() || rest.front() != ':') return invalid(std::string(kListenForm));
  auto port = listen_port(rest.substr(1));
  if (!port) return unexpected(std::move(port.error()));
  return ListenAddress{std::string(host), *port};
}

// --- unit references ---------------------------------------------------------------------------

// DDDD<a>BB<b>SS<c>F with the given separators; slot 00..1f, function 0..7.
bool is_pci_shape(std::string_view s, char a, char b, char c) {
  if (s.size() != 12 || s[4] != a || s[7] != b || s[10] != c) return false;
  const auto domain = hex(s.substr(0, 4));
  const auto bus = hex(s.substr(5, 2));
  const auto slot = hex(s.substr(8, 2));
  const auto function = hex(s.substr(11, 1));
  return domain && bus && slot && function && *slot <= 0x1f && *function <= 7;
}

}  // namespace

error::Result<Duration> parse_duration(std::string_view text) {
  if (text.empty()) return invalid("empty duration, e.g. 30s");
  if (text.front() == '-') return invalid("a duration cannot be negative");
  if (all_of(text, is_digit)) return invalid(std::string(kNeedsUnit));
  std::int64_t total = 0;
  int previous_rank = std::numeric_limits<int>::max();
  std::string_view rest = text;
  while (!rest.empty()) {
    const auto part = take_duration_part(rest);
    if (!part) return unexpected(std::move(part.error()));
    if (part->rank >= previous_rank) {
      return invalid("units go from largest to smallest, each once, e.g. 1h30m");
    }
    previous_rank = part->rank;
    if (__builtin_add_overflow(total, part->millis, &total)) return invalid(std::string(kTooLarge));
  }
  return Duration(total);
}

error::Result<ListenAddress> parse_listen(std::string_view text) {
  if (text.empty()) return invalid(std::string(kListenForm));
  if (text.front() == '[') return bracketed_listen(text);
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos) return invalid(std::string(kListenForm));
  const std::string_view host = text.substr(0, colon);
  if (host.empty()) return invalid("the host is missing, e.g. 0.0.0.0:8443");
  if (host.find(':') != std::string_view::npos) {
    return invalid("put an IPv6 address in brackets, e.g. [::]:8443");
  }
  const bool looks_numeric = all_of(host, [](char c) { return is_digit(c) || c == '.'; });
  if (looks_numeric ? !is_ipv4(host) : !is_host_name(host)) {
    return invalid(fmt::format("{} is not an IP address or host name", text::quote(host)));
  }
  auto port = listen_port(text.substr(colon + 1));
  if (!port) return unexpected(std::move(port.error()));
  return ListenAddress{std::string(host), *port};
}

namespace values {

Parsed<std::string> text(std::string_view s) {
  if (s.find('\0') != std::string_view::npos) return invalid("must not contain a NUL character");
  return std::string(s);
}

Parsed<std::string> absolute_path(std::string_view s) {
  if (s.empty() || s.front() != '/') return invalid("must be an absolute path, starting with /");
  return text(s);
}

Parsed<std::string> socket_path(std::string_view s) {
  constexpr std::size_t kMax = sizeof(sockaddr_un{}.sun_path) - 1;
  if (s.size() > kMax) return invalid(fmt::format("a socket path is at most {} bytes", kMax));
  return absolute_path(s);
}

Parsed<std::string> name(std::string_view s) {
  const bool ok = !s.empty() && s.size() <= 128 &&
                  all_of(s, [](char c) { return is_alnum(c) || c == '.' || c == '_' || c == '-'; });
  if (!ok) return invalid("use 1 to 128 of the characters A-Z a-z 0-9 . _ -");
  return std::string(s);
}

Parsed<std::string> non_empty_text(std::string_view s) {
  if (s.empty()) return invalid("must not be empty");
  return text(s);
}

Parsed<std::string> gpu_vendor(std::string_view s) {
  if (s.size() != 4 || !all_of(s, is_hex)) return invalid("a vendor id is 4 hex digits, e.g. 10de");
  return gpunode::text::ascii_lower(s);
}

Parsed<std::string> reservable_class(std::string_view s) {
  if (s != "vfio-group" && s != "device-request") {
    return invalid("expected vfio-group or device-request");
  }
  return std::string(s);
}

Parsed<std::string> unit_ref(std::string_view s) {
  const bool unit_id = s.size() == 14 && s.starts_with("u-") && is_pci_shape(s.substr(2), '-', '-', '-');
  if (!unit_id && !is_pci_shape(s, ':', ':', '.')) {
    return invalid("expected a unit id like u-0000-41-00-0 or a PCI address like 0000:41:00.0");
  }
  return gpunode::text::ascii_lower(s);
}

Parsed<std::string> listen(std::string_view s) {
  auto parsed = parse_listen(s);
  if (!parsed) return unexpected(parsed.error());
  return std::string(s);
}

Parsed<std::string> central_url(std::string_view s) {
  if (s.empty()) return std::string();
  constexpr std::string_view kScheme = "https://";
  if (!s.starts_with(kScheme)) {
    return invalid("expected an https:// URL, or \"\" to turn reporting off");
  }
  if (std::any_of(s.begin(), s.end(), [](char c) { return c == ' ' || (c >= 0 && c < 0x20) || c == 0x7f; })) {
    return invalid("a URL has no spaces or control characters");
  }
  const std::string_view authority =
      s.substr(kScheme.size(), s.find_first_of("/?#", kScheme.size()) - kScheme.size());
  if (authority.empty()) return invalid("the URL has no host");
  // The reporter parses it with Boost.URL too: what passes here is what it can use.
  const auto url = boost::urls::parse_absolute_uri(s);
  if (!url) return invalid(fmt::format("not a valid URL ({})", url.error().message()));
  if (url->encoded_host().empty()) return invalid("the URL has no host");
  if (url->has_userinfo()) return invalid("a user name or password in the URL is not supported");
  if (url->has_query() || url->has_fragment()) return invalid("the URL has no query or fragment");
  if (url->has_port() && !listen_port(url->port())) {
    return invalid("the port must be a number from 1 to 65535");
  }
  return std::string(s);
}

Parsed<std::uint32_t> uid(std::string_view s) {
  const auto value = s.size() <= 10 ? decimal(s) : std::nullopt;
  if (!value || *value > std::numeric_limits<std::uint32_t>::max()) {
    return invalid("a uid is a whole number from 0 to 4294967295");
  }
  return static_cast<std::uint32_t>(*value);
}

Parsed<LogLevel> log_level(std::string_view s) {
  for (auto level : {LogLevel::debug, LogLevel::info, LogLevel::warning, LogLevel::error}) {
    if (s == to_string(level)) return level;
  }
  return invalid("expected debug, info, warning or error");
}

Parsed<LogFormat> log_format(std::string_view s) {
  for (auto format : {LogFormat::text, LogFormat::json}) {
    if (s == to_string(format)) return format;
  }
  return invalid("expected text or json");
}

Parsed<EnforcementMode> enforcement_mode(std::string_view s) {
  for (auto mode : {EnforcementMode::enforce, EnforcementMode::audit, EnforcementMode::off}) {
    if (s == to_string(mode)) return mode;
  }
  return invalid("expected enforce, audit or off");
}

Parsed<WhenAgentDown> when_agent_down(std::string_view s) {
  for (auto when : {WhenAgentDown::deny, WhenAgentDown::allow}) {
    if (s == to_string(when)) return when;
  }
  return invalid("expected deny or allow");
}

Parsed<Duration> rescan_interval(std::string_view s) {
  auto d = parse_duration(s);
  if (d && *d < std::chrono::seconds(1)) return invalid("must be at least 1s");
  return d;
}

Parsed<std::string> optional_listen(std::string_view s) {
  if (s.empty()) return std::string();
  return listen(s);
}

Parsed<std::size_t> connection_cap(std::string_view s) {
  const auto value = s.size() <= 7 ? decimal(s) : std::nullopt;
  if (!value || *value < 1 || *value > 1000000)
    return invalid("a connection cap is a whole number from 1 to 1000000");
  return static_cast<std::size_t>(*value);
}

Parsed<bool> boolean(std::string_view s) {
  if (s == "true") return true;
  if (s == "false") return false;
  return invalid("expected true or false");
}

bool is_loopback_listen(std::string_view s) {
  const auto where = parse_listen(s);
  if (!where) return false;
  if (where->host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, where->host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return ::inet_pton(AF_INET6, where->host.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

Parsed<Duration> heartbeat_interval(std::string_view s) {
  auto d = parse_duration(s);
  if (d && (*d < std::chrono::seconds(1) || *d > std::chrono::hours(1)))
    return invalid("must be from 1s to 1h");
  return d;
}

Parsed<Duration> checkpoint_interval(std::string_view s) {
  auto d = parse_duration(s);
  if (d && (*d < std::chrono::seconds(1) || *d > std::chrono::hours(24)))
    return invalid("must be from 1s to 24h");
  return d;
}

Parsed<Duration> health_interval(std::string_view s) {
  return heartbeat_interval(s);  // the same bounds: 1s to 1h
}

Parsed<Duration> health_recovery(std::string_view s) {
  auto d = parse_duration(s);
  if (d && *d > std::chrono::hours(24)) return invalid("must be from 0s to 24h");
  return d;
}

Parsed<std::uint64_t> nonfatal_threshold(std::string_view s) {
  const auto value = s.size() <= 7 ? decimal(s) : std::nullopt;
  if (!value || *value < 1 || *value > 1000000)
    return invalid("a threshold is a whole number from 1 to 1000000");
  return *value;
}

Parsed<std::string> failing_code(std::string_view s) {
  static constexpr std::array<std::string_view, 4> kFailing = {
      "pcie-fatal-error", "pcie-uncorrectable-errors", "device-unresponsive", "link-degraded"};
  if (std::find(kFailing.begin(), kFailing.end(), s) != kFailing.end()) return std::string(s);
  return invalid(
      "expected a failing code: pcie-fatal-error, pcie-uncorrectable-errors, device-unresponsive or "
      "link-degraded");
}

Parsed<std::string> optional_absolute_path(std::string_view s) {
  if (s.empty()) return std::string();
  return absolute_path(s);
}

Parsed<Duration> shutdown_grace(std::string_view s) {
  auto d = parse_duration(s);
  if (d && *d > std::chrono::seconds(300)) return invalid("must be from 0s to 300s");
  return d;
}

}  // namespace values
}  // namespace gpunode::config
