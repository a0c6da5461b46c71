// The host root check. See host_root.hpp.
#include "gpunode/discovery/host_root.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <system_error>

namespace gpunode::discovery {

error::Result<void> check_host_root(const std::filesystem::path& root) {
  constexpr std::string_view kHint = "is discovery.host_root (or --host-root) the host's root?";
  const std::filesystem::path bus = root / "sys" / "bus" / "pci";
  std::error_code ec;
  const auto st = std::filesystem::status(bus, ec);
  if (st.type() == std::filesystem::file_type::not_found) {
    return std::unexpected(
        error::os_error(ec ? ec.value() : ENOENT, fmt::format("{} does not exist: {}", bus.string(), kHint)));
  }
  if (ec) {
    return std::unexpected(error::os_error(
        ec.value(), fmt::format("cannot read {}: {}: {}", bus.string(), ec.message(), kHint)));
  }
  if (st.type() != std::filesystem::file_type::directory) {
    return error::fail(error::Errc::invalid, fmt::format("{} is not a directory: {}", bus.string(), kHint));
  }
  return {};
}

}  // namespace gpunode::discovery
