// Unit tests of gpunode::config: agent.yaml (CONTRACT §2) and its problems (CONTRACT §1, §7).
//
// Every failure class asserts the exact `FILE:LINE:COLUMN: message` a user sees from
// `gpunode-agent check-config`.
#include "gpunode/config/config.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using namespace std::chrono_literals;
using gpunode::config::Config;
using gpunode::config::Duration;
using gpunode::config::load_file;
using gpunode::config::load_string;
using gpunode::config::LoadResult;
using gpunode::config::LogFormat;
using gpunode::config::LogLevel;
using gpunode::config::parse_duration;
using gpunode::config::parse_listen;
using gpunode::config::Problem;
using gpunode::config::Purpose;

const std::string kData = GPUNODE_CONFIG_TEST_DATA;

// The problems `check-config` would print for `yaml`, one per line.
std::string problems_of(std::string_view yaml, Purpose purpose = Purpose::discover) {
  const LoadResult result = load_string(yaml, "agent.yaml", purpose);
  std::string out;
  for (const Problem& p : result.problems) out += p.to_string() + "\n";
  return out;
}

// The smallest file `run` accepts.
constexpr std::string_view kRunnable =
    "node: {id: node-1, owner_org: org-a}\n"
    "api: {tls: {cert: /etc/gpunode/server.crt, key: /etc/gpunode/server.key}}\n"
    "auth: {issuer: https://central.example, keys: [/etc/gpunode/central.pem]}\n";

void check_defaults(const Config& c) {
  CHECK(c.node.id.empty());
  CHECK(c.node.owner_org.empty());
  CHECK(c.node.unsellable_units.empty());
  CHECK(c.discovery.host_root == "/");
  CHECK(c.discovery.gpu_vendors == std::vector<std::string>{"10de", "1002"});
  CHECK(c.discovery.reservable_classes == std::vector<std::string>{"vfio-group", "device-request"});
  CHECK(c.discovery.rescan_interval == 30s);
  CHECK(c.api.listen == "0.0.0.0:8443");
  CHECK(c.api.tls.cert.empty());
  CHECK(c.api.tls.key.empty());
  CHECK(c.api.tls.client_ca.empty());
  CHECK(c.auth.issuer.empty());
  CHECK(c.auth.audience == "gpunode");
  CHECK(c.auth.keys.empty());
  CHECK(c.admin.socket == "/run/gpunode/admin.sock");
  CHECK(c.admin.allowed_uids == std::vector<std::uint32_t>{0});
  CHECK(c.admin.allowed_group == "gpunode-admin");
  CHECK(c.libvirt.uri == "qemu:///system");
  CHECK(c.libvirt.shutdown_grace == 0s);
  CHECK(c.central.url.empty());
  CHECK(c.central.ca.empty());
  CHECK(c.central.client_cert.empty());
  CHECK(c.central.client_key.empty());
  CHECK(c.central.heartbeat_interval == 30s);
  CHECK(c.enforcement.mode == gpunode::config::EnforcementMode::enforce);
  CHECK(c.enforcement.when_agent_down == gpunode::config::WhenAgentDown::deny);
  CHECK(c.metrics.listen.empty());
  CHECK(c.state.dir == "/var/lib/gpunode");
  CHECK(c.log.level == LogLevel::info);
  CHECK(c.log.format == LogFormat::text);
}

// A temporary directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "gpunode-config-test-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string write(const std::string& name, std::string_view content) const {
    const std::string file = (path_ / name).string();
    std::ofstream(file, std::ios::binary).write(content.data(), static_cast<std::streamsize>(content.size()));
    return file;
  }

 private:
  std::filesystem::path path_;
};

std::string random_bytes(std::mt19937& rng, std::size_t n, std::string_view alphabet = {}) {
  std::string out(n, '\0');
  for (char& c : out) {
    if (alphabet.empty()) {
      c = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
    } else {
      c = alphabet[std::uniform_int_distribution<std::size_t>(0, alphabet.size() - 1)(rng)];
    }
  }
  return out;
}

}  // namespace

TEST_CASE("the contract's example loads for run with every value as written") {
  const std::string file = kData + "/contract_example.yaml";
  const LoadResult r = load_file(file, Purpose::run);
  REQUIRE(r.problems.empty());
  const Config& c = r.config;
  CHECK(c.node.id == "node-7f3a");
  CHECK(c.node.owner_org == "org-acme");
  CHECK(c.node.unsellable_units.empty());
  CHECK(c.discovery.host_root == "/");
  CHECK(c.discovery.gpu_vendors == std::vector<std::string>{"10de", "1002"});
  CHECK(c.discovery.reservable_classes == std::vector<std::string>{"vfio-group", "device-request"});
  CHECK(c.discovery.rescan_interval == 30s);
  CHECK(c.api.listen == "0.0.0.0:8443");
  CHECK(c.api.tls.cert == "/etc/gpunode/tls/server.crt");
  CHECK(c.api.tls.key == "/etc/gpunode/tls/server.key");
  CHECK(c.api.tls.client_ca == "/etc/gpunode/tls/client-ca.crt");
  CHECK(c.auth.issuer == "https://central.example");
  CHECK(c.auth.audience == "gpunode");
  CHECK(c.auth.keys == std::vector<std::string>{"/etc/gpunode/keys/central-ed25519.pem",
                                                "/etc/gpunode/keys/central-p256.pem"});
  CHECK(c.admin.socket == "/run/gpunode/admin.sock");
  CHECK(c.admin.allowed_uids == std::vector<std::uint32_t>{0});
  CHECK(c.admin.allowed_group == "gpunode-admin");
  CHECK(c.libvirt.uri == "qemu:///system");
  CHECK(c.libvirt.shutdown_grace == 0s);
  CHECK(c.central.url == "https://central.example/api");
  CHECK(c.central.ca == "/etc/gpunode/central/ca.crt");
  CHECK(c.central.client_cert == "/etc/gpunode/central/client.crt");
  CHECK(c.central.client_key == "/etc/gpunode/central/client.key");
  CHECK(c.state.dir == "/var/lib/gpunode");
  CHECK(c.log.level == LogLevel::info);
  CHECK(c.log.format == LogFormat::text);
}

