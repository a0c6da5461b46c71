// gpunode/ctl/socket_path.hpp: which admin socket gpunodectl talks to (CONTRACT §8): --socket, else
// `admin.socket` of /etc/gpunode/agent.yaml when that file is readable, else /run/gpunode/admin.sock.
//
// The file is read by the agent's own loader (gpunode::config), so gpunodectl reads exactly what
// the agent reads. A file the loader refuses is an error naming FILE:LINE:COLUMN, never a silent
// fall back to another socket.
#pragma once

#include <expected>
#include <optional>
#include <string>
#include <string_view>

#include "gpunode/error/error.hpp"

namespace gpunode::ctl {

inline constexpr std::string_view kDefaultConfig = "/etc/gpunode/agent.yaml";
inline constexpr std::string_view kDefaultSocket = "/run/gpunode/admin.sock";

// `admin.socket` of an agent.yaml text (`file` names it in errors); nullopt when the text leaves it
// at the default. The error is the loader's first problem ("FILE:LINE:COLUMN: ...").
error::Result<std::optional<std::string>> admin_socket_from_yaml(std::string_view text,
                                                                 const std::string& file);

struct SocketChoice {
  std::string path;
  std::string source;  // "--socket", "admin.socket of FILE", "the default"
};

// The flag when given; else the config file's key when the file is readable (`read` returns its
// text, or nullopt when it cannot be read); else the default.
error::Result<SocketChoice> choose_socket(const std::optional<std::string>& flag,
                                          std::string_view config_path,
                                          const std::optional<std::string>& config_text);

}  // namespace gpunode::ctl
