// gpunode/discovery/pci_ids.hpp: device names from the PCI ID database (Debian's pci.ids).
//
// Only the vendors asked for are kept, so loading the 1+ MiB file costs one pass over its bytes
// and memory for their names alone: NVIDIA's and AMD's are about 2,850, kept for the agent's life
// as one string and a sorted table of 12-byte entries (about 100 KiB; a map of strings took 280).
#pragma once

#include <cstdint>
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
  [[nodiscard]] std::size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::uint32_t key;     // vendor << 16 | device
    std::uint32_t offset;  // its name: names_.substr(offset, size)
    std::uint32_t size;
  };
  std::vector<Entry> entries_;  // sorted by key, one per key (the file's first name for it)
  std::string names_;           // every name read, back to back in the file's order (a later
                                // name of a device given twice too, found by no entry)
};

}  // namespace gpunode::discovery
