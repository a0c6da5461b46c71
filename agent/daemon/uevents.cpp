#include "gpunode/daemon/uevents.hpp"

#include <linux/netlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>

namespace gpunode::daemon {

std::optional<Uevent> parse_uevent(std::string_view message) {
  const auto head_end = message.find('\0');
  const auto head = message.substr(0, head_end);
  const auto at = head.find('@');
  if (at == std::string_view::npos || at == 0 || at + 1 >= head.size() || head[at + 1] != '/')
    return std::nullopt;
  Uevent e;
  e.action = std::string(head.substr(0, at));
  e.devpath = std::string(head.substr(at + 1));
  if (head_end == std::string_view::npos) return e;
  auto rest = message.substr(head_end + 1);
  while (!rest.empty()) {
    const auto end = rest.find('\0');
    const auto field = rest.substr(0, end);
    if (field.starts_with("SUBSYSTEM=")) e.subsystem = std::string(field.substr(10));
    if (end == std::string_view::npos) break;
    rest = rest.substr(end + 1);
  }
  return e;
}

bool changes_units(const Uevent& e) {
  if (e.subsystem == "pci")
    return e.action == "add" || e.action == "remove" || e.action == "bind" || e.action == "unbind";
  if (e.subsystem == "iommu_group") return e.action == "add" || e.action == "remove";
  return false;
}

error::Result<std::unique_ptr<UeventMonitor>> UeventMonitor::open(boost::asio::io_context& io) {
  const int fd = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_KOBJECT_UEVENT);
  if (fd < 0) return std::unexpected(error::from_errno(errno, "netlink uevent socket"));
  sockaddr_nl addr{};
  addr.nl_family = AF_NETLINK;
  addr.nl_groups = 1;  // the kernel's uevents (libudev's rebroadcast is group 2)
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    const int e = errno;
    ::close(fd);
    return std::unexpected(error::from_errno(e, "netlink uevent socket: bind"));
  }
  return std::unique_ptr<UeventMonitor>(new UeventMonitor(boost::asio::posix::stream_descriptor(io, fd)));
}

void UeventMonitor::watch(std::function<void(const UeventNotice&)> seen) {
  seen_ = std::move(seen);
  receive();
}

void UeventMonitor::stop() {
  seen_ = {};
  boost::system::error_code ec;
  fd_.cancel(ec);
}

void UeventMonitor::receive() {
  fd_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                 [this](const boost::system::error_code& ec) {
                   if (ec || !seen_) return;
                   // Drain what is queued: a hot-plug is a burst of events. ENOBUFS (the queue overflowed)
                   // loses events but not the answer: the loss is passed on, and the rescan looks at
                   // everything.
                   std::array<char, 8192> buf;
                   for (int i = 0; i < 256; ++i) {
                     sockaddr_nl from{};
                     iovec iov{buf.data(), buf.size()};
                     msghdr msg{};
                     msg.msg_name = &from;
                     msg.msg_namelen = sizeof from;
                     msg.msg_iov = &iov;
                     msg.msg_iovlen = 1;
                     const auto n = ::recvmsg(fd_.native_handle(), &msg, 0);
                     if (n < 0) {
                       if (errno == ENOBUFS && seen_) seen_(UeventsLost{});
                       if (errno == EINTR || errno == ENOBUFS) continue;
                       break;  // EAGAIN: drained
                     }
                     if ((msg.msg_flags & MSG_TRUNC) != 0) continue;
                     if (auto e = parse_uevent(std::string_view(buf.data(), static_cast<std::size_t>(n)));
                         e && changes_units(*e) && seen_)
                       seen_(*e);
                   }
                   if (seen_) receive();
                 });
}

}  // namespace gpunode::daemon
