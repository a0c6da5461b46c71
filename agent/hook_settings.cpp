// The hook's settings and their cache (see hook_settings.hpp).
#include "hook_settings.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/json.hpp>
#include <cerrno>

#include "gpunode/ctl/fd.hpp"

namespace gpunode::agent {
namespace {

namespace json = boost::json;
using ctl::Fd;

constexpr std::int64_t kEntryVersion = 1;

std::int64_t nanoseconds(const struct timespec& t) {
  return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

// config::to_string and values::when_agent_down live with the YAML reader, which this library does not link.
std::string_view when_text(config::WhenAgentDown w) {
  return w == config::WhenAgentDown::allow ? "allow" : "deny";
}
std::optional<config::WhenAgentDown> when_of(std::string_view s) {
  if (s == "deny") return config::WhenAgentDown::deny;
  if (s == "allow") return config::WhenAgentDown::allow;
  return std::nullopt;
}

std::optional<std::uint64_t> unsigned_of(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* u = v->if_uint64()) return *u;
  if (const auto* i = v->if_int64(); i != nullptr && *i >= 0) return static_cast<std::uint64_t>(*i);
  return std::nullopt;
}

std::optional<std::int64_t> signed_of(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  if (v == nullptr) return std::nullopt;
  if (const auto* i = v->if_int64()) return *i;
  return std::nullopt;
}

json::object identity_json(const FileIdentity& id) {
  return {{"device", id.device},
          {"inode", id.inode},
          {"size", id.size},
          {"mtimeNs", id.mtime_ns},
          {"ctimeNs", id.ctime_ns}};
}

std::optional<FileIdentity> identity_from(const json::value* v) {
  const json::object* o = v != nullptr ? v->if_object() : nullptr;
  if (o == nullptr) return std::nullopt;
  const auto device = unsigned_of(*o, "device");
  const auto inode = unsigned_of(*o, "inode");
  const auto size = signed_of(*o, "size");
  const auto mtime = signed_of(*o, "mtimeNs");
  const auto ctime = signed_of(*o, "ctimeNs");
  if (!device || !inode || !size || !mtime || !ctime) return std::nullopt;
  return FileIdentity{*device, *inode, *size, *mtime, *ctime};
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

std::expected<FileIdentity, int> identity_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::unexpected(errno);
  return FileIdentity{static_cast<std::uint64_t>(st.st_dev), static_cast<std::uint64_t>(st.st_ino),
                      static_cast<std::int64_t>(st.st_size), nanoseconds(st.st_mtim),
                      nanoseconds(st.st_ctim)};
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

std::optional<HookSettings> HookSettingsCache::find(const std::string& config_file,
                                                    const FileIdentity& id) const {
  const Fd dir(open_dir(false));
  if (dir.get() < 0) return std::nullopt;
  const Fd file(::openat(dir.get(), slot_name(config_file).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (file.get() < 0 || ::fstat(file.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
      st.st_size < 0 || static_cast<std::size_t>(st.st_size) > kMaxEntry) {
    return std::nullopt;
  }
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(file.get(), text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;
    got += static_cast<std::size_t>(n);
  }
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  const json::object* o = !ec ? v.if_object() : nullptr;
  if (o == nullptr || signed_of(*o, "version") != kEntryVersion) return std::nullopt;
  const json::value* config = o->if_contains("config");
  const json::value* socket = o->if_contains("socket");
  const json::value* when = o->if_contains("whenAgentDown");
  if (config == nullptr || !config->is_string() || config->get_string() != config_file) return std::nullopt;
  if (identity_from(o->if_contains("identity")) != id) return std::nullopt;
  if (socket == nullptr || !socket->is_string() || socket->get_string().empty() || when == nullptr ||
      !when->is_string())
    return std::nullopt;
  const auto when_down = when_of(when->get_string());
  if (!when_down) return std::nullopt;
  return HookSettings{std::string(socket->get_string()), *when_down};
}

bool HookSettingsCache::store(const std::string& config_file, const FileIdentity& id,
                              const HookSettings& settings, std::chrono::system_clock::time_point now) const {
  const std::int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  const std::int64_t settled_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(kSettled).count();
  if (now_ns - std::max(id.mtime_ns, id.ctime_ns) < settled_ns)
    return false;  // racily clean: read it again next time
  const Fd dir(open_dir(true));
  if (dir.get() < 0) return false;
  const std::string text =
      json::serialize(json::object{{"version", kEntryVersion},
                                   {"config", config_file},
                                   {"identity", identity_json(id)},
                                   {"socket", settings.socket},
                                   {"whenAgentDown", when_text(settings.when_agent_down)}});
  if (text.size() > kMaxEntry) return false;
  // Written aside and renamed into place: a hook reading the slot meanwhile sees the old entry or
  // the new one, never half of one. The name is this process's: two hooks never share one.
  const std::string slot = slot_name(config_file);
  const std::string aside = slot + ".tmp-" + std::to_string(::getpid());
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

std::expected<HookSettings, std::string> hook_settings(const std::string& config_file,
                                                       const HookSettingsCache& cache,
                                                       const HookSettingsReader& read,
                                                       std::chrono::system_clock::time_point now) {
  const auto before = identity_of(config_file);
  if (!before) {
    if (before.error() == ENOENT) return HookSettings{};  // no agent.yaml: the defaults, as the agent's
    return read(config_file);                             // let the reader say what is wrong with it
  }
  if (auto hit = cache.find(config_file, *before)) return *hit;
  auto settings = read(config_file);
  if (settings) {
    // Stored only as the file was while it was read: a change meanwhile is read again next time.
    if (const auto after = identity_of(config_file); after && *after == *before)
      cache.store(config_file, *before, *settings, now);
  }
  return settings;
}

}  // namespace gpunode::agent
