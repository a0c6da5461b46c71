// Loading agent.yaml (CONTRACT §2, §7): read, parse with yaml-cpp (document.cpp), then one schema
// pass that reports every unknown, duplicate, mistyped, invalid and (for `run`) missing key with
// its position. Nothing here throws for any input.
#include "gpunode/config/config.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <initializer_list>
#include <optional>
#include <system_error>
#include <tuple>
#include <utility>

#include "document.hpp"
#include "gpunode/config/file.hpp"
#include "gpunode/text/printable.hpp"
#include "problems.hpp"
#include "text.hpp"
#include "values.hpp"

namespace gpunode::config {
namespace {

std::string_view kind_of(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return "a scalar";
    default:
      return "empty";
  }
}

// --- the schema --------------------------------------------------------------------------------

struct Entry {
  YAML::Node key;
  YAML::Node value;
};

// One mapping of the schema (the top level, node, api.tls, ...): the keys it knows, the first
// occurrence of each in the file, and where a key it lacks is reported: at the mapping itself, or
// at the nearest enclosing one when it is absent, or at 1:1 for the top level.
class Section {
 public:
  static Section root(Problems& problems, const YAML::Node& document,
                      std::initializer_list<std::string_view> keys);
  // The mapping under `key`. A null value counts as an empty mapping; anything else that is not a
  // mapping is reported, and the section is then `broken`: its keys are not required.
  [[nodiscard]] Section child(std::string_view key, std::initializer_list<std::string_view> keys) const;

  [[nodiscard]] const Entry* find(std::string_view key) const;
  [[nodiscard]] std::string path(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }
  [[nodiscard]] Problems& problems() const { return *problems_; }
  [[nodiscard]] Pos anchor() const { return anchor_; }
  [[nodiscard]] bool broken() const { return broken_; }

 private:
  Section(Problems& problems, std::string path, Pos anchor, std::initializer_list<std::string_view> keys)
      : problems_(&problems), path_(std::move(path)), anchor_(anchor), keys_(keys) {}

  void bind(const YAML::Node& mapping);
  void add_entry(const YAML::Node& key, const YAML::Node& value);
  void report_unknown(const YAML::Node& key) const;
  [[nodiscard]] std::string key_kind() const { return path_.empty() ? "top-level key" : "key"; }
  [[nodiscard]] std::string where() const { return path_.empty() ? std::string() : " in " + path_; }

