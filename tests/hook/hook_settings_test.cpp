// The hook's settings and their cache (hook_settings.hpp): the settings of exactly the bytes read in
// this run, taken from an entry made from those bytes or read by the agent's reader; never from an
// entry for another file or other bytes, never from a directory others can write.
#include "hook_settings.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "temp_dir.hpp"

namespace {

namespace fs = std::filesystem;
using gpunode::agent::HookSettings;
using gpunode::agent::HookSettingsCache;
using gpunode::config::WhenAgentDown;
using gpunode::test::TempDir;

void write(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A stand-in for the agent's reader: `when_agent_down: allow` in the bytes means allow, and the
// socket is the text after `socket: ` up to the end of its line. Counts its calls.
struct Reader {
  int calls = 0;
  std::optional<std::string> refuse;  // the error it answers with, if set
  gpunode::agent::HookSettingsReader fn() {
    return [this](const std::string& file, std::string_view bytes) -> gpunode::error::Result<HookSettings> {
      ++calls;
      if (refuse) return gpunode::error::fail(gpunode::error::Errc::invalid, *refuse);
      HookSettings s;
      if (bytes.find("when_agent_down: allow") != std::string_view::npos)
        s.when_agent_down = WhenAgentDown::allow;
      if (const auto at = bytes.find("socket: "); at != std::string_view::npos) {
        const auto from = at + 8;
        s.socket = std::string(bytes.substr(from, bytes.find('\n', from) - from));
      }
      (void)file;
      return s;
    };
  }
};

std::string config_text(std::string_view socket, std::string_view when) {
  return "admin:\n  socket: " + std::string(socket) +
         "\nenforcement:\n  when_agent_down: " + std::string(when) + "\n";
}

}  // namespace

TEST_CASE("hook settings: a missing file is the defaults, read by nobody; an unreadable one refuses") {
  TempDir dir;
  const HookSettingsCache cache((dir / "cache").string());
  Reader reader;
  const auto s = gpunode::agent::hook_settings((dir / "absent.yaml").string(), cache, reader.fn());
  REQUIRE(s);
  CHECK(*s == HookSettings{});
  CHECK(s->socket == "/run/gpunode/admin.sock");
  CHECK(s->when_agent_down == WhenAgentDown::deny);
  CHECK(reader.calls == 0);
  CHECK_FALSE(fs::exists(dir / "cache"));

  // A directory, a FIFO (never opened for a blocking read: the hook must not hang), a path through a file.
  fs::create_directory(dir / "dir.yaml");
  REQUIRE(::mkfifo((dir / "fifo.yaml").c_str(), 0600) == 0);
  write(dir / "file", "x");
  for (const auto& [path, why] :
       {std::pair{dir / "dir.yaml", "not a regular file"}, std::pair{dir / "fifo.yaml", "not a regular file"},
        std::pair{dir / "file" / "agent.yaml", "Not a directory"}}) {
    CAPTURE(path);
    const auto bad = gpunode::agent::hook_settings(path.string(), cache, reader.fn());
    REQUIRE_FALSE(bad);
    CHECK(bad.error().detail == "cannot read " + path.string() + ": " + why);
  }
  CHECK(reader.calls == 0);

  // Larger than the agent takes (config::kMaxFileSize): refused here too, never parsed.
  write(dir / "big.yaml",
        config_text("/nonexistent/admin.sock", "allow") + std::string(gpunode::config::kMaxFileSize, '#'));
  const auto big = gpunode::agent::hook_settings((dir / "big.yaml").string(), cache, reader.fn());
  REQUIRE_FALSE(big);
  CHECK(big.error().detail == "cannot read " + (dir / "big.yaml").string() + ": larger than 1 MiB");
  CHECK(reader.calls == 0);
}

TEST_CASE("hook settings: read once, then taken from the cache while the bytes are the same") {
  TempDir dir;
  const auto config = (dir / "agent.yaml").string();
  write(config, config_text("/run/x/admin.sock", "allow"));
  const HookSettingsCache cache((dir / "cache").string());
  Reader reader;
  auto s = gpunode::agent::hook_settings(config, cache, reader.fn());
  REQUIRE(s);
  CHECK(*s == HookSettings{"/run/x/admin.sock", WhenAgentDown::allow});
  CHECK(reader.calls == 1);
  // The directory is made 0700; its one entry names the file.
  struct stat st {};
  REQUIRE(::stat((dir / "cache").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  CHECK(read(dir / "cache" / HookSettingsCache::slot_name(config)).find(config) != std::string::npos);
  for (int i = 0; i < 3; ++i) {
    s = gpunode::agent::hook_settings(config, cache, reader.fn());
    REQUIRE(s);
    CHECK(*s == HookSettings{"/run/x/admin.sock", WhenAgentDown::allow});
  }
  CHECK(reader.calls == 1);
  // Touched, chmod'ed, copied over with the same bytes: still the same settings, still a hit.
  fs::permissions(config, fs::perms::owner_read | fs::perms::owner_write);
  write(config, config_text("/run/x/admin.sock", "allow"));
  CHECK(gpunode::agent::hook_settings(config, cache, reader.fn()) ==
        HookSettings{"/run/x/admin.sock", WhenAgentDown::allow});
  CHECK(reader.calls == 1);
}

TEST_CASE("hook settings: other bytes are read again at once, however the file's metadata looks") {
  TempDir dir;
  const auto config = (dir / "agent.yaml").string();
  const HookSettingsCache cache((dir / "cache").string());
  Reader reader;
  // The same size, rewritten in place within the clock's tick: only the bytes tell.
  write(config, config_text("/run/a/admin.sock", "allow"));
  CHECK(gpunode::agent::hook_settings(config, cache, reader.fn())->when_agent_down == WhenAgentDown::allow);
  write(config, config_text("/run/a/admin.sock", "deny!"));
  CHECK(gpunode::agent::hook_settings(config, cache, reader.fn())->when_agent_down == WhenAgentDown::deny);
  CHECK(reader.calls == 2);

  // A symbolic link flipped to another file and back (a release directory and a rollback): each
  // call follows the bytes the link names now, the entry never outlives them.
  write(dir / "a.yaml", config_text("/run/a/admin.sock", "deny"));
  write(dir / "b.yaml", config_text("/run/b/admin.sock", "allow"));
  const auto link = (dir / "link.yaml").string();
  for (int round = 0; round < 3; ++round) {
    for (const char* target : {"a.yaml", "b.yaml"}) {
      fs::remove(link);
      fs::create_symlink(target, link);
      const auto s = gpunode::agent::hook_settings(link, cache, reader.fn());
      REQUIRE(s);
      CAPTURE(target);
      CHECK(*s == (std::string(target) == "a.yaml"
                       ? HookSettings{"/run/a/admin.sock", WhenAgentDown::deny}
                       : HookSettings{"/run/b/admin.sock", WhenAgentDown::allow}));
    }
  }
}

TEST_CASE("hook settings: an error is never stored, a large file never cached") {
  TempDir dir;
  const auto config = (dir / "agent.yaml").string();
  write(config, "enforcement: [\n");
  const HookSettingsCache cache((dir / "cache").string());
  Reader reader;
  reader.refuse = config + " is invalid: 2:1: a flow sequence is not closed";
  for (int i = 0; i < 2; ++i) {
    const auto s = gpunode::agent::hook_settings(config, cache, reader.fn());
    REQUIRE_FALSE(s);
    CHECK(s.error().detail == *reader.refuse);
  }
  CHECK(reader.calls == 2);
  CHECK_FALSE(fs::exists(dir / "cache" / HookSettingsCache::slot_name(config)));

  reader.refuse.reset();
  write(config, config_text("/run/x/admin.sock", "allow") + "# " +
                    std::string(HookSettingsCache::kMaxContent, 'x') + "\n");
  for (int i = 0; i < 2; ++i) REQUIRE(gpunode::agent::hook_settings(config, cache, reader.fn()));
  CHECK(reader.calls == 4);
  CHECK_FALSE(cache.find(config, read(config)));
}

TEST_CASE(
    "hook settings: an entry for another file or other bytes, a broken entry or a directory others can write "
    "is a miss") {
  TempDir dir;
  const auto config = (dir / "agent.yaml").string();
  const std::string bytes = config_text("/a", "allow");
  const auto cache_dir = dir / "cache";
  const HookSettingsCache cache(cache_dir.string());
  REQUIRE(cache.store(config, bytes, HookSettings{"/a", WhenAgentDown::allow}));
  CHECK(cache.find(config, bytes) == HookSettings{"/a", WhenAgentDown::allow});
  CHECK_FALSE(cache.find(config, bytes + " "));
  CHECK_FALSE(cache.find(config, ""));
  const auto entry = cache_dir / HookSettingsCache::slot_name(config);
  const std::string good = read(entry);

  // The same slot holding another file's entry (two paths can share one of kSlots): a miss.
  const auto other = (dir / "other.yaml").string();
  if (HookSettingsCache::slot_name(other) != HookSettingsCache::slot_name(config)) {
    fs::copy_file(entry, cache_dir / HookSettingsCache::slot_name(other),
                  fs::copy_options::overwrite_existing);
  }
  CHECK_FALSE(cache.find(other, bytes));

  // Broken entries: garbage, a wrong version, a bad value, a missing field, too large, a link.
  for (const std::string& broken :
       {std::string("not json"), std::string("{}"), std::string("[1,2]"),
        std::string(good).replace(good.find("\"version\":2"), 11, "\"version\":1"),
        std::string(good).replace(good.find("\"allow\""), 7, "\"maybe\""),
        std::string(good).replace(good.find("\"socket\""), 8, "\"sock\""),
        good + std::string(HookSettingsCache::kMaxEntry, ' ')}) {
    write(entry, broken);
    CHECK_FALSE(cache.find(config, bytes));
  }
  fs::remove(entry);
  write(dir / "elsewhere.json", good);
  fs::create_symlink(dir / "elsewhere.json", entry);
  CHECK_FALSE(cache.find(config, bytes));
  fs::remove(entry);
  write(entry, good);
  CHECK(cache.find(config, bytes));

  // A directory others can write (or read) is not the cache's: neither read nor written.
  fs::permissions(cache_dir, fs::perms::group_write | fs::perms::others_write, fs::perm_options::add);
  CHECK_FALSE(cache.find(config, bytes));
  CHECK_FALSE(cache.store(config, bytes, HookSettings{}));
  fs::permissions(cache_dir, fs::perms::owner_all);
  CHECK(cache.find(config, bytes));
  // One that is a link to a directory is not either.
  const HookSettingsCache linked((dir / "linked").string());
  fs::create_directory_symlink(cache_dir, dir / "linked");
  CHECK_FALSE(linked.find(config, bytes));
  CHECK_FALSE(linked.store(config, bytes, HookSettings{}));
  // One that belongs to another user is not either (root can make one).
  if (::geteuid() == 0) {
    REQUIRE(::chown(cache_dir.c_str(), 65534, 65534) == 0);
    CHECK_FALSE(cache.find(config, bytes));
    CHECK_FALSE(cache.store(config, bytes, HookSettings{}));
  }
  // A cache that cannot be made (its parent is missing) only means reading every time.
  write(config, bytes);
  const HookSettingsCache nowhere((dir / "missing" / "cache").string());
  CHECK_FALSE(nowhere.store(config, bytes, HookSettings{}));
  Reader reader;
  CHECK(gpunode::agent::hook_settings(config, nowhere, reader.fn()));
  CHECK(gpunode::agent::hook_settings(config, nowhere, reader.fn()));
  CHECK(reader.calls == 2);
}

TEST_CASE("hook settings: at most kSlots entries, and what a killed writer left aside is swept") {
  TempDir dir;
  const auto cache_dir = dir / "cache";
  const HookSettingsCache cache(cache_dir.string());
  REQUIRE(cache.store("/first.yaml", "x: 1\n", HookSettings{}));
  // A writer killed between its write and its rename, a while ago; and one writing now.
  write(cache_dir / "settings-3.json.tmp-4242", "{\"half");
  const auto old = fs::file_time_type::clock::now() - std::chrono::minutes(5);
  fs::last_write_time(cache_dir / "settings-3.json.tmp-4242", old);
  write(cache_dir / "settings-4.json.tmp-4343", "{\"half");
  for (int i = 0; i < 200; ++i) {
    const std::string config = "/etc/gpunode/agent-" + std::to_string(i) + ".yaml";
    CHECK(cache.store(config, "x: 1\n", HookSettings{}));
  }
  std::size_t entries = 0;
  for (const auto& e : fs::directory_iterator(cache_dir)) {
    const std::string name = e.path().filename().string();
    CHECK(name.starts_with("settings-"));
    CHECK(name != "settings-3.json.tmp-4242");  // swept
    if (name.find(".tmp-") == std::string::npos) ++entries;
  }
  CHECK(entries <= HookSettingsCache::kSlots);
  CHECK(entries > 1);
  CHECK(fs::exists(cache_dir / "settings-4.json.tmp-4343"));  // a writer at work is left alone
}