TEST_CASE("values other than the defaults are read and normalised") {
  const LoadResult r = load_string(
      "node:\n"
      "  unsellable_units: [u-0000-C1-00-0, \"0000:41:00.1\", \"0000:0A:1F.7\"]\n"
      "discovery:\n"
      "  host_root: /srv/fixture-host\n"
      "  gpu_vendors: [10DE, \"8086\"]\n"
      "  reservable_classes: [device-request]\n"
      "  rescan_interval: 1m30s\n"
      "api: {listen: \"[::1]:9443\"}\n"
      "admin: {allowed_uids: [0, 1000, 4294967295], allowed_group: \"\"}\n"
      "libvirt: {uri: \"test:///tmp/host.xml\", shutdown_grace: 5m}\n"
      "log: {level: debug, format: json}\n",
      "agent.yaml", Purpose::discover);
  REQUIRE(r.problems.empty());
  const Config& c = r.config;
  CHECK(c.node.unsellable_units ==
        std::vector<std::string>{"u-0000-c1-00-0", "0000:41:00.1", "0000:0a:1f.7"});
  CHECK(c.discovery.host_root == "/srv/fixture-host");
  CHECK(c.discovery.gpu_vendors == std::vector<std::string>{"10de", "8086"});
  CHECK(c.discovery.reservable_classes == std::vector<std::string>{"device-request"});
  CHECK(c.discovery.rescan_interval == 90s);
  CHECK(c.api.listen == "[::1]:9443");
  CHECK(c.admin.allowed_uids == std::vector<std::uint32_t>{0, 1000, 4294967295u});
  CHECK(c.admin.allowed_group.empty());
  CHECK(c.libvirt.uri == "test:///tmp/host.xml");
  CHECK(c.libvirt.shutdown_grace == 300s);
  CHECK(c.log.level == LogLevel::debug);
  CHECK(c.log.format == LogFormat::json);
}

TEST_CASE("an empty file holds every default and is valid for discover") {
  for (std::string_view empty :
       {"", "\n\n", "# only a comment\n", "---\n", "node:\napi:\n  tls:\ncentral:\n"}) {
    CAPTURE(empty);
    const LoadResult r = load_string(empty, "agent.yaml", Purpose::discover);
    CHECK(problems_of(empty) == "");
    check_defaults(r.config);
  }
}

TEST_CASE("absent keys keep their defaults beside the keys that are set") {
  const LoadResult r = load_string("log:\n  level: error\n", "agent.yaml", Purpose::discover);
  REQUIRE(r.ok());
  CHECK(r.config.log.level == LogLevel::error);
  Config expected = r.config;
  expected.log.level = LogLevel::info;
  check_defaults(expected);
}

TEST_CASE("an empty file is invalid for run: each missing key at 1:1") {
  CHECK(problems_of("", Purpose::run) ==
        "agent.yaml:1:1: missing required key \"node.id\"\n"
        "agent.yaml:1:1: missing required key \"node.owner_org\"\n"
        "agent.yaml:1:1: missing required key \"api.tls.cert\"\n"
        "agent.yaml:1:1: missing required key \"api.tls.key\"\n"
        "agent.yaml:1:1: missing required key \"auth.issuer\"\n"
        "agent.yaml:1:1: missing required key \"auth.keys\"\n");
  CHECK(problems_of(kRunnable, Purpose::run) == "");
}

TEST_CASE("run: a missing key is reported at its mapping, an empty one at its value") {
  constexpr std::string_view yaml =
      "node:\n"
      "  owner_org: org-acme\n"
      "api:\n"
      "  tls:\n"
      "    cert: /etc/gpunode/server.crt\n"
      "auth:\n"
      "  issuer: \"\"\n"
      "  keys: []\n";
  CHECK(problems_of(yaml, Purpose::run) ==
        "agent.yaml:2:3: missing required key \"node.id\"\n"
        "agent.yaml:5:5: missing required key \"api.tls.key\"\n"
        "agent.yaml:7:11: auth.issuer must not be empty to run the agent\n"
        "agent.yaml:8:9: auth.keys must not be empty to run the agent\n");
  CHECK(problems_of(yaml, Purpose::discover) == "");

  // An absent mapping: the nearest enclosing one; a null one: its key.
  CHECK(problems_of("node: {id: n, owner_org: o}\napi:\n  listen: \"0.0.0.0:8443\"\nauth:\n", Purpose::run) ==
        "agent.yaml:3:3: missing required key \"api.tls.cert\"\n"
        "agent.yaml:3:3: missing required key \"api.tls.key\"\n"
        "agent.yaml:4:1: missing required key \"auth.issuer\"\n"
        "agent.yaml:4:1: missing required key \"auth.keys\"\n");
  // A key that is there but invalid is reported once, as invalid.
  CHECK(problems_of(std::string(kRunnable) + "node: {id: \"\"}\n", Purpose::run) ==
        "agent.yaml:4:1: duplicate top-level key \"node\" (first at line 1)\n");
  CHECK(problems_of("node: {id: \"\", owner_org:}\n", Purpose::run)
            .starts_with("agent.yaml:1:1: missing required key \"api.tls.cert\"\n"
                         "agent.yaml:1:1: missing required key \"api.tls.key\"\n"
                         "agent.yaml:1:1: missing required key \"auth.issuer\"\n"
                         "agent.yaml:1:1: missing required key \"auth.keys\"\n"
                         "agent.yaml:1:12: invalid value \"\" for node.id: use 1 to 128 of the characters "
                         "A-Z a-z 0-9 . _ -\n"
                         "agent.yaml:1:16: node.owner_org needs a value\n"));
}

TEST_CASE("run: central reporting needs the CA, the client certificate and key") {
  const std::string yaml = std::string(kRunnable) +
                           "central:\n"
                           "  url: https://central.example\n"
                           "  ca: /etc/gpunode/central-ca.crt\n"
                           "  client_cert: /etc/gpunode/client.crt\n"
                           "  client_key: \"\"\n";
  CHECK(problems_of(yaml, Purpose::run) ==
        "agent.yaml:8:15: central.client_key must not be empty to run the agent\n");
  CHECK(problems_of(std::string(kRunnable) + "central: {url: https://c.example}\n", Purpose::run) ==
        "agent.yaml:4:10: missing required key \"central.ca\"\n"
        "agent.yaml:4:10: missing required key \"central.client_cert\"\n"
        "agent.yaml:4:10: missing required key \"central.client_key\"\n");
  // discover does not report, so it needs none of them
  CHECK(problems_of(std::string(kRunnable) + "central: {url: https://c.example}\n", Purpose::discover) == "");
  CHECK(problems_of(std::string(kRunnable) + "central: {url: \"\"}\n", Purpose::run) == "");
}

