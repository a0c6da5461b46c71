// gpunode/discovery/pci_ids.hpp: device names from the PCI ID database (Debian's pci.ids).
//
// Only the vendors asked for are kept, so loading the 1+ MiB file costs one pass over its bytes
// and memory for a few hundred names.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/error/error.hpp"

namespace gpunode::discovery {

class PciIds {
 public:
  PciIds() = default;

  // Parses pci.ids text, keeping the device names of `vendors`. Malformed lines are skipped.
  static PciIds parse(std::string_view text, const std::vector<std::uint16_t>& vendors);
  // Reads `path`; an error's detail says which file and why (the errno kept: a missing file is
  // not_found; a file that is not a regular one invalid).
  static error::Result<PciIds> load(const std::string& path, const std::vector<std::uint16_t>& vendors);

  [[nodiscard]] std::optional<std::string> device_name(std::uint16_t vendor, std::uint16_t device) const;
  [[nodiscard]] std::size_t size() const { return names_.size(); }

 private:
  std::map<std::uint32_t, std::string> names_;  // (vendor << 16 | device) -> name
};

}  // namespace gpunode::discovery
