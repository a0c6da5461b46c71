// A reader of the pci.ids text format that keeps only the vendors asked for:
//   VVVV  Vendor name
//   <TAB>DDDD  Device name
//   <TAB><TAB>SSSS SSSS  Subsystem name     (skipped)
//   C CC  Class name                        (the class section ends the vendor list)
#include "gpunode/discovery/pci_ids.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>

namespace gpunode::discovery {
namespace {

std::optional<std::uint16_t> hex4_at(std::string_view line, std::size_t pos) {
  if (line.size() < pos + 4) return std::nullopt;
  std::uint16_t value = 0;
  auto [ptr, ec] = std::from_chars(line.data() + pos, line.data() + pos + 4, value, 16);
  if (ec != std::errc{} || ptr != line.data() + pos + 4) return std::nullopt;
  return value;
}

// The name after "XXXX  ", trimmed; empty when the line has none.
std::string_view name_after(std::string_view line, std::size_t pos) {
  if (line.size() <= pos) return {};
  line.remove_prefix(pos);
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r'))
    line.remove_suffix(1);
  return line;
}

}  // namespace

PciIds PciIds::parse(std::string_view text, const std::vector<std::uint16_t>& vendors) {
  PciIds ids;
  bool keeping = false;  // inside the section of a wanted vendor
  std::uint16_t vendor = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line.front() == '#') continue;
    if (line.front() != '\t') {
      if (line.size() >= 2 && line[0] == 'C' && line[1] == ' ')
        break;  // the class section: no vendors follow
      auto v = hex4_at(line, 0);
      keeping = v && line.size() > 4 && (line[4] == ' ' || line[4] == '\t') &&
                std::find(vendors.begin(), vendors.end(), *v) != vendors.end();
      if (keeping) vendor = *v;
      continue;
    }
    if (!keeping || line.size() < 2 || line[1] == '\t') continue;  // another vendor's, or a subsystem line
    auto device = hex4_at(line, 1);
    if (!device) continue;
    std::string_view name = name_after(line, 5);
    if (name.empty()) continue;
    if (ids.names_.size() + name.size() > UINT32_MAX) break;  // 4 GiB of names: not pci.ids
    ids.entries_.push_back({static_cast<std::uint32_t>(vendor) << 16 | *device,
                            static_cast<std::uint32_t>(ids.names_.size()),
                            static_cast<std::uint32_t>(name.size())});
    ids.names_.append(name);
  }
  // By key, the file's first name kept where it gives a device twice (stable: the order is the file's).
  const auto by_key = [](const Entry& a, const Entry& b) { return a.key < b.key; };
  std::stable_sort(ids.entries_.begin(), ids.entries_.end(), by_key);
  const auto same_key = [](const Entry& a, const Entry& b) { return a.key == b.key; };
  ids.entries_.erase(std::unique(ids.entries_.begin(), ids.entries_.end(), same_key), ids.entries_.end());
  ids.entries_.shrink_to_fit();
  ids.names_.shrink_to_fit();
  return ids;
}

error::Result<PciIds> PciIds::load(const std::string& path, const std::vector<std::uint16_t>& vendors) {
  // One mapping, no copy: the parser touches the pages it scans and nothing else.
  const auto cannot_read = [&path](int err) {
    return std::unexpected(error::from_errno(err, fmt::format("cannot read {}", path)));
  };
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return cannot_read(errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {  // (st stays zero when fstat fails)
    ::close(fd);
    return error::fail(error::Errc::invalid, fmt::format("cannot read {}: not a regular file", path));
  }
  if (st.st_size == 0) {
    ::close(fd);
    return PciIds{};
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED) return cannot_read(map_errno);
  PciIds ids = parse(std::string_view(static_cast<const char*>(map), size), vendors);
  ::munmap(map, size);
  return ids;
}

std::optional<std::string> PciIds::device_name(std::uint16_t vendor, std::uint16_t device) const {
  const std::uint32_t key = static_cast<std::uint32_t>(vendor) << 16 | device;
  auto it = std::lower_bound(entries_.begin(), entries_.end(), key,
                             [](const Entry& e, std::uint32_t k) { return e.key < k; });
  if (it == entries_.end() || it->key != key) return std::nullopt;
  return names_.substr(it->offset, it->size);
}

}  // namespace gpunode::discovery