TEST_CASE("unknown keys are reported at the key, with the key that was likely meant") {
  CHECK(problems_of("nodes:\n"
                    "  id: x\n"
                    "api:\n"
                    "  listne: \"0.0.0.0:8443\"\n"
                    "  tls:\n"
                    "    cert: /c\n"
                    "    clientca: /ca\n"
                    "log:\n"
                    "  colour: true\n"
                    "  Level: info\n") ==
        "agent.yaml:1:1: unknown top-level key \"nodes\" (did you mean \"node\"?)\n"
        "agent.yaml:4:3: unknown key \"listne\" in api (did you mean \"listen\"?)\n"
        "agent.yaml:7:5: unknown key \"clientca\" in api.tls (did you mean \"client_ca\"?)\n"
        "agent.yaml:9:3: unknown key \"colour\" in log\n"
        "agent.yaml:10:3: unknown key \"Level\" in log (did you mean \"level\"?)\n");
}

TEST_CASE("keys that are not strings are reported at the key") {
  CHECK(problems_of("? [node]\n: 1\napi:\n  {a: 1}: 2\n") ==
        "agent.yaml:1:3: a top-level key must be a string, not a list\n"
        "agent.yaml:4:3: a key in api must be a string, not a mapping\n");
}

TEST_CASE("duplicate keys are reported at the second key; the first one counts") {
  const std::string_view yaml =
      "node:\n"
      "  id: a\n"
      "  owner_org: org-a\n"
      "  id: b\n"
      "node:\n"
      "  id: c\n"
      "log: {level: info, level: debug}\n";
  CHECK(problems_of(yaml) ==
        "agent.yaml:4:3: duplicate key \"id\" in node (first at line 2)\n"
        "agent.yaml:5:1: duplicate top-level key \"node\" (first at line 1)\n"
        "agent.yaml:7:20: duplicate key \"level\" in log (first at line 7)\n");
  const LoadResult r = load_string(yaml, "agent.yaml", Purpose::discover);
  CHECK(r.config.node.id == "a");
  CHECK(r.config.log.level == LogLevel::info);
}

TEST_CASE("wrong types are reported at the value") {
  CHECK(problems_of("node:\n"
                    "  id: [a, b]\n"
                    "  unsellable_units: {u: 1}\n"
                    "api: \"0.0.0.0:8443\"\n"
                    "discovery:\n"
                    "  gpu_vendors: 10de\n"
                    "  reservable_classes: [[vfio-group]]\n"
                    "  rescan_interval: [30s]\n"
                    "log:\n"
                    "  level: {a: b}\n") ==
        "agent.yaml:2:7: node.id must be a string, not a list\n"
        "agent.yaml:3:21: node.unsellable_units must be a list, not a mapping\n"
        "agent.yaml:4:6: api must be a mapping, not a scalar\n"
        "agent.yaml:6:16: discovery.gpu_vendors must be a list, not a scalar\n"
        "agent.yaml:7:24: entries of discovery.reservable_classes must be scalars, not a list\n"
        "agent.yaml:8:20: discovery.rescan_interval must be a duration, not a list\n"
        "agent.yaml:10:10: log.level must be a string, not a mapping\n");
}

TEST_CASE("a top level that is not a mapping is one problem, also for run") {
  CHECK(problems_of("- node\n- api\n", Purpose::run) ==
        "agent.yaml:1:1: the top level must be a mapping, not a list\n");
  CHECK(problems_of("# comment\nnode-7f3a\n", Purpose::run) ==
        "agent.yaml:2:1: the top level must be a mapping, not a scalar\n");
  // A section that is not a mapping: its keys are not reported missing.
  CHECK(problems_of(std::string(kRunnable) + "api: 8443\n", Purpose::run) ==
        "agent.yaml:4:1: duplicate top-level key \"api\" (first at line 2)\n");
  CHECK(problems_of("node: [n]\napi: {tls: {cert: /c, key: /k}}\nauth: {issuer: i, keys: [/k]}\n",
                    Purpose::run) == "agent.yaml:1:7: node must be a mapping, not a list\n");
}

TEST_CASE("a key with nothing after it needs a value; [] is an empty list") {
  const std::string_view yaml =
      "node:\n"
      "  id:\n"
      "  unsellable_units:\n"
      "discovery:\n"
      "  gpu_vendors: []\n"
      "  rescan_interval: ~\n"
      "admin:\n"
      "  allowed_uids: []\n"
      "  socket: null\n"
      "central:\n";
  CHECK(problems_of(yaml) ==
        "agent.yaml:2:3: node.id needs a value\n"
        "agent.yaml:3:3: node.unsellable_units needs a value (write [] for an empty list)\n"
        "agent.yaml:6:3: discovery.rescan_interval needs a value\n"
        "agent.yaml:9:3: admin.socket needs a value\n");
  const LoadResult r = load_string(yaml, "agent.yaml", Purpose::discover);
  CHECK(r.config.discovery.gpu_vendors.empty());
  CHECK(r.config.admin.allowed_uids.empty());
  CHECK(problems_of("node:\n  unsellable_units:\n    -\n    - \"0000:41:00.0\"\n    - ~\n") ==
        "agent.yaml:3:5: entry 1 of node.unsellable_units is empty\n"
        "agent.yaml:3:5: entry 3 of node.unsellable_units is empty\n");
  CHECK(problems_of("node: {owner_org: \"null\"}\n") == "");  // quoted: a string
}

TEST_CASE("bad ids are reported at the value") {
  CHECK(problems_of("node:\n  id: \"node 7\"\n  owner_org: " + std::string(129, 'o') + "\n") ==
        "agent.yaml:2:7: invalid value \"node 7\" for node.id: use 1 to 128 of the characters A-Z a-z 0-9 . "
        "_ -\n"
        "agent.yaml:3:14: invalid value \"" +
            std::string(60, 'o') +
            "\"... for node.owner_org: use 1 to 128 of the characters A-Z a-z 0-9 . _ -\n");
  CHECK(problems_of("node: {id: " + std::string(128, 'n') + ", owner_org: Org_A.b-1}\n") == "");
  // Values and keys are quoted with escapes, so a message is one printable line.
  CHECK(problems_of("node: {id: 'a\"b\\c\tx'}\n\"a\\u0001\\nb\": 1\n") ==
        "agent.yaml:1:12: invalid value \"a\\\"b\\\\c\\tx\" for node.id: use 1 to 128 of the characters A-Z "
        "a-z 0-9 . _ "
        "-\n"
        "agent.yaml:2:1: unknown top-level key \"a\\x01\\nb\"\n");
  // NEL (U+0085) is a C1 control like CSI: escaped too, so no terminal takes it for a new line.
  CHECK(problems_of("\"a\\u0085b\\u009b\": 1\n") ==
        "agent.yaml:1:1: unknown top-level key \"a\\xc2\\x85b\\xc2\\x9b\"\n");
}

