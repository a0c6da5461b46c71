// gpunode/ctl/socket_path.hpp: which admin socket gpunodectl talks to (CONTRACT §8): --socket, else
// `admin.socket` of /etc/gpunode/agent.yaml when that file is readable, else /run/gpunode/admin.sock.
//
// gpunodectl reads that one key without a YAML library (it links none, to start fast): the reader
// below understands what agent.yaml holds (block mappings, `admin: {socket: ...}` flow mappings,
// plain, 'single' and "double" quoted scalars, comments). A file it cannot follow there is an
// error naming the file and line, never a silent fall back to another socket.
#pragma once

#include <expected>
#include <optional>
#include <string>
#include <string_view>

namespace gpunode::ctl {

inline constexpr std::string_view kDefaultConfig = "/etc/gpunode/agent.yaml";
inline constexpr std::string_view kDefaultSocket = "/run/gpunode/admin.sock";

// `admin.socket` of an agent.yaml text; nullopt when the text does not set it. The error says
// which line could not be read ("line 14: ...").
std::expected<std::optional<std::string>, std::string> admin_socket_from_yaml(std::string_view text);

struct SocketChoice {
  std::string path;
  std::string source;  // "--socket", "admin.socket of FILE", "the default"
};

// The flag when given; else the config file's key when the file is readable (`read` returns its
// text, or nullopt when it cannot be read); else the default.
std::expected<SocketChoice, std::string> choose_socket(const std::optional<std::string>& flag, std::string_view config_path,
                                                       const std::optional<std::string>& config_text);

}  // namespace gpunode::ctl
