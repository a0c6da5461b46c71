#include "gpunode/discovery/model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

namespace gpunode::discovery {
namespace {

// Parses exactly `width` hex digits of `text` starting at `pos`.
std::optional<std::uint32_t> hex_field(std::string_view text, std::size_t pos, std::size_t width) {
  if (pos + width > text.size()) return std::nullopt;
  std::uint32_t value = 0;
  const char* first = text.data() + pos;
  const char* last = first + width;
  auto [ptr, ec] = std::from_chars(first, last, value, 16);
  if (ec != std::errc{} || ptr != last) return std::nullopt;
  return value;
}

}  // namespace

std::optional<PciAddress> PciAddress::parse(std::string_view text) {
  // dddd:bb:ss.f
  if (text.size() != 12 || text[4] != ':' || text[7] != ':' || text[10] != '.') return std::nullopt;
  auto domain = hex_field(text, 0, 4);
  auto bus = hex_field(text, 5, 2);
  auto slot = hex_field(text, 8, 2);
  auto function = hex_field(text, 11, 1);
  if (!domain || !bus || !slot || !function || *slot > 0x1f || *function > 7) return std::nullopt;
  return PciAddress{*domain, static_cast<std::uint8_t>(*bus), static_cast<std::uint8_t>(*slot),
                    static_cast<std::uint8_t>(*function)};
}

std::string PciAddress::to_string() const {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", domain, bus, slot, function);
}

const Fault* DeviceRecord::fault(std::string_view attribute) const {
  auto it =
      std::find_if(faults.begin(), faults.end(), [&](const Fault& f) { return f.attribute == attribute; });
  return it == faults.end() ? nullptr : &*it;
}

std::string_view to_string(HealthState state) {
  switch (state) {
    case HealthState::warning:
      return "warning";
    case HealthState::failing:
      return "failing";
    case HealthState::ok:
      break;
  }
  return "ok";
}

HealthState UnitHealth::state() const {
  if (reasons.empty()) return HealthState::ok;
  const bool failing =
      std::any_of(reasons.begin(), reasons.end(), [](const HealthReason& r) { return r.failing; });
  return failing ? HealthState::failing : HealthState::warning;
}

std::string_view to_string(Role role) {
  switch (role) {
    case Role::gpu:
      return "gpu";
    case Role::companion:
      return "companion";
    case Role::bridge:
      return "bridge";
    case Role::nvswitch:
      return "nvswitch";
    case Role::foreign:
      return "foreign";
  }
  return "foreign";
}

std::string_view to_string(UnitClass cls) {
  switch (cls) {
    case UnitClass::vfio_group:
      return "vfio-group";
    case UnitClass::device_request:
      return "device-request";
    case UnitClass::none:
      return "none";
  }
  return "none";
}

std::optional<UnitClass> parse_unit_class(std::string_view text) {
  if (text == "vfio-group") return UnitClass::vfio_group;
  if (text == "device-request") return UnitClass::device_request;
  if (text == "none") return UnitClass::none;
  return std::nullopt;
}

int Unit::gpu_count() const {
  return static_cast<int>(
      std::count_if(devices.begin(), devices.end(), [](const UnitDevice& d) { return d.role == Role::gpu; }));
}

}  // namespace gpunode::discovery