TEST_CASE("bad gpu vendors and reservable classes are reported at the entry") {
  CHECK(
      problems_of("discovery:\n  gpu_vendors: [\"10de\", 10d, nvidia, 0x10de]\n"
                  "  reservable_classes: [vfio-group, vfio]\n") ==
      "agent.yaml:2:25: invalid entry \"10d\" in discovery.gpu_vendors: a vendor id is 4 hex digits, e.g. "
      "10de\n"
      "agent.yaml:2:30: invalid entry \"nvidia\" in discovery.gpu_vendors: a vendor id is 4 hex digits, e.g. "
      "10de\n"
      "agent.yaml:2:38: invalid entry \"0x10de\" in discovery.gpu_vendors: a vendor id is 4 hex digits, e.g. "
      "10de\n"
      "agent.yaml:3:36: invalid entry \"vfio\" in discovery.reservable_classes: expected vfio-group or "
      "device-request\n");
}

TEST_CASE("bad unsellable units are reported at the entry") {
  const std::string why = ": expected a unit id like u-0000-41-00-0 or a PCI address like 0000:41:00.0\n";
  CHECK(problems_of("node:\n"
                    "  unsellable_units:\n"
                    "    - u-0000-41-00-0\n"
                    "    - u-0000-41-20-0\n"
                    "    - \"0000:41:00.8\"\n"
                    "    - gpu0\n"
                    "    - \"41:00.0\"\n"
                    "    - u-0000-41-00-00\n") ==
        "agent.yaml:4:7: invalid entry \"u-0000-41-20-0\" in node.unsellable_units" + why +
            "agent.yaml:5:7: invalid entry \"0000:41:00.8\" in node.unsellable_units" + why +
            "agent.yaml:6:7: invalid entry \"gpu0\" in node.unsellable_units" + why +
            "agent.yaml:7:7: invalid entry \"41:00.0\" in node.unsellable_units" + why +
            "agent.yaml:8:7: invalid entry \"u-0000-41-00-00\" in node.unsellable_units" + why);
}

TEST_CASE("a bad api.listen is reported at the value") {
  CHECK(problems_of("api:\n  listen: \"0.0.0.0:99999\"\n") ==
        "agent.yaml:2:11: invalid value \"0.0.0.0:99999\" for api.listen: the port must be a number from 1 "
        "to 65535\n");
  CHECK(problems_of("api:\n  listen: \"::1:8443\"\n") ==
        "agent.yaml:2:11: invalid value \"::1:8443\" for api.listen: put an IPv6 address in brackets, e.g. "
        "[::]:8443\n");
  CHECK(problems_of("api:\n  listen: 8443\n") ==
        "agent.yaml:2:11: invalid value \"8443\" for api.listen: expected HOST:PORT or [IPv6]:PORT, e.g. "
        "0.0.0.0:8443\n");
}

TEST_CASE("parse_listen: host and port") {
  struct Good {
    std::string_view text, host;
    std::uint16_t port;
  };
  for (const Good& g : {Good{"0.0.0.0:8443", "0.0.0.0", 8443}, Good{"127.0.0.1:1", "127.0.0.1", 1},
                        Good{"[::]:8443", "::", 8443}, Good{"[fe80::1:2]:65535", "fe80::1:2", 65535},
                        Good{"localhost:8443", "localhost", 8443},
                        Good{"gpu-7.example.com.:443", "gpu-7.example.com.", 443}}) {
    CAPTURE(g.text);
    const auto parsed = parse_listen(g.text);
    REQUIRE(parsed.has_value());
    CHECK(parsed->host == g.host);
    CHECK(parsed->port == g.port);
  }
  struct Bad {
    std::string_view text, error;
  };
  constexpr std::string_view form = "expected HOST:PORT or [IPv6]:PORT, e.g. 0.0.0.0:8443";
  constexpr std::string_view port = "the port must be a number from 1 to 65535";
  for (const Bad& b :
       {Bad{"", form}, Bad{"8443", form}, Bad{"[::1]8443", form},
        Bad{":8443", "the host is missing, e.g. 0.0.0.0:8443"}, Bad{"0.0.0.0:0", port},
        Bad{"0.0.0.0:65536", port}, Bad{"0.0.0.0:", port}, Bad{"0.0.0.0:+1", port}, Bad{"0.0.0.0:0x10", port},
        Bad{"0.0.0.0:000008443", port}, Bad{"::1:8443", "put an IPv6 address in brackets, e.g. [::]:8443"},
        Bad{"[::1:8443", "missing ']' after the IPv6 address"},
        Bad{"[1.2.3.4]:80", "\"1.2.3.4\" is not an IPv6 address"},
        Bad{"300.1.1.1:80", "\"300.1.1.1\" is not an IP address or host name"},
        Bad{"-gpu-:80", "\"-gpu-\" is not an IP address or host name"},
        Bad{"a b:80", "\"a b\" is not an IP address or host name"},
        Bad{"a..b:80", "\"a..b\" is not an IP address or host name"}}) {
    CAPTURE(b.text);
    const auto parsed = parse_listen(b.text);
    REQUIRE_FALSE(parsed.has_value());
    CHECK(parsed.error().detail == b.error);
    CHECK(parsed.error().code == gpunode::error::Errc::invalid);
  }
}

