// gpunode/daemon/uevents.hpp: the kernel's device events (uevents), so that a PCI device added,
// removed, bound or unbound is seen at once rather than at the next rescan_interval.
//
// The kernel sends each uevent on a netlink socket (NETLINK_KOBJECT_UEVENT, multicast group 1) as
// "ACTION@DEVPATH\0KEY=VALUE\0...". UeventMonitor listens there and calls back for the ones that
// can change the units (parse_uevent and changes_units are its pure half, tested alone); the daemon
// rescans a moment after the first of a burst. Only the kernel (and root) can send on that group.
// Where the socket cannot be opened (no netlink in a sandbox), the daemon says so and keeps the
// interval, which is always the backstop.
//
// Threads: one io_context's thread (the daemon's core); not thread-safe.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "gpunode/error/error.hpp"

namespace gpunode::daemon {

struct Uevent {
  std::string action;     // add, remove, bind, unbind, change, move, online, offline
  std::string devpath;    // /devices/pci0000:00/0000:00:01.0/0000:01:00.0
  std::string subsystem;  // pci, iommu_group, vfio, ...
};

// The socket's queue overflowed (ENOBUFS): some uevents were lost, which ones is unknown.
struct UeventsLost {};
// What the monitor passes on: a uevent that changes_units(), or a loss.
using UeventNotice = std::variant<Uevent, UeventsLost>;

// One netlink message: the kernel's format; nullopt for anything else (libudev's own messages,
// which start "libudev\0", or garbage).
std::optional<Uevent> parse_uevent(std::string_view message);

// Whether a uevent can change what discovery finds: a PCI function added, removed, bound or
// unbound (its driver is part of a unit's classification), an IOMMU group added or removed.
bool changes_units(const Uevent& e);

class UeventMonitor {
 public:
  // An error says why the socket could not be opened or bound (its errno kept).
  static error::Result<std::unique_ptr<UeventMonitor>> open(boost::asio::io_context& io);
  UeventMonitor(const UeventMonitor&) = delete;
  UeventMonitor& operator=(const UeventMonitor&) = delete;
  ~UeventMonitor() = default;

  // Calls `seen` for each uevent that changes_units(), and for each loss, until stop().
  void watch(std::function<void(const UeventNotice&)> seen);
  void stop();

 private:
  explicit UeventMonitor(boost::asio::posix::stream_descriptor fd) : fd_(std::move(fd)) {}
  void receive();

  boost::asio::posix::stream_descriptor fd_;
  std::function<void(const UeventNotice&)> seen_;
};

}  // namespace gpunode::daemon
