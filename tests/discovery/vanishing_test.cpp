// Devices vanishing from /sys while it is scanned (issue 15, faults at every edge): a thread removes
// a GPU and its audio function from the tree (bus link, IOMMU group link, device directory, as a
// hot-unplug does) and adds them back, file by file, again and again, while scans run. Every scan
// must end (no crash, no exception, no exit from libpci) with an answer that is the host with the
// GPU, the host without it, an instant of the hotplug (some functions, some files not written yet,
// nothing read wrong), or the GPU's unit carrying reasons for what could not be read; the other
// GPU's unit is never touched.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <string>
#include <thread>

#include "gpunode/discovery/json.hpp"
#include "gpunode/discovery/rules.hpp"
#include "gpunode/discovery/sysfs_reader.hpp"
#include "sysfs_tree.hpp"

namespace fs = std::filesystem;
using namespace gpunode::discovery;
using gpunode::testing::Tree;

namespace {

void add_gpu(Tree& t, const std::string& slot, int group) {
  t.add(slot + ".0", "10de", "2330", "030200", "vfio-pci", group);
  t.add(slot + ".1", "10de", "22a3", "040300", "vfio-pci", group);
}

// As the kernel takes a device away: out of the bus, out of its group, then its directory.
void remove_gpu(Tree& t, const std::string& slot, int group) {
  std::error_code ec;
  for (const char* fn : {".1", ".0"}) {
    const std::string a = slot + fn;
    fs::remove(t.root() / "sys/bus/pci/devices" / a, ec);
    fs::remove(t.root() / "sys/kernel/iommu_groups" / std::to_string(group) / "devices" / a, ec);
    fs::remove_all(t.dev(a), ec);
  }
}

std::map<std::string, std::string> by_id(const std::vector<Unit>& units) {
  std::map<std::string, std::string> out;
  for (const auto& u : units) out.emplace(u.id, boost::json::serialize(unit_to_json(u)));
  return out;
}

// A unit without reasons read mid-hotplug: each device is one of the whole unit's, with the same
// identity and role; a driver or NUMA node may be missing (not written yet), never another one.
bool an_instant_of(const std::string& got, const std::string& whole) {
  const auto g = boost::json::parse(got).as_object(), w = boost::json::parse(whole).as_object();
  for (const auto& d : g.at("devices").as_array()) {
    const auto& dev = d.as_object();
    const auto& all = w.at("devices").as_array();
    auto same = std::find_if(all.begin(), all.end(),
                             [&](const auto& x) { return x.at("pciAddress") == dev.at("pciAddress"); });
    if (same == all.end()) return false;
    for (const char* k : {"vendorId", "deviceId", "classCode", "role"}) {
      if (dev.at(k) != same->at(k)) return false;
    }
    if (!dev.at("driver").is_null() && dev.at("driver") != same->at("driver")) return false;
  }
  return g.at("id") == w.at("id") && g.at("class") == w.at("class");
}

}  // namespace

TEST_CASE(
    "devices vanishing and coming back mid-scan: every scan ends with a consistent answer or says what it "
    "could not read") {
  Tree t;
  add_gpu(t, "0000:41:00", 3);
  add_gpu(t, "0000:42:00", 4);
  SysfsReader reader(t.root(), {}, nullptr);
  const auto full = by_id(build_units(reader.read(), {}));
  REQUIRE(full.size() == 2);
  const std::string kept = "u-0000-41-00-0", going = "u-0000-42-00-0";
  remove_gpu(t, "0000:42:00", 4);
  const auto without = by_id(build_units(reader.read(), {}));
  REQUIRE(without.size() == 1);
  REQUIRE(without.at(kept) == full.at(kept));
  add_gpu(t, "0000:42:00", 4);
  std::atomic<bool> stop = false;
  std::atomic<int> cycles = 0;
  std::thread hotplug([&] {
    while (!stop.load()) {
      remove_gpu(t, "0000:42:00", 4);
      add_gpu(t, "0000:42:00", 4);
      ++cycles;
    }
  });
  int scans = 0, whole = 0, gone = 0, instant = 0, partial = 0, warned = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  while (std::chrono::steady_clock::now() < until || scans < 50) {
    HostSnapshot s;
    std::vector<Unit> units;
    try {
      s = reader.read();
      units = build_units(s, {});
    } catch (const std::exception& e) {
      stop = true;
      hotplug.join();
      FAIL("scan " << scans << " threw: " << e.what());
    }
    ++scans;
    const auto got = by_id(units);
    CAPTURE(scans);
    REQUIRE(got.contains(kept));
    CHECK(got.at(kept) == full.at(kept));  // the other GPU is never touched
    CHECK(got.size() <= 2);
    if (!got.contains(going)) {
      ++gone;
    } else if (got.at(going) == full.at(going)) {
      ++whole;
    } else {
      const auto& u = *std::find_if(units.begin(), units.end(), [&](const Unit& x) { return x.id == going; });
      if (!u.reasons.empty()) {
        ++partial;  // read while half there: the unit says it is not as it should be
      } else {
        // An instant of the hotplug: some of its functions, some files not written yet (no
        // driver, no NUMA node), but nothing read wrong.
        ++instant;
        CHECK_MESSAGE(an_instant_of(got.at(going), full.at(going)), got.at(going));
      }
    }
    if (!s.warnings.empty()) ++warned;
  }
  stop = true;
  hotplug.join();
  MESSAGE(scans << " scans during " << cycles.load() << " unplug/replug cycles: " << whole << " whole, "
                << gone << " without the GPU, " << instant
                << " at an instant of the hotplug (a function or a file not there yet), " << partial
                << " with a function half read (reasons on its unit), " << warned << " with warnings");
  CHECK(cycles.load() >= 3);  // the host changed under the scans, again and again
  // (Every scan is judged above, in the branch its answer falls in.)
  // Settled: the same answer as before it all.
  CHECK(by_id(build_units(reader.read(), {})) == full);
}