TEST_CASE("bad admin uids, socket and paths are reported at the value") {
  const std::string uid = ": a uid is a whole number from 0 to 4294967295\n";
  CHECK(problems_of("admin:\n  allowed_uids: [0, -1, 4294967296, 1.5, \"+1\", 99999999999999999999999]\n") ==
        "agent.yaml:2:21: invalid entry \"-1\" in admin.allowed_uids" + uid +
            "agent.yaml:2:25: invalid entry \"4294967296\" in admin.allowed_uids" + uid +
            "agent.yaml:2:37: invalid entry \"1.5\" in admin.allowed_uids" + uid +
            "agent.yaml:2:42: invalid entry \"+1\" in admin.allowed_uids" + uid +
            "agent.yaml:2:48: invalid entry \"99999999999999999999999\" in admin.allowed_uids" + uid);
  const std::string long_socket = "/run/" + std::string(103, 's');  // 108 bytes
  CHECK(problems_of("admin:\n  socket: run/admin.sock\n"
                    "discovery: {host_root: sys}\n"
                    "state:\n  dir: \"\"\n"
                    "---\n") ==
        "agent.yaml:2:11: invalid value \"run/admin.sock\" for admin.socket: must be an absolute path, "
        "starting "
        "with /\n"
        "agent.yaml:3:24: invalid value \"sys\" for discovery.host_root: must be an absolute path, starting "
        "with /\n"
        "agent.yaml:5:8: invalid value \"\" for state.dir: must be an absolute path, starting with /\n");
  CHECK(problems_of("admin: {socket: " + long_socket + "}\n") ==
        "agent.yaml:1:17: invalid value \"/run/" + std::string(55, 's') +
            "\"... for admin.socket: a socket path is at most 107 bytes\n");
  CHECK(problems_of("admin: {socket: " + long_socket.substr(0, 107) + "}\n") == "");  // 107 bytes fit
}

TEST_CASE("bad log level and format, libvirt uri, audience and central url are reported at the value") {
  CHECK(problems_of("log:\n  level: verbose\n  format: xml\n"
                    "libvirt: {uri: \"\"}\n"
                    "auth: {audience: \"\", keys: [\"\"]}\n"
                    "central:\n  url: http://central.example\n") ==
        "agent.yaml:2:10: invalid value \"verbose\" for log.level: expected debug, info, warning or error\n"
        "agent.yaml:3:11: invalid value \"xml\" for log.format: expected text or json\n"
        "agent.yaml:4:16: invalid value \"\" for libvirt.uri: must not be empty\n"
        "agent.yaml:5:18: invalid value \"\" for auth.audience: must not be empty\n"
        "agent.yaml:5:29: invalid entry \"\" in auth.keys: must not be empty\n"
        "agent.yaml:7:8: invalid value \"http://central.example\" for central.url: expected an https:// URL, "
        "or "
        "\"\" to turn reporting off\n");
  CHECK(problems_of("central: {url: \"https://\"}\n") ==
        "agent.yaml:1:16: invalid value \"https://\" for central.url: the URL has no host\n");
  CHECK(problems_of("central: {url: \"https://a b\"}\n") ==
        "agent.yaml:1:16: invalid value \"https://a b\" for central.url: a URL has no spaces or control "
        "characters\n");
  CHECK(problems_of("central: {url: \"https://user:pw@c.example\"}\n") ==
        "agent.yaml:1:16: invalid value \"https://user:pw@c.example\" for central.url: a user name or "
        "password in "
        "the URL is not supported\n");
  CHECK(
      problems_of("central: {url: \"https://c.example/api?x=1\"}\n") ==
      "agent.yaml:1:16: invalid value \"https://c.example/api?x=1\" for central.url: the URL has no query or "
      "fragment\n");
  CHECK(
      problems_of("central: {url: \"https://c.example:99999\"}\n") ==
      "agent.yaml:1:16: invalid value \"https://c.example:99999\" for central.url: the port must be a number "
      "from 1 to 65535\n");
  CHECK(problems_of("central: {url: \"https://c.example:8443/api/\"}\n") == "");
  CHECK(problems_of("central: {url: \"https://[::1]:8443\"}\n") == "");
  CHECK(problems_of("state: {dir: \"/var/lib/\\0gpunode\"}\n") ==
        "agent.yaml:1:14: invalid value \"/var/lib/\\x00gpunode\" for state.dir: must not contain a NUL "
        "character\n");
}

TEST_CASE("bad durations are reported at the value, and their ranges are checked") {
  CHECK(
      problems_of("discovery:\n  rescan_interval: 30\n"
                  "libvirt:\n  shutdown_grace: 99999999999999h\n") ==
      "agent.yaml:2:20: invalid value \"30\" for discovery.rescan_interval: duration needs a unit, e.g. 30s\n"
      "agent.yaml:4:19: invalid value \"99999999999999h\" for libvirt.shutdown_grace: duration is too "
      "large\n");
  CHECK(problems_of("discovery: {rescan_interval: 999ms}\nlibvirt: {shutdown_grace: 5m1ms}\n") ==
        "agent.yaml:1:30: invalid value \"999ms\" for discovery.rescan_interval: must be at least 1s\n"
        "agent.yaml:2:27: invalid value \"5m1ms\" for libvirt.shutdown_grace: must be from 0s to 300s\n");
  CHECK(problems_of("discovery: {rescan_interval: 1s}\nlibvirt: {shutdown_grace: 300s}\n") == "");
  CHECK(problems_of("central: {heartbeat_interval: 500ms}\n") ==
        "agent.yaml:1:31: invalid value \"500ms\" for central.heartbeat_interval: must be from 1s to 1h\n");
  CHECK(problems_of("central: {heartbeat_interval: 1h1s}\n") ==
        "agent.yaml:1:31: invalid value \"1h1s\" for central.heartbeat_interval: must be from 1s to 1h\n");
  CHECK(problems_of("audit: {checkpoint_interval: 500ms, signing_key: keys/audit.pem}\n") ==
        "agent.yaml:1:30: invalid value \"500ms\" for audit.checkpoint_interval: must be from 1s to 24h\n"
        "agent.yaml:1:50: invalid value \"keys/audit.pem\" for audit.signing_key: must be an absolute path, "
        "starting with /\n");
  {
    const LoadResult a =
        load_string("audit: {checkpoint_interval: 1s, signing_key: /etc/gpunode/audit.pem}\n", "agent.yaml",
                    Purpose::discover);
    REQUIRE(a.ok());
    CHECK(a.config.audit.checkpoint_interval == 1s);
    CHECK(gpunode::config::signing_key_path(a.config) == "/etc/gpunode/audit.pem");
    const LoadResult d = load_string("state: {dir: /srv/gpunode}\n", "agent.yaml", Purpose::discover);
    CHECK(d.config.audit.checkpoint_interval == std::chrono::hours(1));
    CHECK(gpunode::config::signing_key_path(d.config) == "/srv/gpunode/audit-signing.key");
  }
  CHECK(problems_of("central: {heartbeat_interval: 30}\n") ==
        "agent.yaml:1:31: invalid value \"30\" for central.heartbeat_interval: duration needs a unit, e.g. "
        "30s\n");
  CHECK(problems_of("enforcement: {mode: permissive, when_agent_down: maybe}\n") ==
        "agent.yaml:1:21: invalid value \"permissive\" for enforcement.mode: expected enforce, audit or off\n"
        "agent.yaml:1:50: invalid value \"maybe\" for enforcement.when_agent_down: expected deny or allow\n");
  {
    const LoadResult e =
        load_string("enforcement: {mode: audit, when_agent_down: allow}\n", "agent.yaml", Purpose::discover);
    REQUIRE(e.ok());
    CHECK(e.config.enforcement.mode == gpunode::config::EnforcementMode::audit);
    CHECK(e.config.enforcement.when_agent_down == gpunode::config::WhenAgentDown::allow);
  }
  const LoadResult r = load_string("central: {heartbeat_interval: 1m30s}\n", "agent.yaml", Purpose::discover);
  REQUIRE(r.ok());
  CHECK(r.config.central.heartbeat_interval == 90s);
}

