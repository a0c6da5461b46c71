// What the libvirt hook takes from agent.yaml (CONTRACT §9): `admin.socket` and
// `enforcement.when_agent_down`, and a cache of them.
//
// Why a cache: libvirtd runs the hook on every domain start and its whole run counts (§9 "Speed":
// at most 5 ms over /bin/true). Parsing agent.yaml means mapping yaml-cpp and running its scanner,
// which measured 1.0 ms of the hook's 6 ms over /bin/true on a 2-core VM. So the hook (compiled
// into gpunode-agent) links no YAML reader: it reads agent.yaml's bytes (one open, reading a
// small file to its end) and takes the two settings from a cache entry made from exactly those bytes. Only
// on a miss (the first GPU start after a boot, or after the file changed) does the agent's one
// config reader (config::load_string, in gpunode-agent-tools.so, module_abi.hpp) parse the bytes
// that were read, and the entry stores what it said beside them.
//
// Keyed by content, not by the file's metadata: a symbolic link flipped away and back, a bind
// mount, a read-only image with reused inode numbers, or NFS's cached attributes can all keep a
// file's identity while its content changes; the bytes cannot. The settings used are always those
// of the bytes read in this run.
//
// The cache is a directory only its owner can enter (/run/gpunode-hook, made 0700 by the hook,
// which runs as root under libvirtd; tmpfs, so a boot empties it) of at most kSlots small JSON
// files, the slot chosen by the config's path; a file larger than kMaxContent is read every time.
// Anything unexpected (the directory not 0700 or not its user's, an entry unreadable, too large or
// for other bytes) is a miss, never an error.
#pragma once

#include <cstddef>
#include <expected>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "gpunode/config/config.hpp"  // the types only: this library links no config reader
#include "gpunode/error/error.hpp"

namespace gpunode::agent {

struct HookSettings {
  std::string socket = config::Config{}.admin.socket;  // admin.socket: the agent's own default
  config::WhenAgentDown when_agent_down = config::Config{}.enforcement.when_agent_down;
  bool operator==(const HookSettings&) const = default;
};

inline HookSettings hook_settings_of(const config::Config& c) {
  return {c.admin.socket, c.enforcement.when_agent_down};
}

// agent.yaml's bytes: nullopt when there is no file (the defaults apply); an error (one line) when
// it cannot be read or is not a regular file (a FIFO would block the hook: it is never opened for
// a blocking read).
error::Result<std::optional<std::string>> read_config_bytes(const std::string& path);

// Parses `bytes`, read from `config_file`: the agent's config::load_string, or a test's stand-in.
// The error is one line.
using HookSettingsReader =
    std::function<error::Result<HookSettings>(const std::string& config_file, std::string_view bytes)>;

class HookSettingsCache {
 public:
  static constexpr std::string_view kDefaultDir = "/run/gpunode-hook";
  static constexpr std::size_t kSlots = 16;
  static constexpr std::size_t kMaxContent = 48 * 1024;  // a larger agent.yaml is read every time
  static constexpr std::size_t kMaxEntry = 4 * kMaxContent;

  explicit HookSettingsCache(std::string dir = std::string(kDefaultDir)) : dir_(std::move(dir)) {}

  // The cached settings for `config_file` if its entry was made from exactly `bytes`.
  std::optional<HookSettings> find(const std::string& config_file, std::string_view bytes) const;
  // Stores them unless the bytes are over kMaxContent or the directory cannot be made or is not
  // this user's alone; says whether it did.
  bool store(const std::string& config_file, std::string_view bytes, const HookSettings& settings) const;

  // The entry's file name for `config_file` (one of kSlots).
  static std::string slot_name(std::string_view config_file);

 private:
  int open_dir(bool create) const;     // an fd of dir_ when it is this user's alone, else -1
  void sweep_aside(int dir_fd) const;  // entries a killed hook left half-written
  std::string dir_;
};

// The settings for `config_file`: the defaults when it does not exist; the cache's when it holds
// them for the bytes read now; else `read`'s, from those bytes, stored. An error (the file cannot
// be read, or the reader refuses it) makes the hook refuse.
error::Result<HookSettings> hook_settings(const std::string& config_file, const HookSettingsCache& cache,
                                          const HookSettingsReader& read);

}  // namespace gpunode::agent
