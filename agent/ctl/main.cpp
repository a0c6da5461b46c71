// gpunodectl: the operator's CLI over the agent's admin socket (CONTRACT §8). A thin main over
// gpunode::ctl: the process's socket, clock, terminal, environment and uid go in through Env.
#include <sys/ioctl.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <memory>

#include "../module_abi.hpp"
#include "../modules.hpp"
#include "gpunode/config/config.hpp"
#include "gpunode/config/file.hpp"
#include "gpunode/ctl/app.hpp"

namespace {

std::size_t terminal_width(bool tty) {
  winsize ws{};
  if (tty && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS"); c != nullptr) {
    std::size_t n = 0;
    const std::string_view s(c);
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
    if (ec == std::errc{} && p == s.data() + s.size() && n >= 40 && n <= 1000) return n;
  }
  return 100;
}

// agent.yaml, to find admin.socket in it (config::read_file: the agent's own limit of 1 MiB).
std::optional<std::string> read_small_file(std::string_view path) {
  auto text = gpunode::config::read_file(std::string(path), gpunode::config::kMaxFileSize);
  if (!text) return std::nullopt;
  return std::move(*text);
}

// `audit verify`'s check, in gpunode-agent-proof.so (module_abi.hpp says why a module). The
// module answers with words alone: an export that does not verify is taken as corrupt.
gpunode::error::Result<std::string> verify_export(std::string_view lines, std::string_view key_pem,
                                                  const std::string& key_label) {
  namespace agent = gpunode::agent;
  namespace error = gpunode::error;
  auto entry = agent::load_entry(agent::module_beside_executable(agent::kProofModule), agent::kVerifyEntry);
  if (!entry) return std::unexpected(std::move(entry.error()));
  char* said = nullptr;
  const int verdict = reinterpret_cast<gpunode_agent_verify_fn*>(*entry)(
      lines.data(), lines.size(), key_pem.data(), key_pem.size(), key_label.c_str(), &said);
  std::string message = said != nullptr ? said : "the check's message could not be allocated";
  std::free(said);
  if (verdict != 0) return error::fail(error::Errc::corrupt, std::move(message));
  return message;
}

void write_all(std::FILE* f, const std::string& s) {
  if (!s.empty()) std::fwrite(s.data(), 1, s.size(), f);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    gpunode::ctl::Env env;
    env.connect = [](const std::string& path) {
      return std::make_unique<gpunode::ctl::UnixClient>(path, "gpunodectl/" GPUNODE_VERSION);
    };
    env.read_file = read_small_file;
    env.now = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
    env.stdout_tty = ::isatty(STDOUT_FILENO) == 1;
    env.no_color = std::getenv("NO_COLOR");
    env.width = terminal_width(env.stdout_tty);
    env.uid = ::geteuid();
    env.version = GPUNODE_VERSION;
    env.verify_export = verify_export;
    const std::vector<std::string> args(argv + (argc > 0 ? 1 : 0), argv + argc);
    const auto r = gpunode::ctl::run(args, env);
    write_all(stdout, r.out);
    std::fflush(stdout);
    write_all(stderr, r.err);
    return r.exit_code;
  } catch (const std::exception& e) {
    // A bug, never bad input: say so instead of dying silently.
    std::fprintf(stderr, "gpunodectl: internal error: %s\n", e.what());
    return 70;
  }
}
