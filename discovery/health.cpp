// What the kernel shows about a PCI function's health (see health.hpp): the parsers, the targets
// of a unit, and the Reader. Nothing here throws or blocks for anything the host tree holds: files
// are opened O_NONBLOCK (a FIFO answers at once), read into a fixed buffer, and every read that
// fails is a Fault of this poll.
#include "gpunode/discovery/health.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <set>

#include "sysfs_device.hpp"

namespace gpunode::discovery::health {
namespace {

constexpr std::string_view kSpace = " \t";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\t' || s.back() == '\0'))
    s.remove_suffix(1);
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  return s;
}

std::optional<std::uint64_t> whole_decimal(std::string_view s) {
  std::uint64_t v = 0;
  if (s.empty() || s.front() == '+' || s.front() == '-') return std::nullopt;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

std::optional<std::uint64_t> parse_aer_total(std::string_view text, std::string_view label) {
  std::optional<std::uint64_t> found;
  bool twice = false;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (!line.starts_with(label)) continue;
    std::string_view rest = line.substr(label.size());
    if (rest.empty() || kSpace.find(rest.front()) == std::string_view::npos) continue;  // a longer name
    if (found) twice = true;
    found = whole_decimal(trim(rest));
    if (!found) return std::nullopt;
  }
  if (twice) return std::nullopt;
  return found;
}

std::optional<int> parse_link_width(std::string_view text) {
  const auto v = whole_decimal(trim(text));
  if (!v || *v > 32) return std::nullopt;
  return static_cast<int>(*v);
}

Power parse_power_state(std::string_view text) {
  text = trim(text);
  if (text == "D0") return Power::d0;
  if (text == "D1" || text == "D2" || text == "D3hot" || text == "D3cold") return Power::asleep;
  return Power::unknown;
}

ConfigAnswer parse_config_head(std::string_view bytes) {
  if (bytes.size() < 4) return ConfigAnswer::failed;
  const bool ones = std::all_of(bytes.begin(), bytes.begin() + 4, [](char c) { return c == '\xff'; });
  return ones ? ConfigAnswer::all_ones : ConfigAnswer::answers;
}

std::vector<Target> targets_of(const Unit& unit,
                               const std::function<std::optional<PciAddress>(const PciAddress&)>& parent_of) {
  std::set<PciAddress> members, gpu_parents, ports;
  for (const auto& m : unit.devices) members.insert(m.device.address);
  for (const auto& m : unit.devices) {
    const auto parent = parent_of(m.device.address);
    if (!parent) continue;
    if (m.role == Role::gpu) gpu_parents.insert(*parent);
    if (!members.contains(*parent)) ports.insert(*parent);
  }
  std::vector<Target> out;
  for (const auto& m : unit.devices) {
    const bool gpu = m.role == Role::gpu;
    out.push_back({m.device.address, gpu, gpu || gpu_parents.contains(m.device.address)});
  }
  for (const auto& p : ports) out.push_back({p, false, gpu_parents.contains(p)});
  return out;
}

// ---- the Reader ------------------------------------------------------------------------------

namespace {

// One attribute's text, read into a buffer of the caller's (a page: what sysfs shows at most), or
// the errno of its failure. One read: sysfs gives an attribute whole, and a poll's cost is its
// system calls (open, read, close: no read more to see the end, no allocation).
struct Attr {
  char buf[4096];
  std::size_t len = 0;
  int error = 0;
  [[nodiscard]] std::string_view text() const { return {buf, len}; }
};

// At most `max` bytes of `fd`, one read (sysfs gives an attribute whole): a held descriptor is read
// again from offset 0 (sysfs shows an attribute afresh at each read from 0), one just opened where
// it stands (a FIFO has no offset). Whether it could be read.
bool read_into(int fd, bool held, Attr& out, std::size_t max) {
  out.len = 0;
  out.error = 0;
  const std::size_t want = std::min(max, sizeof out.buf);
  ssize_t n = 0;
  do {
    n = held ? ::pread(fd, out.buf, want, 0) : ::read(fd, out.buf, want);
  } while (n < 0 && errno == EINTR);
  if (n < 0) out.error = errno == EAGAIN ? EIO : errno;  // a FIFO with a silent writer: no answer
  if (n > 0) out.len = static_cast<std::size_t>(n);
  return n >= 0;
}

void read_attr(int dir_fd, const char* name, Attr& out, std::size_t max = sizeof(Attr::buf)) {
  const int fd = ::openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    out.len = 0;
    out.error = errno;
    return;
  }
  read_into(fd, false, out, max);
  ::close(fd);
}

bool has(int dir_fd, const char* name) {
  return ::faccessat(dir_fd, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

// The files a poll reads every time (the AER counters of every function; the power state, link
// width and config head of a GPU and its port) are held open and read again from offset 0 (sysfs
// shows an attribute afresh at each read from 0): one system call instead of three, and no path
// walked. A function removed since it was watched fails its held files' reads (sysfs answers
// ENODEV): that poll's power state is unknown, so neither link nor config is judged, and each
// file is opened again for the next poll (a function added back at the same address is read
// afresh). At most this many are held, past it they are opened for each read: the agent's own
// files have a budget (kOwnFiles, 512, in daemon/startup.cpp) that also holds a directory per
// watched function, SQLite, libvirt and the listeners. 96 holds every polled file of an 8-GPU host
// (the demo host: at most 94, for its 18 functions).
constexpr std::size_t kMaxHeldFiles = 96;
enum Polled : std::size_t { aer_fatal, aer_nonfatal, aer_correctable, power, link_width, config_head };
constexpr const char* kPolledFiles[] = {"aer_dev_fatal", "aer_dev_nonfatal",   "aer_dev_correctable",
                                        "power_state",   "current_link_width", "config"};
constexpr const char* kAerFiles[] = {kPolledFiles[aer_fatal], kPolledFiles[aer_nonfatal],
                                     kPolledFiles[aer_correctable]};

struct Watched {
  Target target;
  int fd = -1;  // the function's directory (O_PATH), -1 when it could not be opened
  bool aer = false, power_state = false;
  std::optional<int> max_width;                                           // read once, in D0
  std::array<int, std::size(kPolledFiles)> held{-1, -1, -1, -1, -1, -1};  // kPolledFiles, held open (or -1)

  // Whether kPolledFiles[i] of this function is held open (read at every poll).
  [[nodiscard]] bool holds(Polled i) const {
    switch (i) {
      case aer_fatal:
      case aer_nonfatal:
      case aer_correctable:
        return aer;
      case power:
        return power_state && (target.link_judged || target.gpu);
      case link_width:
        return target.link_judged;
      case config_head:
        return target.gpu;
    }
    return false;
  }
};

// kPolledFiles[i] of the function, at most `max` bytes: from its held descriptor (pread at 0), else
// opened for this read. A held one that fails (the function was removed, and maybe added again at
// the same address) is opened again for the next poll: this read is unknown, as any failed read is.
void read_polled(Watched& w, Polled i, Attr& out, std::size_t max = sizeof(Attr::buf)) {
  int& fd = w.held[i];
  if (fd < 0) return read_attr(w.fd, kPolledFiles[i], out, max);
  if (read_into(fd, true, out, max)) return;
  ::close(fd);
  fd = ::openat(w.fd, kPolledFiles[i], O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
}

}  // namespace

struct Reader::Impl {
  std::string devices;  // <host_root>/sys/bus/pci/devices
  std::vector<Target> targets;
  std::vector<Watched> watched;

  void close_all() {
    for (auto& w : watched) {
      if (w.fd >= 0) ::close(w.fd);
      for (int fd : w.held) {
        if (fd >= 0) ::close(fd);
      }
    }
    watched.clear();
  }
  void read_aer(Watched& w, Reading& r, Attr& a) const;
  void read_link(Watched& w, Reading& r, Attr& a) const;
  void read_config(Watched& w, Reading& r, Attr& a) const;
  Reading read_one(Watched& w, bool counts_only) const;
};

Reader::Reader(std::filesystem::path host_root) : impl_(std::make_unique<Impl>()) {
  impl_->devices = (host_root / "sys/bus/pci/devices").string();
}

Reader::~Reader() {
  impl_->close_all();
}

std::optional<PciAddress> Reader::parent_of(const PciAddress& address) const {
  char buf[4096];
  const std::string link = impl_->devices + "/" + address.to_string();
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return std::nullopt;
  std::string_view path(buf, static_cast<std::size_t>(n));
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  const auto last = path.rfind('/');
  if (last == std::string_view::npos) return std::nullopt;
  path = path.substr(0, last);
  const auto before = path.rfind('/');
  return PciAddress::parse(before == std::string_view::npos ? path : path.substr(before + 1));
}

void Reader::watch(std::vector<Target> targets) {
  impl_->close_all();
  impl_->targets = std::move(targets);
  std::size_t held = 0;
  for (const auto& t : impl_->targets) {
    Watched w;
    w.target = t;
    const std::string dir = impl_->devices + "/" + t.address.to_string();
    w.fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (w.fd >= 0) {
      w.aer = std::any_of(std::begin(kAerFiles), std::end(kAerFiles),
                          [&](const char* f) { return has(w.fd, f); });
      w.power_state = has(w.fd, "power_state");
    }
    for (std::size_t i = 0; w.fd >= 0 && i < w.held.size() && held < kMaxHeldFiles; ++i) {
      if (!w.holds(static_cast<Polled>(i))) continue;
      w.held[i] = ::openat(w.fd, kPolledFiles[i], O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
      if (w.held[i] >= 0) ++held;
    }
    impl_->watched.push_back(w);
  }
}

const std::vector<Target>& Reader::targets() const {
  return impl_->targets;
}

std::vector<Reading> Reader::read() {
  std::vector<Reading> out;
  out.reserve(impl_->watched.size());
  for (auto& w : impl_->watched) out.push_back(impl_->read_one(w, false));
  return out;
}

std::vector<Reading> Reader::read_counts() {
  std::vector<Reading> out;
  out.reserve(impl_->watched.size());
  for (auto& w : impl_->watched) out.push_back(impl_->read_one(w, true));
  return out;
}

Reading Reader::Impl::read_one(Watched& w, bool counts_only) const {
  Reading r;
  r.address = w.target.address.to_string();
  r.aer_monitored = w.aer;
  if (w.fd < 0) {
    r.unknown.push_back({"", "the function's sysfs directory cannot be opened"});
    return r;
  }
  Attr a;
  read_aer(w, r, a);
  // The power state matters only to what link and config are read for (a GPU and its port).
  if (counts_only || !(w.target.link_judged || w.target.gpu)) return r;
  if (!w.power_state) {
    r.power = Power::d0;  // no power_state file (a kernel before 4.20): judged as CONTRACT §13 says
  } else if (read_polled(w, power, a, 64); a.error != 0) {
    r.unknown.push_back({"power_state", std::strerror(a.error)});
  } else {
    r.power = parse_power_state(a.text());
    r.power_text = sysfs::sysfs_text(trim(a.text()));
    if (r.power == Power::unknown) r.unknown.push_back({"power_state", "\"" + r.power_text + "\""});
  }
  if (r.power != Power::d0) return r;  // never woken: no link, no config
  if (w.target.link_judged) read_link(w, r, a);
  if (w.target.gpu) read_config(w, r, a);
  return r;
}

void Reader::Impl::read_aer(Watched& w, Reading& r, Attr& a) const {
  if (!w.aer) return;
  static constexpr std::string_view kLabels[] = {"TOTAL_ERR_FATAL", "TOTAL_ERR_NONFATAL", "TOTAL_ERR_COR"};
  static constexpr std::optional<std::uint64_t> Counts::*kCounts[] = {&Counts::fatal, &Counts::nonfatal,
                                                                      &Counts::correctable};
  for (std::size_t i = 0; i < 3; ++i) {
    read_polled(w, static_cast<Polled>(aer_fatal + i), a);
    if (a.error != 0) {
      r.unknown.push_back({kAerFiles[i], std::strerror(a.error)});
      continue;
    }
    r.counts.*kCounts[i] = parse_aer_total(a.text(), kLabels[i]);
    if (!(r.counts.*kCounts[i]))
      r.unknown.push_back({kAerFiles[i], fmt::format("no readable {} line", kLabels[i])});
  }
}

// The width, against max_link_width (read once); the speed only when the link is narrower than it
// can be (for the reason's words): it is shown, never judged, and Reader::speed reads it on demand.
void Reader::Impl::read_link(Watched& w, Reading& r, Attr& a) const {
  if (read_polled(w, link_width, a, 64); a.error != 0) {
    r.unknown.push_back({"current_link_width", std::strerror(a.error)});
  } else {
    r.width = parse_link_width(a.text());
    if (!r.width)
      r.unknown.push_back({"current_link_width", "\"" + sysfs::sysfs_text(trim(a.text())) + "\""});
  }
  if (!w.max_width) {
    if (read_attr(w.fd, "max_link_width", a, 64); a.error == 0) {
      if (auto m = parse_link_width(a.text()); m && *m > 0) w.max_width = m;
    }
  }
  r.max_width = w.max_width;
  if (r.width && (!r.max_width || *r.width < *r.max_width)) {
    if (read_attr(w.fd, "current_link_speed", a, 64); a.error == 0)
      r.speed = sysfs::sysfs_text(trim(a.text()));
  }
}

void Reader::Impl::read_config(Watched& w, Reading& r, Attr& a) const {
  read_polled(w, config_head, a, 4);
  if (a.error != 0) {
    r.config = ConfigAnswer::failed;
    r.config_error = std::strerror(a.error);
    return;
  }
  r.config = parse_config_head(a.text());
  if (r.config == ConfigAnswer::failed) r.config_error = fmt::format("{} bytes", a.len);
}

std::optional<std::string> Reader::speed(const PciAddress& address) const {
  for (const auto& w : impl_->watched) {
    if (w.target.address != address || w.fd < 0 || !w.target.link_judged) continue;
    Attr a;
    if (read_attr(w.fd, "current_link_speed", a, 64); a.error == 0) return sysfs::sysfs_text(trim(a.text()));
  }
  return std::nullopt;
}

}  // namespace gpunode::discovery::health