  Problems* problems_;
  std::string path_;
  Pos anchor_;
  bool broken_ = false;
  std::vector<std::string_view> keys_;
  std::vector<std::pair<std::string_view, Entry>> entries_;
};

Section Section::root(Problems& problems, const YAML::Node& document,
                      std::initializer_list<std::string_view> keys) {
  Section out(problems, "", Pos{}, keys);
  if (document.IsNull()) return out;  // an empty file: all defaults
  if (!document.IsMap()) {
    problems.add(pos_of(document), fmt::format("the top level must be a mapping, not {}", kind_of(document)));
    out.broken_ = true;
    return out;
  }
  out.bind(document);
  return out;
}

Section Section::child(std::string_view key, std::initializer_list<std::string_view> keys) const {
  Section out(*problems_, path(key), anchor_, keys);
  out.broken_ = broken_;
  const Entry* entry = find(key);
  if (entry == nullptr) return out;
  if (entry->value.IsNull()) {
    out.anchor_ = pos_of(entry->key);  // a null's own mark is wherever the next token starts
    return out;
  }
  if (!entry->value.IsMap()) {
    problems_->add(pos_of(entry->value),
                   fmt::format("{} must be a mapping, not {}", out.path_, kind_of(entry->value)));
    out.broken_ = true;
    return out;
  }
  out.anchor_ = pos_of(entry->value);
  out.bind(entry->value);
  return out;
}

const Entry* Section::find(std::string_view key) const {
  for (const auto& [name, entry] : entries_) {
    if (name == key) return &entry;
  }
  return nullptr;
}

void Section::bind(const YAML::Node& mapping) {
  for (auto it = mapping.begin(); it != mapping.end(); ++it) add_entry(it->first, it->second);
}

void Section::add_entry(const YAML::Node& key, const YAML::Node& value) {
  if (!key.IsScalar()) {
    problems_->add(pos_of(key),
                   fmt::format("a {}{} must be a string, not {}", key_kind(), where(), kind_of(key)));
    return;
  }
  const std::string& name = key.Scalar();
  const auto known = std::find(keys_.begin(), keys_.end(), name);
  if (known == keys_.end()) {
    report_unknown(key);
    return;
  }
  if (const Entry* first = find(*known)) {
    problems_->add(pos_of(key), fmt::format("duplicate {} {}{} (first at line {})", key_kind(),
                                            text::quote(name), where(), pos_of(first->key).line));
    return;
  }
  entries_.emplace_back(*known, Entry{key, value});
}

void Section::report_unknown(const YAML::Node& key) const {
  const std::string& name = key.Scalar();
  std::string message = fmt::format("unknown {} {}{}", key_kind(), text::quote(name), where());
  if (const std::string_view guess = text::closest(name, keys_); !guess.empty()) {
    message += fmt::format(" (did you mean \"{}\"?)", guess);
  }
  problems_->add(pos_of(key), std::move(message));
}

// --- values --------------------------------------------------------------------------------------

template <class T>
using Parser = values::Parsed<T> (*)(std::string_view);

// The value of `key` when it is present and a scalar; a null or a non-scalar is reported.
const YAML::Node* scalar_of(const Section& s, std::string_view key, std::string_view what) {
  const Entry* entry = s.find(key);
  if (entry == nullptr) return nullptr;
  if (entry->value.IsNull()) {
    s.problems().add(pos_of(entry->key), fmt::format("{} needs a value", s.path(key)));
    return nullptr;
  }
  if (!entry->value.IsScalar()) {
    s.problems().add(pos_of(entry->value),
                     fmt::format("{} must be {}, not {}", s.path(key), what, kind_of(entry->value)));
    return nullptr;
  }
  return &entry->value;
}

// A scalar key: parsed into `out` when present and valid, else reported (and `out` unchanged).
template <class T>
void read_value(const Section& s, std::string_view key, std::string_view what, Parser<T> parse, T& out) {
  const YAML::Node* value = scalar_of(s, key, what);
  if (value == nullptr) return;
  auto parsed = parse(value->Scalar());
  if (!parsed) {
    s.problems().add(pos_of(*value), fmt::format("invalid value {} for {}: {}", text::quote(value->Scalar()),
                                                 s.path(key), parsed.error().detail));
    return;
  }
  out = std::move(*parsed);
}

template <class T>
void read_string(const Section& s, std::string_view key, Parser<T> parse, T& out) {
  read_value(s, key, "a string", parse, out);
}

// A list of scalars: `out` becomes its valid entries (`[]` empties it); every bad entry is reported.
template <class T>
void read_list(const Section& s, std::string_view key, Parser<T> parse, std::vector<T>& out) {
  const Entry* entry = s.find(key);
  if (entry == nullptr) return;
  const std::string path = s.path(key);
  if (entry->value.IsNull()) {
    s.problems().add(pos_of(entry->key), fmt::format("{} needs a value (write [] for an empty list)", path));
    return;
  }
  if (!entry->value.IsSequence()) {
    s.problems().add(pos_of(entry->value),
                     fmt::format("{} must be a list, not {}", path, kind_of(entry->value)));
    return;
  }
  std::vector<T> items;
  int index = 0;
  for (const YAML::Node& item : entry->value) {
    ++index;
    if (item.IsNull()) {
      // A null's mark is wherever the next token starts: point at the list and count instead.
      s.problems().add(pos_of(entry->value), fmt::format("entry {} of {} is empty", index, path));
    } else if (!item.IsScalar()) {
      s.problems().add(pos_of(item),
                       fmt::format("entries of {} must be scalars, not {}", path, kind_of(item)));
    } else if (auto parsed = parse(item.Scalar())) {
      items.push_back(std::move(*parsed));
    } else {
      s.problems().add(pos_of(item), fmt::format("invalid entry {} in {}: {}", text::quote(item.Scalar()),
                                                 path, parsed.error().detail));
    }
  }
  out = std::move(items);
}

// --- what `run` needs ----------------------------------------------------------------------------

// The key must be there; its value was checked when it was read.
void require_key(const Section& s, std::string_view key) {
  if (s.broken() || s.find(key) != nullptr) return;
  s.problems().add(s.anchor(), fmt::format("missing required key \"{}\"", s.path(key)));
}

// The key must be there and hold a non-empty string or list.
void require_value(const Section& s, std::string_view key) {
  const Entry* entry = s.find(key);
  if (entry == nullptr) {
    require_key(s, key);
    return;
  }
  const YAML::Node& value = entry->value;
  const bool empty =
      (value.IsScalar() && value.Scalar().empty()) || (value.IsSequence() && value.size() == 0);
  if (empty)
    s.problems().add(pos_of(value), fmt::format("{} must not be empty to run the agent", s.path(key)));
}

// --- the files it names (check-config --files) ----------------------------------------------------

using Files = std::vector<NamedFile>;

// Notes the file(s) `key` names: its value when a non-empty string, or each such entry of the list
// auth.keys.
// Bad values were reported when they were read; `fallback` is the default a missing key stands for.
void note_file(const Section& s, std::string_view key, NamedFile::Kind kind, Files& files,
               std::string_view fallback = {}) {
  const Entry* entry = s.find(key);
  if (entry == nullptr) {
    if (!fallback.empty()) files.push_back({s.path(key), 0, 0, std::string(fallback), kind});
    return;
  }
  const auto add = [&](const YAML::Node& value) {
    if (!value.IsScalar() || value.Scalar().empty()) return;
    const Pos at = pos_of(value);
    files.push_back({s.path(key), at.line, at.column, value.Scalar(), kind});
  };
  if (kind != NamedFile::Kind::public_keys) {
    add(entry->value);  // a list here is a problem read_string reported
  } else if (entry->value.IsSequence()) {
    for (const YAML::Node& item : entry->value) add(item);
  }
}

// --- the sections --------------------------------------------------------------------------------

void read_node(const Section& root, Purpose purpose, Config::Node& out) {
  const Section s = root.child("node", {"id", "owner_org", "unsellable_units"});
  read_string(s, "id", values::name, out.id);
  read_string(s, "owner_org", values::name, out.owner_org);
  read_list(s, "unsellable_units", values::unit_ref, out.unsellable_units);
  if (purpose != Purpose::run) return;
  require_key(s, "id");
  require_key(s, "owner_org");
}

void read_discovery(const Section& root, Config::Discovery& out, Files& files) {
  const Section s =
      root.child("discovery", {"host_root", "gpu_vendors", "reservable_classes", "rescan_interval"});
  read_string(s, "host_root", values::absolute_path, out.host_root);
  read_list(s, "gpu_vendors", values::gpu_vendor, out.gpu_vendors);
  read_list(s, "reservable_classes", values::reservable_class, out.reservable_classes);
  read_value(s, "rescan_interval", "a duration", values::rescan_interval, out.rescan_interval);
  note_file(s, "host_root", NamedFile::Kind::host_root, files, Config::Discovery{}.host_root);
}

void read_api(const Section& root, Purpose purpose, Config::Api& out, Files& files) {
  const Section s = root.child("api", {"listen", "tls", "max_connections", "max_connections_per_client"});
  read_string(s, "listen", values::listen, out.listen);
  read_value(s, "max_connections", "a number", values::connection_cap, out.max_connections);
  read_value(s, "max_connections_per_client", "a number", values::connection_cap,
             out.max_connections_per_client);
  const Section tls = s.child("tls", {"cert", "key", "client_ca"});
  read_string(tls, "cert", values::text, out.tls.cert);
  read_string(tls, "key", values::text, out.tls.key);
  read_string(tls, "client_ca", values::text, out.tls.client_ca);
  note_file(tls, "cert", NamedFile::Kind::certificate_chain, files);
  note_file(tls, "key", NamedFile::Kind::private_key, files);
  note_file(tls, "client_ca", NamedFile::Kind::ca_certificates, files);
  if (purpose != Purpose::run) return;
  require_value(tls, "cert");
  require_value(tls, "key");
}

void read_auth(const Section& root, Purpose purpose, Config::Auth& out, Files& files) {
  const Section s = root.child("auth", {"issuer", "audience", "keys"});
  read_string(s, "issuer", values::text, out.issuer);
  read_string(s, "audience", values::non_empty_text, out.audience);
  read_list(s, "keys", values::non_empty_text, out.keys);
  note_file(s, "keys", NamedFile::Kind::public_keys, files);
  if (purpose != Purpose::run) return;
  require_value(s, "issuer");
  require_value(s, "keys");
}

void read_admin(const Section& root, Config::Admin& out) {
  const Section s = root.child("admin", {"socket", "allowed_uids", "allowed_group", "max_connections"});
  read_value(s, "max_connections", "a number", values::connection_cap, out.max_connections);
  read_string(s, "socket", values::socket_path, out.socket);
  read_list(s, "allowed_uids", values::uid, out.allowed_uids);
  read_string(s, "allowed_group", values::text, out.allowed_group);
}

void read_libvirt(const Section& root, Config::Libvirt& out) {
  const Section s = root.child("libvirt", {"uri", "shutdown_grace"});
  read_string(s, "uri", values::non_empty_text, out.uri);
  read_value(s, "shutdown_grace", "a duration", values::shutdown_grace, out.shutdown_grace);
}

void read_central(const Section& root, Purpose purpose, Config::Central& out, Files& files) {
  const Section s = root.child("central", {"url", "ca", "client_cert", "client_key", "heartbeat_interval"});
  read_string(s, "url", values::central_url, out.url);
  read_string(s, "ca", values::text, out.ca);
  read_string(s, "client_cert", values::text, out.client_cert);
  read_string(s, "client_key", values::text, out.client_key);
  read_value(s, "heartbeat_interval", "a duration", values::heartbeat_interval, out.heartbeat_interval);
  if (out.url.empty()) return;  // reporting off: the agent opens none of its files
  note_file(s, "ca", NamedFile::Kind::ca_certificates, files);
  note_file(s, "client_cert", NamedFile::Kind::certificate_chain, files);
  note_file(s, "client_key", NamedFile::Kind::private_key, files);
  if (purpose != Purpose::run) return;
  require_value(s, "ca");  // the central API's server certificate is verified against it (CONTRACT §7 TLS)
  require_value(s, "client_cert");  // reporting is mTLS (CONTRACT §6)
  require_value(s, "client_key");
}

void read_enforcement(const Section& root, Config::Enforcement& out) {
  const Section s = root.child("enforcement", {"mode", "when_agent_down"});
  read_string(s, "mode", values::enforcement_mode, out.mode);
  read_string(s, "when_agent_down", values::when_agent_down, out.when_agent_down);
}

void read_metrics(const Section& root, Config::Metrics& out) {
  const Section s = root.child("metrics", {"listen", "allow_remote"});
  read_string(s, "listen", values::optional_listen, out.listen);
  read_value(s, "allow_remote", "true or false", values::boolean, out.allow_remote);
  // CONTRACT §10: /metrics shows reservation counts and more, over plain HTTP without a token.
  if (out.listen.empty() || out.allow_remote || values::is_loopback_listen(out.listen)) return;
  const Entry* listen = s.find("listen");
  s.problems().add(
      listen != nullptr ? pos_of(listen->value) : s.anchor(),
      fmt::format(
          "metrics.listen {} is not a loopback address: /metrics (plain HTTP, no token) would show this "
          "node's numbers to anyone who reaches it; listen on 127.0.0.1 or [::1], or set "
          "metrics.allow_remote: true",
          text::quote(out.listen)));
}

void read_audit(const Section& root, Config::Audit& out) {
  const Section s = root.child("audit", {"checkpoint_interval", "signing_key"});
  read_value(s, "checkpoint_interval", "a duration", values::checkpoint_interval, out.checkpoint_interval);
  read_string(s, "signing_key", values::optional_absolute_path, out.signing_key);
}

void read_health(const Section& root, Config::Health& out) {
  const Section s = root.child("health", {"enabled", "interval", "recovery", "nonfatal_threshold", "ignore"});
  read_value(s, "enabled", "true or false", values::boolean, out.enabled);
  read_value(s, "interval", "a duration", values::health_interval, out.interval);
  read_value(s, "recovery", "a duration", values::health_recovery, out.recovery);
  read_value(s, "nonfatal_threshold", "a number", values::nonfatal_threshold, out.nonfatal_threshold);
  read_list(s, "ignore", values::failing_code, out.ignore);
}

void read_state(const Section& root, Config::State& out, Files& files) {
  const Section s = root.child("state", {"dir"});
  read_string(s, "dir", values::absolute_path, out.dir);
  note_file(s, "dir", NamedFile::Kind::state_directory, files, Config::State{}.dir);
}

void read_log(const Section& root, Config::Log& out) {
  const Section s = root.child("log", {"level", "format"});
  read_string(s, "level", values::log_level, out.level);
  read_string(s, "format", values::log_format, out.format);
}

void read_config(const YAML::Node& document, Purpose purpose, Problems& problems, Config& out, Files& files) {
  const Section root = Section::root(problems, document,
                                     {"node", "discovery", "api", "auth", "admin", "libvirt", "central",
                                      "enforcement", "metrics", "audit", "health", "state", "log"});
  read_node(root, purpose, out.node);
  read_discovery(root, out.discovery, files);
  read_api(root, purpose, out.api, files);
  read_auth(root, purpose, out.auth, files);
  read_admin(root, out.admin);
  read_libvirt(root, out.libvirt);
  read_central(root, purpose, out.central, files);
  read_enforcement(root, out.enforcement);
  read_metrics(root, out.metrics);
  read_audit(root, out.audit);
  read_health(root, out.health);
  read_state(root, out.state, files);
  read_log(root, out.log);
}

}  // namespace

