// gpunode-agent reload (CONTRACT §1, §11): asks the running agent to reload its configuration over
// the admin socket (POST /v1/admin/reload) and exits with its verdict, so that `systemctl reload`
// (the unit's ExecReload=) fails when the new configuration is refused.
//
// The verdict on an answer is pure (tested without a socket); run_reload() does the I/O.
#pragma once

#include <chrono>
#include <expected>
#include <string>
#include <vector>

#include "gpunode/ctl/client.hpp"

namespace gpunode::agent {

inline constexpr int kReloadTook = 0;
inline constexpr int kReloadRefused = 1;
inline constexpr int kReloadUnreachable = 3;
// Bounds the whole exchange: the agent reads the files on a thread of its own, which may be
// waiting on a slow name service; systemd's own bound on ExecReload= is 90 s.
inline constexpr std::chrono::seconds kReloadBound{60};

struct ReloadVerdict {
  int exit_code = kReloadTook;
  std::vector<std::string> out;  // stdout lines
  std::vector<std::string> err;  // stderr lines
};

// 200 {"reloaded": true, "restartNeeded"} -> 0 (the keys needing a restart named on stderr);
// 422 reload-refused -> 1 with each of its errors; another answer -> 1 with its detail; no answer
// -> 3 with why (ctl::describe).
ReloadVerdict reload_verdict(const std::expected<ctl::Response, ctl::TransportError>& answer, uid_t uid);

// The socket is admin.socket of `config_file`, also when other keys of it are invalid (the running
// agent judges the file, not this command); its default when the file cannot be read or the key's
// value is invalid.
ReloadVerdict run_reload(const std::string& config_file);

}  // namespace gpunode::agent
