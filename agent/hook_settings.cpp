// The hook's settings and their cache (see hook_settings.hpp).
#include "hook_settings.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "gpunode/config/file.hpp"
#include "gpunode/ctl/fd.hpp"

namespace gpunode::agent {
namespace {

namespace json = boost::json;
using ctl::Fd;

constexpr std::int64_t kEntryVersion = 2;  // 2: keyed by the config's bytes (1 was by its metadata)
constexpr std::size_t kMaxConfig =
    config::kMaxFileSize;                     // agent.yaml past this is refused (as the agent refuses it)
constexpr std::string_view kAside = ".tmp-";  // an entry being written: SLOT.tmp-PID
constexpr auto kAsideStale = std::chrono::minutes(1);

// config::to_string and values::when_agent_down live with the YAML reader, which this library does not link.
std::string_view when_text(config::WhenAgentDown w) {
  return w == config::WhenAgentDown::allow ? "allow" : "deny";
}
std::optional<config::WhenAgentDown> when_of(std::string_view s) {
  if (s == "deny") return config::WhenAgentDown::deny;
  if (s == "allow") return config::WhenAgentDown::allow;
  return std::nullopt;
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

error::Result<std::optional<std::string>> read_config_bytes(const std::string& path) {
  // config::read_file opens with O_NONBLOCK: a FIFO put at the path must not hang the hook (it is
  // refused, as anything but a regular file is).
  auto text = config::read_file(path, kMaxConfig);
  if (!text) {
    if (text.error() == ENOENT) return std::optional<std::string>();
    const int e = text.error() == EISDIR ? EINVAL : text.error();
    return std::unexpected(error::Error{error::errno_code(e),
                                        "cannot read " + path + ": " + config::read_error_text(e, kMaxConfig),
                                        e, error::Native::os});
  }
  return std::optional<std::string>(std::move(*text));
}

std::string HookSettingsCache::slot_name(std::string_view config_file) {
  std::uint64_t h = 14695981039346656037ULL;  // FNV-1a: spreads paths over the slots; a collision only evicts
  for (const char c : config_file) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return "settings-" + std::to_string(h % kSlots) + ".json";
}

int HookSettingsCache::open_dir(bool create) const {
  constexpr int kFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(dir_.c_str(), kFlags);
  if (fd < 0 && errno == ENOENT && create) {
    if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) return -1;
    fd = ::open(dir_.c_str(), kFlags);
  }
  if (fd < 0) return -1;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void HookSettingsCache::sweep_aside(int dir_fd) const {
  const int scan = ::dup(dir_fd);
  if (scan < 0) return;
  DIR* d = ::fdopendir(scan);  // owns `scan` from here
  if (d == nullptr) {
    ::close(scan);
    return;
  }
  const auto now = std::chrono::system_clock::now();
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (name.find(kAside) == std::string_view::npos) continue;
    struct stat st {};
    if (::fstatat(dir_fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const auto written = std::chrono::system_clock::from_time_t(st.st_mtim.tv_sec);
    if (now - written > kAsideStale) ::unlinkat(dir_fd, e->d_name, 0);  // its writer was killed
  }
  ::closedir(d);
}

std::optional<HookSettings> HookSettingsCache::find(const std::string& config_file,
                                                    std::string_view bytes) const {
  const Fd dir(open_dir(false));
  if (dir.get() < 0) return std::nullopt;
  const Fd file(
      ::openat(dir.get(), slot_name(config_file).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (file.get() < 0) return std::nullopt;
  struct stat st {};
  if (::fstat(file.get(), &st) != 0 || st.st_uid != ::geteuid()) return std::nullopt;
  auto text = config::read_file(file.get(), kMaxEntry);
  if (!text) return std::nullopt;
  boost::system::error_code ec;
  const json::value v = json::parse(*text, ec);
  const json::object* o = !ec ? v.if_object() : nullptr;
  if (o == nullptr) return std::nullopt;
  const json::value* version = o->if_contains("version");
  const json::value* config = o->if_contains("config");
  const json::value* content = o->if_contains("content");
  const json::value* socket = o->if_contains("socket");
  const json::value* when = o->if_contains("whenAgentDown");
  if (version == nullptr || !version->is_int64() || version->get_int64() != kEntryVersion)
    return std::nullopt;
  if (config == nullptr || !config->is_string() || config->get_string() != config_file) return std::nullopt;
  if (content == nullptr || !content->is_string() || std::string_view(content->get_string()) != bytes)
    return std::nullopt;
  if (socket == nullptr || !socket->is_string() || socket->get_string().empty()) return std::nullopt;
  if (when == nullptr || !when->is_string()) return std::nullopt;
  const auto when_down = when_of(when->get_string());
  if (!when_down) return std::nullopt;
  return HookSettings{std::string(socket->get_string()), *when_down};
}

bool HookSettingsCache::store(const std::string& config_file, std::string_view bytes,
                              const HookSettings& settings) const {
  if (bytes.size() > kMaxContent) return false;
  const Fd dir(open_dir(true));
  if (dir.get() < 0) return false;
  sweep_aside(dir.get());
  const std::string text =
      json::serialize(json::object{{"version", kEntryVersion},
                                   {"config", config_file},
                                   {"content", bytes},
                                   {"socket", settings.socket},
                                   {"whenAgentDown", when_text(settings.when_agent_down)}});
  if (text.size() > kMaxEntry) return false;
  // Written aside and renamed into place: a hook reading the slot meanwhile sees the old entry or
  // the new one, never half of one. The name is this process's: two hooks never share one.
  const std::string slot = slot_name(config_file);
  const std::string aside = slot + std::string(kAside) + std::to_string(::getpid());
  bool ok = false;
  {
    const Fd file(
        ::openat(dir.get(), aside.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
    ok = file.get() >= 0 && write_all(file.get(), text);
  }
  if (ok) ok = ::renameat(dir.get(), aside.c_str(), dir.get(), slot.c_str()) == 0;
  if (!ok) ::unlinkat(dir.get(), aside.c_str(), 0);
  return ok;
}

error::Result<HookSettings> hook_settings(const std::string& config_file, const HookSettingsCache& cache,
                                          const HookSettingsReader& read) {
  auto bytes = read_config_bytes(config_file);
  if (!bytes) return std::unexpected(bytes.error());
  if (!*bytes) return HookSettings{};  // no agent.yaml: the defaults, as the agent's
  if (auto hit = cache.find(config_file, **bytes)) return *hit;
  auto settings = read(config_file, **bytes);
  if (settings) cache.store(config_file, **bytes, *settings);
  return settings;
}

}  // namespace gpunode::agent