std::string signing_key_path(const Config& c) {
  if (!c.audit.signing_key.empty()) return c.audit.signing_key;
  return c.state.dir + (c.state.dir.ends_with('/') ? "" : "/") + "audit-signing.key";
}

std::string Problem::to_string() const {
  if (line <= 0) return fmt::format("{}: {}", file, message);
  return fmt::format("{}:{}:{}: {}", file, line, column, message);
}

LoadResult load_file(const std::string& file, Purpose purpose) {
  auto content = read_file(file, kMaxFileSize);
  if (!content) {
    LoadResult result;
    result.problems.push_back(
        {file, 0, 0,
         fmt::format("cannot read the file: {}", read_error_text(content.error(), kMaxFileSize))});
    return result;
  }
  return load_string(*content, file, purpose);
}

LoadResult load_string(std::string_view source, const std::string& file, Purpose purpose) {
  LoadResult result;
  Problems problems(file);
  if (source.size() > kMaxFileSize) {  // every reader, the hook's included, refuses what the agent refuses
    problems.add(kNowhere, "cannot read the file: larger than 1 MiB");
  } else if (const auto fault = text::find_binary(source)) {
    // 1 MiB at most: a line and a column fit an int
    problems.add({static_cast<int>(fault->line), static_cast<int>(fault->column)}, fault->what);
  } else if (const auto document = document::parse(source, problems)) {
    try {
      read_config(*document, purpose, problems, result.config, result.files);
      std::stable_sort(result.files.begin(), result.files.end(), [](const NamedFile& x, const NamedFile& y) {
        return std::tuple(x.line == 0, x.line, x.column) < std::tuple(y.line == 0, y.line, y.column);
      });
    } catch (const std::exception& e) {  // a yaml-cpp node API that throws: a bug here, not bad input
      problems.add(kNowhere, "internal error while reading the config: " +
                                 gpunode::text::printable(e.what(), gpunode::text::Escapes::c_string));
    }
  }
  result.problems = problems.take_sorted();
  return result;
}

std::string_view to_string(LogLevel level) {
  switch (level) {
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warning:
      return "warning";
    case LogLevel::error:
      return "error";
  }
  return "info";
}

std::string_view to_string(LogFormat format) {
  switch (format) {
    case LogFormat::json:
      return "json";
    case LogFormat::text:
      return "text";
  }
  return "text";
}

std::string_view to_string(EnforcementMode mode) {
  switch (mode) {
    case EnforcementMode::enforce:
      return "enforce";
    case EnforcementMode::audit:
      return "audit";
    case EnforcementMode::off:
      return "off";
  }
  return "enforce";
}

std::string_view to_string(WhenAgentDown when) {
  switch (when) {
    case WhenAgentDown::deny:
      return "deny";
    case WhenAgentDown::allow:
      return "allow";
  }
  return "deny";
}

}  // namespace gpunode::config
