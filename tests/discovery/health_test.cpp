// Unit health's reader (CONTRACT §13): the parsers over text captured from real kernels, the
// functions a unit is judged on, and the Reader over small trees (what it reads, and what it
// never touches on a sleeping device).
#include "gpunode/discovery/health.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>

#include "gpunode/discovery/rules.hpp"
#include "sysfs_tree.hpp"

using namespace gpunode::discovery;
using namespace gpunode::discovery::health;
using gpunode::testing::Tree;

namespace {

// aer_dev_correctable of a root port on Linux 4.19 (Debian 10): the first label style, every
// named bit listed, an unnamed bit only when it counted something.
constexpr std::string_view kCorrectable419 =
    "Receiver Error 2\nBad TLP 0\nBad DLLP 0\nRELAY_NUM Rollover 0\ndev_cor_errs_bit[9] 1\n"
    "Replay Timer Timeout 0\nAdvisory Non-Fatal 0\nCorrected Internal Error 0\nHeader Log Overflow 0\n"
    "TOTAL_ERR_COR 3\n";
// aer_dev_fatal of an H100 on Linux 6.1 (Debian 12): the second label style.
constexpr std::string_view kFatal61 =
    "Undefined 0\nDLP 0\nSDES 1\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\nUnxCmplt 0\nRxOF 0\nMalfTLP 0\nECRC "
    "0\n"
    "UnsupReq 0\nACSViol 0\nUncorrIntErr 0\nBlockedTLP 0\nAtomicOpBlocked 0\nTLPBlockedErr 0\n"
    "PoisonTLPBlocked 0\nTOTAL_ERR_FATAL 1\n";
// aer_dev_nonfatal on Linux 4.19 with an unnamed bit.
constexpr std::string_view kNonfatal419 =
    "Undefined 0\nData Link Protocol 0\nSurprise Down Error 0\nPoisoned TLP 0\nFlow Control Protocol 0\n"
    "Completion Timeout 4\nCompleter Abort 0\nUnexpected Completion 0\nReceiver Overflow 0\nMalformed TLP 0\n"
    "ECRC 0\nUnsupported Request 0\nACS Violation 0\nUncorrectable Internal Error 0\nMC Blocked TLP 0\n"
    "AtomicOp Egress Blocked 0\ndev_nonfatal_errs_bit[26] 1\nTLP Prefix Blocked Error 0\nTOTAL_ERR_NONFATAL "
    "5\n";

void aer(Tree& t, const std::string& a, int fatal, int nonfatal, int correctable) {
  t.write(t.dev(a) / "aer_dev_fatal", fmt::format("Undefined 0\nSDES {0}\nTOTAL_ERR_FATAL {0}\n", fatal));
  t.write(t.dev(a) / "aer_dev_nonfatal",
          fmt::format("Undefined 0\nCmpltTO {0}\nTOTAL_ERR_NONFATAL {0}\n", nonfatal));
  t.write(t.dev(a) / "aer_dev_correctable", fmt::format("RxErr {0}\nTOTAL_ERR_COR {0}\n", correctable));
}

void link(Tree& t, const std::string& a, const std::string& power, const std::string& width) {
  t.write(t.dev(a) / "power_state", power + "\n");
  t.write(t.dev(a) / "current_link_width", width + "\n");
  t.write(t.dev(a) / "max_link_width", "16\n");
  t.write(t.dev(a) / "current_link_speed", "32.0 GT/s PCIe\n");
}

// A root port 0000:40:01.1 with a GPU 0000:41:00.0 and its audio function under it.
struct Host {
  Tree t;
  Host() {
    t.add("0000:40:01.1", "1022", "14ab", "060400", "pcieport", 30);
    t.nest("0000:41:00.0", "0000:40:01.1");
    t.nest("0000:41:00.1", "0000:40:01.1");
    t.add("0000:41:00.0", "10de", "2330", "030200", "vfio-pci", 37);
    t.add("0000:41:00.1", "10de", "22a3", "040300", "vfio-pci", 37);
    for (const char* a : {"0000:40:01.1", "0000:41:00.0", "0000:41:00.1"}) aer(t, a, 0, 0, 0);
    link(t, "0000:40:01.1", "D0", "16");
    link(t, "0000:41:00.0", "D0", "16");
    t.write(t.dev("0000:41:00.0") / "config", std::string("\xde\x10\x30\x23", 4) + std::string(60, '\0'));
  }
  void watch(Reader& r) {
    const auto units = build_units(t.read(), Policy{});
    REQUIRE(units.size() == 1);
    r.watch(targets_of(units.front(), [&](const PciAddress& a) { return r.parent_of(a); }));
  }
  std::vector<Reading> read(Reader& r) {
    watch(r);
    return r.read();
  }
};

}  // namespace

