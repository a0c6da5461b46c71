// gpunode/discovery/health.hpp: what the kernel shows about a PCI function's health (CONTRACT §13),
// read from sysfs whatever driver holds the device. Files in, facts out: the parsers are pure
// functions over the files' text (tested with text captured from real kernels); the Reader reads
// exactly the listed files of the functions it is given, and never a file that could wake a
// device: link and config only when `power_state` says D0. Judging what the facts mean is
// gpunode::health's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/discovery/model.hpp"

namespace gpunode::discovery::health {

// ---- parsers ---------------------------------------------------------------------------------

// The count on the line `label` (TOTAL_ERR_FATAL, TOTAL_ERR_NONFATAL, TOTAL_ERR_COR) of an
// aer_dev_* file; the other lines are ignored (their names differ between kernels: "Receiver
// Error" or "RxErr", unnamed bits as "dev_cor_errs_bit[N]"). Nothing when the line is missing,
// repeated or not a whole decimal number.
std::optional<std::uint64_t> parse_aer_total(std::string_view text, std::string_view label);

// current_link_width / max_link_width: 0 (a link that is down) to 32. Anything else (63, a
// sleeping or vanished device's all-ones read; "Unknown"; garbage) is nothing.
std::optional<int> parse_link_width(std::string_view text);

enum class Power { d0, asleep, unknown };
// power_state: "D0" is D0; D1, D2, D3hot, D3cold are asleep; "unknown", "error" or garbage unknown.
Power parse_power_state(std::string_view text);

// The first four bytes of `config` (vendor and device id): a device that no longer answers reads
// all ones. Fewer than four bytes is no answer either.
enum class ConfigAnswer { not_read, answers, all_ones, failed };
ConfigAnswer parse_config_head(std::string_view bytes);

// ---- what one poll read of one function --------------------------------------------------------

struct Counts {
  std::optional<std::uint64_t> fatal, nonfatal, correctable;  // nothing: unknown this poll
  bool operator==(const Counts&) const = default;
};

struct Reading {
  std::string address;        // "0000:41:00.0"
  bool aer_monitored = true;  // it has aer_dev_* files (else: firmware-first AER or an old kernel)
  Counts counts;
  Power power = Power::unknown;
  std::string power_text;  // as the file says, printable; "" when it has no power_state
  // Read in D0 only (a gpu and its upstream port); nothing when not read or not readable.
  std::optional<int> width, max_width;
  std::string speed;                             // current_link_speed as shown (printable), never judged
  ConfigAnswer config = ConfigAnswer::not_read;  // a gpu in D0 only
  std::string config_error;                      // why the read failed
  std::vector<Fault> unknown;                    // files that could not be read this poll, and why
};

// ---- the functions a unit is judged on -----------------------------------------------------------

struct Target {
  PciAddress address;
  bool gpu = false;          // judged on config
  bool link_judged = false;  // a gpu or a gpu's upstream port: judged on current_link_width
};

// Each member of `unit`, then each member's upstream port (its parent bridge, from `parent_of`)
// that is not a member itself; by address within each part, no address twice.
std::vector<Target> targets_of(const Unit& unit,
                               const std::function<std::optional<PciAddress>(const PciAddress&)>& parent_of);

// ---- the adapter -------------------------------------------------------------------------------

class Reader {
 public:
  // Functions under <host_root>/sys/bus/pci/devices.
  explicit Reader(std::filesystem::path host_root);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  // The parent bridge of a function, from its sysfs path (one readlink); nothing for a function
  // on a root bus or one that is gone.
  [[nodiscard]] std::optional<PciAddress> parent_of(const PciAddress& address) const;

  // The functions read from now on: each one's directory is opened once here (and which of the
  // files it has), so a poll costs the reads alone.
  void watch(std::vector<Target> targets);
  [[nodiscard]] const std::vector<Target>& targets() const;

  // One poll: a Reading per target, in order. Never throws for anything the host tree holds.
  std::vector<Reading> read();
  // current_link_speed of a watched GPU or GPU's port, read now, for people (a poll reads it only
  // for a link narrower than it can be). The caller knows the function was in D0 at the last poll.
  [[nodiscard]] std::optional<std::string> speed(const PciAddress& address) const;
  // The AER counts alone (no power_state, link or config: power reads unknown), for a look that
  // keeps nothing and so could judge nothing else: `discover`.
  std::vector<Reading> read_counts();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpunode::discovery::health