TEST_CASE("metrics.listen: empty, or an address to listen on") {
  CHECK(problems_of("metrics: {listen: \"\"}\n") == "");
  CHECK(problems_of("metrics: {listen: \"127.0.0.1:9464\"}\n") == "");
  CHECK(problems_of("metrics: {listen: \"127.0.0.1\"}\n") ==
        "agent.yaml:1:19: invalid value \"127.0.0.1\" for metrics.listen: expected HOST:PORT or [IPv6]:PORT, "
        "e.g. "
        "0.0.0.0:8443\n");
  CHECK(problems_of("metrics: {listne: x}\n") ==
        "agent.yaml:1:11: unknown key \"listne\" in metrics (did you mean \"listen\"?)\n");
  const LoadResult r = load_string("metrics: {listen: \"[::1]:9464\"}\n", "agent.yaml", Purpose::run);
  CHECK(r.config.metrics.listen == "[::1]:9464");
}

TEST_CASE(
    "keys_needing_restart: the heartbeat interval and metrics.listen need a restart, the central files do "
    "not") {
  Config a, b;
  b.central.ca = "/new/ca.crt";
  b.central.client_cert = "/new/client.crt";
  b.central.client_key = "/new/client.key";
  CHECK(gpunode::config::keys_needing_restart(a, b).empty());
  b.central.heartbeat_interval = 10s;
  b.metrics.listen = "127.0.0.1:9464";
  CHECK(gpunode::config::keys_needing_restart(a, b) ==
        std::vector<std::string>{"central.heartbeat_interval", "metrics.listen"});
}

TEST_CASE("parse_duration: good and bad durations") {
  struct Good {
    std::string_view text;
    Duration value;
  };
  for (const Good& g : {Good{"30s", 30s}, Good{"5m", 5min}, Good{"1h", 1h}, Good{"250ms", 250ms},
                        Good{"0s", 0s}, Good{"1m30s", 90s}, Good{"1h2m3s4ms", 1h + 2min + 3s + 4ms},
                        Good{"0010s", 10s}, Good{"9223372036854775807ms", Duration(9223372036854775807)}}) {
    CAPTURE(g.text);
    const auto parsed = parse_duration(g.text);
    REQUIRE(parsed.has_value());
    CHECK(*parsed == g.value);
  }
  struct Bad {
    std::string_view text, error;
  };
  constexpr std::string_view unit = "duration needs a unit, e.g. 30s";
  constexpr std::string_view large = "duration is too large";
  constexpr std::string_view order = "units go from largest to smallest, each once, e.g. 1h30m";
  for (const Bad& b : {Bad{"", "empty duration, e.g. 30s"},
                       Bad{"30", unit},
                       Bad{"0", unit},
                       Bad{"1m30", unit},
                       Bad{"-5s", "a duration cannot be negative"},
                       Bad{"1.5s", "use whole numbers, e.g. 1500ms instead of 1.5s"},
                       Bad{"5d", "unknown unit \"d\" (use ms, s, m or h)"},
                       Bad{"30S", "unknown unit \"S\" (use ms, s, m or h)"},
                       Bad{"30sec", "unknown unit \"sec\" (use ms, s, m or h)"},
                       Bad{"30 s", "unexpected \" \" in duration, e.g. 1m30s"},
                       Bad{"+30s", "expected a number at \"+30s\", e.g. 30s"},
                       Bad{"s", "expected a number at \"s\", e.g. 30s"},
                       Bad{"30s1m", order},
                       Bad{"1s1s", order},
                       Bad{"1ms1s", order},
                       Bad{"99999999999999h", large},
                       Bad{"99999999999999999999s", large},
                       Bad{"9223372036854775808ms", large},
                       Bad{"9223372036854776s", large},
                       Bad{"2562047788015215h30m", large}}) {
    CAPTURE(b.text);
    const auto parsed = parse_duration(b.text);
    REQUIRE_FALSE(parsed.has_value());
    CHECK(parsed.error().detail == b.error);
    CHECK(parsed.error().code == gpunode::error::Errc::invalid);  // a malformed value, never the system's
    CHECK(parsed.error().origin == gpunode::error::Native::none);
  }
}

TEST_CASE("syntax errors are one problem at the parser's position") {
  CHECK(problems_of("node:\n  id: x\n  unsellable_units: [u-0000-41-00-0\nlog: {}\n") ==
        "agent.yaml:4:4: syntax error: end of sequence flow not found\n");
  CHECK(problems_of("node:\n  id: a: b\n") == "agent.yaml:2:8: syntax error: illegal map value\n");
  CHECK(problems_of("node: {id: x}}\n") == "agent.yaml:1:14: syntax error: illegal flow end\n");
  CHECK(problems_of("auth:\n  keys: *keys\n") ==
        "agent.yaml:2:9: syntax error: the referenced anchor is not defined\n");
  CHECK(problems_of("node:\n\tid: x\n") ==
        "agent.yaml:2:1: syntax error: tab in indentation (YAML indents with spaces)\n");
  CHECK(problems_of("node:\n  id: x\n \towner_org: y\n") ==
        "agent.yaml:3:2: syntax error: tab in indentation (YAML indents with spaces)\n");
  // yaml-cpp 0.7 lets an unclosed quote run to the end of the file, swallowing the keys after it.
  CHECK(problems_of("auth:\n  issuer: \"https://central.example\nlog: {level: debug}\n") ==
        "agent.yaml:2:11: syntax error: this quoted string is never closed\n");
  CHECK(problems_of("node:\n  id: 'node-7\n") ==
        "agent.yaml:2:7: syntax error: this quoted string is never closed\n");
  CHECK(problems_of("node: {id: 'it''s', owner_org: \"a\\\"b\"}\n").find("never closed") ==
        std::string::npos);
  CHECK(problems_of("log: {level: info\n", Purpose::run) ==
        "agent.yaml:2:1: syntax error: end of map flow not found\n");
  // yaml-cpp 0.7 never consumes a ',' outside brackets (its LoadAll then loops forever).
  CHECK(problems_of(",") == "agent.yaml:1:1: syntax error: unexpected \",\"\n");
  CHECK(problems_of("{node: {id: a}},\n") == "agent.yaml:1:16: syntax error: unexpected \",\"\n");
  CHECK(problems_of(std::string(100000, '[')) == "agent.yaml:1:1: syntax error: nesting is too deep\n");
}