TEST_CASE("the AER files: only the TOTAL_ lines are read, in both label styles") {
  CHECK(parse_aer_total(kCorrectable419, "TOTAL_ERR_COR") == 3u);
  CHECK(parse_aer_total(kFatal61, "TOTAL_ERR_FATAL") == 1u);
  CHECK(parse_aer_total(kNonfatal419, "TOTAL_ERR_NONFATAL") == 5u);
  CHECK(parse_aer_total("TOTAL_ERR_COR 18446744073709551615\n", "TOTAL_ERR_COR") == 18446744073709551615u);
  // Not a count: missing, twice, garbage, past 64 bits, another line's name that begins the same.
  CHECK_FALSE(parse_aer_total(kCorrectable419, "TOTAL_ERR_FATAL"));
  CHECK_FALSE(parse_aer_total("TOTAL_ERR_COR 1\nTOTAL_ERR_COR 2\n", "TOTAL_ERR_COR"));
  CHECK_FALSE(parse_aer_total("TOTAL_ERR_COR -1\n", "TOTAL_ERR_COR"));
  CHECK_FALSE(parse_aer_total("TOTAL_ERR_COR 18446744073709551616\n", "TOTAL_ERR_COR"));
  CHECK_FALSE(parse_aer_total("TOTAL_ERR_CORX 4\n", "TOTAL_ERR_COR"));
  CHECK_FALSE(parse_aer_total(std::string("TOTAL_ERR_COR \x01\xff", 16), "TOTAL_ERR_COR"));
  CHECK_FALSE(parse_aer_total("", "TOTAL_ERR_COR"));
}

TEST_CASE("link width, power state and the head of config space") {
  CHECK(parse_link_width("16\n") == 16);
  CHECK(parse_link_width("0\n") == 0);    // a link that is down
  CHECK_FALSE(parse_link_width("63\n"));  // a sleeping or vanished device reads all ones
  CHECK_FALSE(parse_link_width("Unknown\n"));
  CHECK_FALSE(parse_link_width("-1"));
  CHECK(parse_power_state("D0\n") == Power::d0);
  CHECK(parse_power_state("D3hot\n") == Power::asleep);
  CHECK(parse_power_state("D3cold") == Power::asleep);
  CHECK(parse_power_state("unknown\n") == Power::unknown);
  CHECK(parse_power_state("error\n") == Power::unknown);
  CHECK(parse_config_head(std::string("\xde\x10\x30\x23", 4)) == ConfigAnswer::answers);
  CHECK(parse_config_head(std::string(4, '\xff')) == ConfigAnswer::all_ones);
  CHECK(parse_config_head("\xde\x10") == ConfigAnswer::failed);
}

TEST_CASE("a unit is judged on its members and each member's upstream port") {
  Host h;
  Reader r(h.t.root());
  const auto readings = h.read(r);
  const auto& targets = r.targets();
  REQUIRE(targets.size() == 3);
  CHECK(targets[0].address.to_string() == "0000:41:00.0");
  CHECK((targets[0].gpu && targets[0].link_judged));
  CHECK(targets[1].address.to_string() == "0000:41:00.1");
  CHECK_FALSE((targets[1].gpu || targets[1].link_judged));  // the audio function: counts only
  CHECK(targets[2].address.to_string() == "0000:40:01.1");
  CHECK((!targets[2].gpu && targets[2].link_judged));  // the GPU's port: its link too
  REQUIRE(readings.size() == 3);
  CHECK(readings[0].power == Power::d0);
  CHECK(readings[0].width == 16);
  CHECK(readings[0].max_width == 16);
  CHECK(readings[0].speed.empty());                        // at its widest: the speed is not read by a poll
  CHECK(r.speed(targets[0].address) == "32.0 GT/s PCIe");  // ... but on demand
  CHECK(readings[0].config == ConfigAnswer::answers);
  CHECK(readings[0].counts == Counts{0, 0, 0});
  CHECK(readings[0].unknown.empty());
  CHECK(readings[1].power == Power::unknown);  // judged on neither link nor config: not read
  CHECK(readings[1].config == ConfigAnswer::not_read);
  CHECK(readings[2].power == Power::d0);
  link(h.t, "0000:41:00.0", "D0", "8");  // narrower than it can be: the speed is read for the reason's words
  CHECK(r.read()[0].speed == "32.0 GT/s PCIe");
}

TEST_CASE("no power_state file (a kernel before 4.20): judged as D0") {
  Host h;
  std::filesystem::remove(h.t.dev("0000:41:00.0") / "power_state");
  Reader r(h.t.root());
  const auto readings = h.read(r);
  CHECK(readings[0].power == Power::d0);
  CHECK(readings[0].width == 16);
  CHECK(readings[0].config == ConfigAnswer::answers);
}

TEST_CASE("a sleeping GPU is never woken: no link, no config read") {
  Host h;
  link(h.t, "0000:41:00.0", "D3cold", "63");
  // config as a FIFO: a read of it would say "failed"; not read at all, it says nothing.
  const auto config = h.t.dev("0000:41:00.0") / "config";
  std::filesystem::remove(config);
  REQUIRE(::mkfifo(config.c_str(), 0600) == 0);
  Reader r(h.t.root());
  const auto readings = h.read(r);
  CHECK(readings[0].power == Power::asleep);
  CHECK(readings[0].power_text == "D3cold");
  CHECK_FALSE(readings[0].width);
  CHECK(readings[0].config == ConfigAnswer::not_read);
  CHECK(readings[0].counts == Counts{0, 0, 0});  // the counters are the kernel's memory: still read
}

