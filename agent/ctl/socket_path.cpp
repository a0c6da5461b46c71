#include "gpunode/ctl/socket_path.hpp"

#include <fmt/format.h>

#include "gpunode/config/config.hpp"

namespace gpunode::ctl {

error::Result<std::optional<std::string>> admin_socket_from_yaml(std::string_view text,
                                                                 const std::string& file) {
  // The agent's own loader: what the agent would read is what gpunodectl reads (one parser).
  const auto loaded = config::load_string(text, file, config::Purpose::discover);
  if (!loaded.ok()) return error::fail(error::Errc::invalid, loaded.problems.front().to_string());
  if (loaded.config.admin.socket == kDefaultSocket) return std::optional<std::string>();
  return std::optional<std::string>(loaded.config.admin.socket);
}

error::Result<SocketChoice> choose_socket(const std::optional<std::string>& flag,
                                          std::string_view config_path,
                                          const std::optional<std::string>& config_text) {
  if (flag) return SocketChoice{*flag, "--socket"};
  if (config_text) {
    auto s = admin_socket_from_yaml(*config_text, std::string(config_path));
    if (!s)
      return error::fail(error::Errc::invalid,
                         fmt::format("cannot read admin.socket: {}; pass --socket PATH", s.error().detail));
    if (*s) return SocketChoice{**s, fmt::format("admin.socket of {}", config_path)};
  }
  return SocketChoice{std::string(kDefaultSocket), "the default"};
}

}  // namespace gpunode::ctl
