// The hook's settings and their cache (hook_settings.hpp): read once per file as it is, never
// taken from an entry for another file or another version of it, never from a directory others
// can write, never stored while the file may still be changing.
#include "hook_settings.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using gpunode::agent::HookSettings;
using gpunode::agent::HookSettingsCache;
using gpunode::agent::identity_of;
using gpunode::config::WhenAgentDown;
using gpunode::test::TempDir;
using namespace std::chrono_literals;

void write(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A reader that counts its calls and answers what the test says the file holds.
struct Reader {
  int calls = 0;
  std::expected<HookSettings, std::string> answer = HookSettings{"/run/x/admin.sock", WhenAgentDown::allow};
  gpunode::agent::HookSettingsReader fn() {
    return [this](const std::string&) {
      ++calls;
      return answer;
    };
  }
};

// Longer than a tick of the clock file times are taken from (a jiffy: 10 ms at most).
void settle_tick() {
  ::usleep(25'000);
}

// Later than any file the test writes by kSettled: the file counts as settled.
auto later() {
  return std::chrono::system_clock::now() + HookSettingsCache::kSettled + 1s;
}

}  // namespace

TEST_CASE("hook settings: a missing file is the defaults, read by nobody") {
  TempDir dir;
  const HookSettingsCache cache((dir / "cache").string());
  Reader reader;
  const auto s = gpunode::agent::hook_settings((dir / "absent.yaml").string(), cache, reader.fn(), later());
  REQUIRE(s);
  CHECK(*s == HookSettings{});
  CHECK(s->socket == "/run/gpunode/admin.sock");
  CHECK(s->when_agent_down == WhenAgentDown::deny);
  CHECK(reader.calls == 0);
  CHECK_FALSE(fs::exists(dir / "cache"));
}

TEST_CASE("hook settings: read once, then taken from the cache until the file changes") {
  TempDir dir;
  const auto config = (dir / "agent.yaml").string();
  write(config, "admin:\n  socket: /run/x/admin.sock\n");
  const HookSettingsCache cache((dir / "cache").string());
  Reader reader;
  auto s = gpunode::agent::hook_settings(config, cache, reader.fn(), later());
  REQUIRE(s);
  CHECK(s->socket == "/run/x/admin.sock");
  CHECK(reader.calls == 1);
  // The directory is made 0700; its one entry names the file.
  struct stat st {};
  REQUIRE(::stat((dir / "cache").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  const auto entry = dir / "cache" / HookSettingsCache::slot_name(config);
  CHECK(read(entry).find(config) != std::string::npos);

  for (int i = 0; i < 3; ++i) {
    s = gpunode::agent::hook_settings(config, cache, reader.fn(), later());
    REQUIRE(s);
    CHECK(s->when_agent_down == WhenAgentDown::allow);
  }
  CHECK(reader.calls == 1);

  // Another version of the file (here the same size, so only the times and maybe the inode tell).
  // Each change waits out the file system's clock tick, so that the times do move (a change within
  // one tick is the racily clean case, which the next test covers with the real clock).
  settle_tick();
  write(config, "admin:\n  socket: /run/y/admin.sock\n");
  reader.answer = HookSettings{"/run/y/admin.sock", WhenAgentDown::deny};
  s = gpunode::agent::hook_settings(config, cache, reader.fn(), later());
  REQUIRE(s);
  CHECK(s->socket == "/run/y/admin.sock");
  CHECK(reader.calls == 2);
  // A file put in its place (a rename, as configuration tools write) is another file.
  settle_tick();
  write(dir / "new.yaml", "admin:\n  socket: /run/z/admin.sock\n");
  fs::rename(dir / "new.yaml", config);
  reader.answer = HookSettings{"/run/z/admin.sock", WhenAgentDown::deny};
  s = gpunode::agent::hook_settings(config, cache, reader.fn(), later());
  CHECK(s->socket == "/run/z/admin.sock");
  CHECK(reader.calls == 3);
  // A chmod moves ctime: read again.
  settle_tick();
  fs::permissions(config, fs::perms::owner_read | fs::perms::owner_write);
  s = gpunode::agent::hook_settings(config, cache, reader.fn(), later());
  CHECK(reader.calls == 4);
}

TEST_CASE(
    "hook settings: a file changed just now is read every time (racily clean), an error is never stored") {
  TempDir dir;
  const auto config = (dir / "agent.yaml").string();
  write(config, "x: 1\n");
  const HookSettingsCache cache((dir / "cache").string());
  Reader reader;
  for (int i = 0; i < 3; ++i)
    REQUIRE(gpunode::agent::hook_settings(config, cache, reader.fn()));  // now: the file is fresh
  CHECK(reader.calls == 3);
  CHECK_FALSE(fs::exists(dir / "cache" / HookSettingsCache::slot_name(config)));

  reader.answer = std::unexpected(config + " is invalid: admin.socket: not an absolute path");
  for (int i = 0; i < 2; ++i) {
    const auto s = gpunode::agent::hook_settings(config, cache, reader.fn(), later());
    REQUIRE_FALSE(s);
    CHECK(s.error() == config + " is invalid: admin.socket: not an absolute path");
  }
  CHECK(reader.calls == 5);
  CHECK_FALSE(fs::exists(dir / "cache" / HookSettingsCache::slot_name(config)));
}

TEST_CASE("hook settings: a file that changes while it is read is not stored") {
  TempDir dir;
  const auto config = (dir / "agent.yaml").string();
  write(config, "x: 1\n");
  const HookSettingsCache cache((dir / "cache").string());
  int calls = 0;
  const auto changing = [&](const std::string& path) -> std::expected<HookSettings, std::string> {
    ++calls;
    write(path, "x: 22\n");  // someone rewrites it between the stat and the read
    return HookSettings{};
  };
  REQUIRE(gpunode::agent::hook_settings(config, cache, changing, later()));
  REQUIRE(gpunode::agent::hook_settings(config, cache, changing, later()));
  CHECK(calls == 2);
}

TEST_CASE(
    "hook settings: an entry for another file, a broken entry or a directory others can write is a miss") {
  TempDir dir;
  const auto config = (dir / "agent.yaml").string();
  const auto other = (dir / "other.yaml").string();
  write(config, "x: 1\n");
  write(other, "x: 2\n");
  const auto cache_dir = dir / "cache";
  const HookSettingsCache cache(cache_dir.string());
  const auto id = identity_of(config);
  REQUIRE(id);
  REQUIRE(cache.store(config, *id, HookSettings{"/a", WhenAgentDown::allow}, later()));
  CHECK(cache.find(config, *id) == HookSettings{"/a", WhenAgentDown::allow});
  const auto entry = cache_dir / HookSettingsCache::slot_name(config);
  const std::string good = read(entry);

  // The same slot holding another file's entry (two paths can share one of kSlots): a miss.
  const auto other_id = identity_of(other);
  REQUIRE(other_id);
  CHECK_FALSE(cache.find(other, *other_id));
  if (HookSettingsCache::slot_name(other) != HookSettingsCache::slot_name(config)) {
    fs::copy_file(entry, cache_dir / HookSettingsCache::slot_name(other),
                  fs::copy_options::overwrite_existing);
  }
  CHECK_FALSE(cache.find(other, *other_id));
  // The right path with another identity: a miss.
  auto moved = *id;
  moved.ctime_ns += 1;
  CHECK_FALSE(cache.find(config, moved));

  // Broken entries: garbage, a wrong version, a bad value, a missing field, too large, a link.
  for (const std::string& broken :
       {std::string("not json"), std::string("{}"), std::string("[1,2]"),
        std::string(good).replace(good.find("\"version\":1"), 11, "\"version\":2"),
        std::string(good).replace(good.find("allow"), 5, "maybe"),
        std::string(good).replace(good.find("\"socket\""), 8, "\"sock\""),
        good + std::string(HookSettingsCache::kMaxEntry, ' ')}) {
    write(entry, broken);
    CHECK_FALSE(cache.find(config, *id));
  }
  fs::remove(entry);
  write(dir / "elsewhere.json", good);
  fs::create_symlink(dir / "elsewhere.json", entry);
  CHECK_FALSE(cache.find(config, *id));
  fs::remove(entry);
  write(entry, good);
  CHECK(cache.find(config, *id));

  // A directory others can write (or read) is not the cache's: neither read nor written.
  fs::permissions(cache_dir, fs::perms::group_write | fs::perms::others_write, fs::perm_options::add);
  CHECK_FALSE(cache.find(config, *id));
  CHECK_FALSE(cache.store(config, *id, HookSettings{}, later()));
  fs::permissions(cache_dir, fs::perms::owner_all);
  CHECK(cache.find(config, *id));
  // One that is a link to a directory is not either.
  const HookSettingsCache linked((dir / "linked").string());
  fs::create_directory_symlink(cache_dir, dir / "linked");
  CHECK_FALSE(linked.find(config, *id));
  CHECK_FALSE(linked.store(config, *id, HookSettings{}, later()));
  // One that belongs to another user is not either (root can make one).
  if (::geteuid() == 0) {
    REQUIRE(::chown(cache_dir.c_str(), 65534, 65534) == 0);
    CHECK_FALSE(cache.find(config, *id));
    CHECK_FALSE(cache.store(config, *id, HookSettings{}, later()));
  }
  // A cache that cannot be made (its parent is missing) only means reading every time.
  const HookSettingsCache nowhere((dir / "missing" / "cache").string());
  CHECK_FALSE(nowhere.store(config, *id, HookSettings{}, later()));
  Reader reader;
  CHECK(gpunode::agent::hook_settings(config, nowhere, reader.fn(), later()));
  CHECK(gpunode::agent::hook_settings(config, nowhere, reader.fn(), later()));
  CHECK(reader.calls == 2);
}

TEST_CASE("hook settings: at most kSlots entries, whatever number of files is read") {
  TempDir dir;
  const HookSettingsCache cache((dir / "cache").string());
  for (int i = 0; i < 200; ++i) {
    const auto config = (dir.path() / ("agent-" + std::to_string(i) + ".yaml")).string();
    write(config, "x: 1\n");
    const auto id = identity_of(config);
    REQUIRE(id);
    CHECK(cache.store(config, *id, HookSettings{}, later()));
  }
  std::size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir / "cache")) {
    CHECK(e.path().filename().string().starts_with("settings-"));
    ++entries;
  }
  CHECK(entries <= HookSettingsCache::kSlots);
  CHECK(entries > 1);
}
