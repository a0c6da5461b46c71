// gpunode/config/config.hpp: agent.yaml (CONTRACT §2) as typed data.
//
// Loading never throws for bad input: every unknown, duplicate, mistyped or invalid key becomes a
// Problem carrying FILE:LINE:COLUMN (1-based). The column is the key's for unknown and duplicate
// keys and the value's for wrong values (CONTRACT §7).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/error/error.hpp"

namespace gpunode::config {

using Duration = std::chrono::milliseconds;

enum class LogLevel { debug, info, warning, error };
enum class LogFormat { text, json };
// CONTRACT §9: what the libvirt hook's admission does with a refusal, and what the hook answers
// when the agent cannot be asked.
enum class EnforcementMode { enforce, audit, off };
enum class WhenAgentDown { deny, allow };

struct Config {
  struct Node {
    std::string id;                             // required for `run`
    std::string owner_org;                      // required for `run`
    std::vector<std::string> unsellable_units;  // unit ids (u-...) or GPU PCI addresses
  } node;
  struct Discovery {
    std::string host_root = "/";
    std::vector<std::string> gpu_vendors{"10de", "1002"};  // 4 lower-case hex digits each
    std::vector<std::string> reservable_classes{"vfio-group", "device-request"};
    Duration rescan_interval = std::chrono::seconds(30);
  } discovery;
  struct Tls {
    std::string cert, key, client_ca;  // client_ca empty: no mTLS
  };
  struct Api {
    std::string listen = "0.0.0.0:8443";
    Tls tls;
    std::size_t max_connections = 4096;            // open HTTPS connections in all (CONTRACT §10)
    std::size_t max_connections_per_client = 256;  // ... from one IP address
  } api;
  struct Auth {
    std::string issuer;
    std::string audience = "gpunode";
    std::vector<std::string> keys;
  } auth;
  struct Admin {
    std::string socket = "/run/gpunode/admin.sock";
    std::vector<std::uint32_t> allowed_uids{0};
    std::string allowed_group = "gpunode-admin";
    std::size_t max_connections = 256;  // open admin-socket connections (CONTRACT §10)
  } admin;
  struct Libvirt {
    std::string uri = "qemu:///system";
    Duration shutdown_grace{0};
  } libvirt;
  struct Central {
    std::string url;                          // empty: reporting off
    std::string ca, client_cert, client_key;  // each required when url is set
    Duration heartbeat_interval = std::chrono::seconds(30);
  } central;
  struct Enforcement {
    EnforcementMode mode = EnforcementMode::enforce;
    WhenAgentDown when_agent_down = WhenAgentDown::deny;
  } enforcement;
  struct Metrics {
    std::string listen;         // empty: /metrics on the admin socket only; else HOST:PORT (plain HTTP)
    bool allow_remote = false;  // listen must be loopback unless true (CONTRACT §10)
  } metrics;
  struct Audit {                                           // CONTRACT §12
    Duration checkpoint_interval = std::chrono::hours(1);  // 1s to 24h
    std::string signing_key;  // an absolute path; empty: <state.dir>/audit-signing.key (signing_key_path())
  } audit;
  struct Health {  // CONTRACT §13
    bool enabled = true;
    Duration interval = std::chrono::seconds(30);  // 1s to 1h
    Duration recovery = std::chrono::minutes(10);  // link-degraded clears after this long back at width
    std::uint64_t nonfatal_threshold = 3;          // non-fatal AER errors within 24 h that fail a unit
    std::vector<std::string> ignore;               // failing codes shown as warnings instead
  } health;
  struct State {
    std::string dir = "/var/lib/gpunode";
  } state;
  struct Log {
    LogLevel level = LogLevel::info;
    LogFormat format = LogFormat::text;
  } log;
};

// The audit signing key's file: audit.signing_key, else audit-signing.key in state.dir.
std::string signing_key_path(const Config& c);

// One problem in a config file. line/column are 1-based; 0 only when the whole file is the
// problem (it cannot be read). A required key that is absent points at its parent mapping, or at
// 1:1 when that is absent too.
struct Problem {
  std::string file;
  int line = 0;
  int column = 0;
  std::string message;

  // "FILE:LINE:COLUMN: message" (or "FILE: message" without a position).
  [[nodiscard]] std::string to_string() const;
};

// What the config is checked for. `run` additionally requires node.id and node.owner_org (and the
// other keys the daemon cannot start without); `discover` accepts a file without them.
enum class Purpose { discover, run };

// A file or directory the configuration names (check-config --files, CONTRACT §11): the key, where
// its value is in the file, and what the agent needs it to be. A key the file leaves out names its
// default (state.dir, discovery.host_root) at line 0.
struct NamedFile {
  enum class Kind {
    certificate_chain,  // api.tls.cert, central.client_cert: PEM certificates, the leaf first
    private_key,        // api.tls.key, central.client_key: a PEM private key matching the chain before it
    ca_certificates,    // api.tls.client_ca, central.ca: PEM certificates to trust
    public_keys,        // auth.keys: PEM public keys, Ed25519 or P-256
    state_directory,    // state.dir: a directory the agent writes (made by the unit when missing)
    host_root,          // discovery.host_root: a root holding sys/bus/pci
  };
  std::string key;  // dotted: "api.tls.key", "auth.keys"
  int line = 0;     // 1-based; 0 for a default the file does not state
  int column = 0;
  std::string path;
  Kind kind = Kind::certificate_chain;
};

struct LoadResult {
  Config config;                  // defaults where the file says nothing; meaningful only if ok()
  std::vector<Problem> problems;  // in file order
  std::vector<NamedFile> files;   // every file the config names, in file order (defaults last)
  [[nodiscard]] bool ok() const { return problems.empty(); }
};

// The largest agent.yaml any reader takes (the agent, check-config and the hook alike).
inline constexpr std::size_t kMaxFileSize = std::size_t{1} << 20;  // no sane agent.yaml comes near

// Reads and validates a file. `file` is used verbatim in every Problem. A file that cannot be
// read (missing, a directory, over kMaxFileSize) is one Problem without a position:
// "cannot read FILE: REASON".
LoadResult load_file(const std::string& file, Purpose purpose);
// Same over text already in memory; `file` labels the problems. Text over kMaxFileSize is refused
// as load_file refuses such a file.
LoadResult load_string(std::string_view text, const std::string& file, Purpose purpose);

// "30s", "5m", "1h", "250ms", "0s", "1m30s" -> milliseconds. Else Errc::invalid, its detail
// saying what is wrong.
error::Result<Duration> parse_duration(std::string_view text);

// Where api.listen says to listen. `host` is an IPv4 address, an IPv6 address (without the
// brackets) or a DNS host name, which the caller resolves.
struct ListenAddress {
  std::string host;
  std::uint16_t port = 0;
};

// "0.0.0.0:8443", "[::1]:8443", "localhost:8443" -> host and port (1..65535). Else Errc::invalid,
// its detail saying what is wrong.
error::Result<ListenAddress> parse_listen(std::string_view text);

// SIGHUP (CONTRACT §2): the keys whose change the running agent cannot take without a restart,
// as dotted names in file order ("api.listen", "state.dir"...). What a reload does take: the TLS
// files, auth (keys, issuer, audience), log level and format, node.unsellable_units, admin's
// allowed_uids and allowed_group, and the central API's files (ca, client_cert, client_key).
std::vector<std::string> keys_needing_restart(const Config& running, const Config& fresh);

std::string_view to_string(LogLevel level);
std::string_view to_string(LogFormat format);
std::string_view to_string(EnforcementMode mode);
std::string_view to_string(WhenAgentDown when);

}  // namespace gpunode::config
