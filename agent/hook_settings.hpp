// What the libvirt hook takes from agent.yaml (CONTRACT §9): `admin.socket` and
// `enforcement.when_agent_down`, and a cache of them.
//
// Why a cache: libvirtd runs the hook on every domain start and its whole run counts (§9 "Speed":
// at most 5 ms over /bin/true). Reading agent.yaml means mapping yaml-cpp and running its scanner,
// which measured 1.0 ms of the hook's 6 ms over /bin/true on a 2-core VM. So the hook's module
// (gpunode-agent-hook.so) links no YAML reader: it takes the two settings from a cache entry that
// names the file as it is now, and only on a miss (the first GPU start after a boot, or after the
// file changed) has the agent's one config reader (config::load_file, in gpunode-agent-tools.so)
// read the file, and stores what it said.
//
// The cache is a directory only its owner can enter (/run/gpunode-hook, made 0700 by the hook,
// which runs as root under libvirtd; tmpfs, so a boot empties it) of at most kSlots small JSON
// files, the slot chosen by the config's path. An entry counts only for the same path and the
// same identity: device, inode, size, mtime and ctime in nanoseconds. A process cannot set ctime:
// any write, rename or chmod moves it to the clock's now. A file changed twice within the clock's
// granularity could keep all five (git's "racily clean" entries), so a file changed less than
// kSettled ago is never cached. Anything unexpected (the directory not 0700 or not its user's, an
// entry unreadable, too large or for another file) is a miss, never an error: the file is read.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "gpunode/config/config.hpp"  // the types only: this library links no config reader

namespace gpunode::agent {

struct HookSettings {
  std::string socket = "/run/gpunode/admin.sock";  // admin.socket
  config::WhenAgentDown when_agent_down = config::WhenAgentDown::deny;
  bool operator==(const HookSettings&) const = default;
};

inline HookSettings hook_settings_of(const config::Config& c) {
  return {c.admin.socket, c.enforcement.when_agent_down};
}

// A file as stat(2) sees it (following symbolic links), times in nanoseconds since the epoch.
struct FileIdentity {
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::int64_t size = 0;
  std::int64_t mtime_ns = 0;
  std::int64_t ctime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

// The error is stat's errno.
std::expected<FileIdentity, int> identity_of(const std::string& path);

// Reads the config: the agent's config::load_file, or a test's stand-in. The error is one line.
using HookSettingsReader =
    std::function<std::expected<HookSettings, std::string>(const std::string& config_file)>;

class HookSettingsCache {
 public:
  static constexpr std::string_view kDefaultDir = "/run/gpunode-hook";
  static constexpr std::size_t kSlots = 16;
  static constexpr std::chrono::seconds kSettled{2};
  static constexpr std::size_t kMaxEntry = 64 * 1024;

  explicit HookSettingsCache(std::string dir = std::string(kDefaultDir)) : dir_(std::move(dir)) {}

  // The cached settings for `config_file` if its entry names this file with this identity.
  std::optional<HookSettings> find(const std::string& config_file, const FileIdentity& id) const;
  // Stores them unless the file changed less than kSettled before `now` or the directory cannot
  // be made or is not this user's alone; says whether it did.
  bool store(const std::string& config_file, const FileIdentity& id, const HookSettings& settings,
             std::chrono::system_clock::time_point now = std::chrono::system_clock::now()) const;

  // The entry's file name for `config_file` (one of kSlots).
  static std::string slot_name(std::string_view config_file);

 private:
  int open_dir(bool create) const;  // an fd of dir_ when it is this user's alone, else -1
  std::string dir_;
};

// The settings for `config_file`: the defaults when it does not exist; the cache's when it holds
// them for the file as it is now; else `read`'s, stored when the file did not change while it was
// read. An error is the reader's (an invalid file): the hook then refuses.
std::expected<HookSettings, std::string> hook_settings(
    const std::string& config_file, const HookSettingsCache& cache, const HookSettingsReader& read,
    std::chrono::system_clock::time_point now = std::chrono::system_clock::now());

// gpunode-agent-tools.so exports the agent's reader under this name (the hook's module, which does
// not map yaml-cpp, loads it on a miss). An out-parameter: a C-linkage function returns no C++ type.
using HookSettingsEntry = void(const std::string& config_file, std::expected<HookSettings, std::string>* out);
inline constexpr const char* kHookSettingsEntry = "gpunode_agent_hook_settings";

}  // namespace gpunode::agent