TEST_CASE("a second YAML document is a problem; a trailing --- is not") {
  CHECK(problems_of("log: {level: info}\n---\nlog: {level: debug}\n") ==
        "agent.yaml:3:1: a config file holds one YAML document; this is a second one\n");
  CHECK(problems_of("---\nlog: {level: info}\n---\n") == "");
}

TEST_CASE("every problem is reported, in file order") {
  CHECK(
      problems_of("log:\n"
                  "  level: loud\n"
                  "node:\n"
                  "  id: a/b\n"
                  "  extra: 1\n"
                  "api:\n"
                  "  listen: nowhere\n",
                  Purpose::run) ==
      "agent.yaml:1:1: missing required key \"auth.issuer\"\n"
      "agent.yaml:1:1: missing required key \"auth.keys\"\n"
      "agent.yaml:2:10: invalid value \"loud\" for log.level: expected debug, info, warning or error\n"
      "agent.yaml:4:3: missing required key \"node.owner_org\"\n"
      "agent.yaml:4:7: invalid value \"a/b\" for node.id: use 1 to 128 of the characters A-Z a-z 0-9 . _ -\n"
      "agent.yaml:5:3: unknown key \"extra\" in node\n"
      "agent.yaml:7:3: missing required key \"api.tls.cert\"\n"
      "agent.yaml:7:3: missing required key \"api.tls.key\"\n"
      "agent.yaml:7:11: invalid value \"nowhere\" for api.listen: expected HOST:PORT or [IPv6]:PORT, e.g. "
      "0.0.0.0:8443\n");
}

TEST_CASE("files that cannot be read are one problem without a position") {
  const LoadResult missing = load_file("/nonexistent/gpunode/agent.yaml", Purpose::run);
  REQUIRE(missing.problems.size() == 1);
  CHECK(missing.problems[0].line == 0);
  CHECK(missing.problems[0].to_string() ==
        "/nonexistent/gpunode/agent.yaml: cannot read the file: No such file or directory");

  const LoadResult directory = load_file(kData, Purpose::discover);
  REQUIRE(directory.problems.size() == 1);
  CHECK(directory.problems[0].message == "cannot read the file: Is a directory");

  const TempDir dir;
  const std::string huge = dir.write("huge.yaml", "# " + std::string(std::size_t{1} << 20, 'x') + "\n");
  const LoadResult too_large = load_file(huge, Purpose::discover);
  REQUIRE(too_large.problems.size() == 1);
  CHECK(too_large.problems[0].message == "cannot read the file: larger than 1 MiB");
  // The same text in memory (the hook's reader parses bytes it read): refused alike, never parsed.
  const LoadResult too_large_text = load_string(
      "enforcement:\n  when_agent_down: allow\n# " + std::string(gpunode::config::kMaxFileSize, 'x') + "\n",
      huge, Purpose::discover);
  REQUIRE(too_large_text.problems.size() == 1);
  CHECK(too_large_text.problems[0].to_string() == huge + ": cannot read the file: larger than 1 MiB");

  const std::string good = dir.write("agent.yaml", "log:\n  level: warning\n  formt: json\n");
  const LoadResult read = load_file(good, Purpose::discover);
  REQUIRE(read.problems.size() == 1);
  CHECK(read.problems[0].to_string() ==
        good + ":3:3: unknown key \"formt\" in log (did you mean \"format\"?)");
  CHECK(read.config.log.level == LogLevel::warning);
}

TEST_CASE("binary input is one problem at the first bad byte") {
  CHECK(problems_of(std::string_view("node:\n  id: a\0b\n", 15)) ==
        "agent.yaml:2:8: control character U+0000 is not allowed in YAML\n");
  CHECK(problems_of("\xff\xfe"
                    "n\0o\0d\0e\0") ==
        "agent.yaml:1:1: invalid UTF-8 (byte 0xff): a config file must be UTF-8 text\n");
  CHECK(problems_of("node:\n  id: caf\xc3\xa9\n  owner_org: \xc3\n") ==
        "agent.yaml:3:14: invalid UTF-8 (byte 0xc3): a config file must be UTF-8 text\n");
  CHECK(problems_of("\xef\xbb\xbfnode: {id: n\xc3\xa9}\n") ==  // a BOM is fine; é is not in a node id
        "agent.yaml:1:12: invalid value \"n\xc3\xa9\" for node.id: use 1 to 128 of the characters A-Z a-z "
        "0-9 . _ -\n");
}

TEST_CASE("no input makes loading throw: random bytes, YAML-like noise and mutated configs") {
  std::mt19937 rng(20270131);
  const TempDir dir;
  const std::string garbage = dir.write("garbage.yaml", random_bytes(rng, 65536));
  LoadResult from_file;
  CHECK_NOTHROW(from_file = load_file(garbage, Purpose::run));
  CHECK_FALSE(from_file.ok());

  constexpr std::string_view yamlish = "node:apiu-0123456789abcdef []{}:,-?#&*!|>'\"%@`\\ \n\n\t~.";
  std::ifstream example_file(kData + "/contract_example.yaml");
  const std::string example((std::istreambuf_iterator<char>(example_file)), {});
  REQUIRE(example.size() > 1000);
  for (int i = 0; i < 1500; ++i) {
    std::string input;
    if (i % 3 == 0) {
      input = random_bytes(rng, std::uniform_int_distribution<std::size_t>(0, 300)(rng), yamlish);
    } else {
      input = example;
      const int edits = std::uniform_int_distribution<int>(1, 8)(rng);
      for (int e = 0; e < edits; ++e) {
        const std::size_t at = std::uniform_int_distribution<std::size_t>(0, input.size() - 1)(rng);
        input.replace(at, std::uniform_int_distribution<std::size_t>(0, 3)(rng),
                      random_bytes(rng, 1, yamlish));
      }
    }
    CAPTURE(input);
    CHECK_NOTHROW(static_cast<void>(load_string(input, "agent.yaml", Purpose::run)));
  }
}