TEST_CASE("a file that cannot be read is unknown this poll, said once per file") {
  Host h;
  h.t.write(h.t.dev("0000:41:00.0") / "aer_dev_nonfatal", "garbage\n");
  std::filesystem::remove(h.t.dev("0000:41:00.0") / "current_link_width");
  std::filesystem::create_directory(h.t.dev("0000:41:00.0") / "current_link_width");  // EISDIR on read
  h.t.write(h.t.dev("0000:41:00.0") / "config", "\xde");                              // short
  Reader r(h.t.root());
  const auto readings = h.read(r);
  CHECK(readings[0].counts == Counts{0, std::nullopt, 0});
  CHECK_FALSE(readings[0].width);
  CHECK(readings[0].config == ConfigAnswer::failed);
  std::vector<std::string> files;
  for (const auto& f : readings[0].unknown) files.push_back(f.attribute);
  CHECK(files == std::vector<std::string>{"aer_dev_nonfatal", "current_link_width"});
}

TEST_CASE("no AER files: not monitored, and nothing else is made of it") {
  Host h;
  for (const char* f : {"aer_dev_fatal", "aer_dev_nonfatal", "aer_dev_correctable"})
    std::filesystem::remove(h.t.dev("0000:41:00.0") / f);
  Reader r(h.t.root());
  const auto readings = h.read(r);
  CHECK_FALSE(readings[0].aer_monitored);
  CHECK(readings[0].counts == Counts{});
  CHECK(readings[0].unknown.empty());
  CHECK(readings[1].aer_monitored);
}

TEST_CASE("a function gone since it was watched is unknown; watched again, it is read afresh") {
  Host h;
  Reader r(h.t.root());
  (void)h.read(r);
  aer(h.t, "0000:41:00.0", 1, 0, 0);  // in place, as sysfs changes: the held AER files see it
  CHECK(r.read()[0].counts == Counts{1, 0, 0});
  // Removed, then the rescan that follows watches the unit's functions again. (What a poll reads
  // before that rescan: sysfs fails the held files with ENODEV, the next case; tmpfs keeps removed
  // files readable, so it is not checked here.)
  std::filesystem::remove_all(h.t.dev("0000:41:00.0"));
  r.watch(r.targets());
  auto readings = r.read();
  CHECK(readings[0].power == Power::unknown);
  CHECK_FALSE(readings[0].width);
  CHECK(readings[0].config == ConfigAnswer::not_read);
  CHECK(readings[0].counts == Counts{});
  CHECK_FALSE(readings[0].unknown.empty());
  // Back (re-enumerated: its counters start at 0); a scan watches the unit's functions again.
  std::filesystem::remove(h.t.root() / "sys/bus/pci/devices/0000:41:00.0");
  h.t.add("0000:41:00.0", "10de", "2330", "030200", "vfio-pci", -1);
  aer(h.t, "0000:41:00.0", 0, 0, 0);
  link(h.t, "0000:41:00.0", "D0", "16");
  r.watch(r.targets());
  CHECK(r.read()[0].counts == Counts{0, 0, 0});
  CHECK(r.read()[0].power == Power::d0);
}

TEST_CASE("a held file whose read fails is unknown that poll and opened again for the next") {
  // As sysfs fails a removed function's held files (ENODEV), and the function may come back at the
  // same address before a rescan: here power_state is a directory when watched (its held
  // descriptor's reads fail, EISDIR), then a file again.
  Host h;
  const auto power_state = h.t.dev("0000:41:00.0") / "power_state";
  std::filesystem::remove(power_state);
  std::filesystem::create_directory(power_state);
  Reader r(h.t.root());
  h.watch(r);
  std::filesystem::remove(power_state);
  h.t.write(power_state, "D0\n");
  auto readings = r.read();
  CHECK(readings[0].power == Power::unknown);  // not judged on link or config
  CHECK_FALSE(readings[0].width);
  CHECK(readings[0].config == ConfigAnswer::not_read);
  REQUIRE(readings[0].unknown.size() == 1);
  CHECK(readings[0].unknown[0].attribute == "power_state");
  readings = r.read();
  CHECK(readings[0].power == Power::d0);
  CHECK(readings[0].width == 16);
  CHECK(readings[0].config == ConfigAnswer::answers);
  CHECK(readings[0].unknown.empty());
}

TEST_CASE("a counts-only look reads no power state, link or config") {
  Host h;
  Reader r(h.t.root());
  (void)h.read(r);
  const auto readings = r.read_counts();
  CHECK(readings[0].power == Power::unknown);
  CHECK_FALSE(readings[0].width);
  CHECK(readings[0].config == ConfigAnswer::not_read);
  CHECK(readings[0].counts == Counts{0, 0, 0});
}