TEST_CASE("Problem::to_string and the enum names") {
  CHECK(Problem{"agent.yaml", 12, 5, "unknown key \"listne\" in api"}.to_string() ==
        "agent.yaml:12:5: unknown key \"listne\" in api");
  CHECK(Problem{"agent.yaml", 0, 0, "cannot read the file: Permission denied"}.to_string() ==
        "agent.yaml: cannot read the file: Permission denied");
  CHECK(gpunode::config::to_string(LogLevel::warning) == "warning");
  CHECK(gpunode::config::to_string(LogFormat::json) == "json");
}

// ---- the files a config names (check-config --files, CONTRACT §11) -------------------------------

namespace {

using gpunode::config::NamedFile;

// "key path line:column" per named file, in the order load_string gives them.
std::vector<std::string> files_of(std::string_view yaml) {
  const LoadResult result = load_string(yaml, "agent.yaml", Purpose::run);
  std::vector<std::string> out;
  for (const NamedFile& f : result.files)
    out.push_back(f.key + " " + f.path + " " + std::to_string(f.line) + ":" + std::to_string(f.column));
  return out;
}

}  // namespace

TEST_CASE("config: the files it names, each at its value's position, in file order, defaults last") {
  const std::string yaml =
      "state:\n"
      "  dir: /srv/state\n"
      "auth:\n"
      "  issuer: https://c\n"
      "  keys: [/k/a.pub, \"/k/b.pub\"]\n"
      "api:\n"
      "  tls:\n"
      "    key: /t/agent.key\n"
      "    cert:   /t/agent.crt\n"
      "    client_ca: /t/ca.crt\n";
  CHECK(files_of(yaml) == std::vector<std::string>{
                              "state.dir /srv/state 2:8", "auth.keys /k/a.pub 5:10",
                              "auth.keys /k/b.pub 5:20",  // a quoted scalar starts at its quote
                              "api.tls.key /t/agent.key 8:10", "api.tls.cert /t/agent.crt 9:13",
                              "api.tls.client_ca /t/ca.crt 10:16",
                              "discovery.host_root / 0:0",  // the default, stated nowhere
                          });
  const LoadResult r = load_string(yaml, "agent.yaml", Purpose::run);
  REQUIRE(r.files.size() == 7);
  CHECK(r.files[0].kind == NamedFile::Kind::state_directory);
  CHECK(r.files[1].kind == NamedFile::Kind::public_keys);
  CHECK(r.files[3].kind == NamedFile::Kind::private_key);
  CHECK(r.files[4].kind == NamedFile::Kind::certificate_chain);
  CHECK(r.files[5].kind == NamedFile::Kind::ca_certificates);
  CHECK(r.files[6].kind == NamedFile::Kind::host_root);
}

TEST_CASE("config: the central API's files are named only when reporting is on") {
  const std::string off =
      "central:\n  url: \"\"\n  ca: /c/ca.crt\n  client_cert: /c/n.crt\n  client_key: /c/n.key\n";
  for (const auto& f : files_of(off)) CHECK_FALSE(f.starts_with("central."));
  const std::string on =
      "central:\n  url: https://central.example\n  ca: /c/ca.crt\n  client_cert: /c/n.crt\n  client_key: "
      "/c/n.key\n";
  const auto files = files_of(on);
  CHECK(std::find(files.begin(), files.end(), "central.ca /c/ca.crt 3:7") != files.end());
  CHECK(std::find(files.begin(), files.end(), "central.client_cert /c/n.crt 4:16") != files.end());
  CHECK(std::find(files.begin(), files.end(), "central.client_key /c/n.key 5:15") != files.end());
}

TEST_CASE("config: an invalid or empty value names no file; the defaults stand for absent keys") {
  const auto files =
      files_of("api:\n  tls:\n    cert: \"\"\n    key: [x]\nauth:\n  keys: [\"\", /k/ok.pub]\n");
  CHECK(files == std::vector<std::string>{"auth.keys /k/ok.pub 6:14", "discovery.host_root / 0:0",
                                          "state.dir /var/lib/gpunode 0:0"});
}

TEST_CASE("config: metrics.listen must be loopback unless metrics.allow_remote (CONTRACT §10)") {
  CHECK(problems_of("metrics:\n  listen: \"127.0.0.1:9464\"\n") == "");
  CHECK(problems_of("metrics:\n  listen: \"127.8.9.10:9464\"\n") == "");
  CHECK(problems_of("metrics:\n  listen: \"[::1]:9464\"\n") == "");
  CHECK(problems_of("metrics:\n  listen: \"localhost:9464\"\n") == "");
  CHECK(problems_of("metrics:\n  listen: \"\"\n") == "");
  CHECK(problems_of("metrics:\n  listen: \"0.0.0.0:9464\"\n") ==
        "agent.yaml:2:11: metrics.listen \"0.0.0.0:9464\" is not a loopback address: /metrics (plain HTTP, "
        "no token) would show "
        "this node's numbers to anyone who reaches it; listen on 127.0.0.1 or [::1], or set "
        "metrics.allow_remote: true\n");
  CHECK(problems_of("metrics:\n  listen: \"[::]:9464\"\n").find("is not a loopback address") !=
        std::string::npos);
  CHECK(problems_of("metrics:\n  listen: \"10.0.0.5:9464\"\n").find("is not a loopback address") !=
        std::string::npos);
  CHECK(problems_of("metrics:\n  listen: \"node7.example:9464\"\n").find("is not a loopback address") !=
        std::string::npos);
  CHECK(problems_of("metrics:\n  listen: \"0.0.0.0:9464\"\n  allow_remote: true\n") == "");
  CHECK(problems_of("metrics:\n  allow_remote: yes\n") ==
        "agent.yaml:2:17: invalid value \"yes\" for metrics.allow_remote: expected true or false\n");
  CHECK(load_string("metrics:\n  allow_remote: true\n", "agent.yaml", Purpose::discover)
            .config.metrics.allow_remote);
}
