// health_bench: the cost of one unit health poll (CONTRACT §13), what the agent pays on its core
// thread every health.interval.
//
//   health_bench HOST_ROOT [ITERATIONS]
//
// Reads HOST_ROOT's units as discovery does, watches the functions each is judged on (its members
// and their upstream ports), then times a poll: every target read (discovery::health::Reader) and
// judged (gpunode::health::judge_device, judge_unit), its CPU time min / p50 / p90 over ITERATIONS after one
// warm-up. Prints them and a SUMMARY line: the poll's p50 and the CPU it costs per
// second at the default interval (30 s), against CONTRACT §2's idle goal of 0.05 ms/s.
// Not a test: it asserts nothing and is never run by ctest.
#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "gpunode/discovery/health.hpp"
#include "gpunode/discovery/rules.hpp"
#include "gpunode/discovery/sysfs_reader.hpp"
#include "gpunode/health/judge.hpp"

namespace dh = gpunode::discovery::health;
namespace gh = gpunode::health;

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: {} HOST_ROOT [ITERATIONS]\n", argv[0]);
    return 2;
  }
  const int iterations = argc > 2 ? std::max(1, std::atoi(argv[2])) : 200;
  gpunode::discovery::Policy policy;
  gpunode::discovery::SysfsReader sysfs(argv[1], policy, nullptr);
  const auto units = gpunode::discovery::build_units(sysfs.read(), policy);
  dh::Reader reader(argv[1]);
  std::vector<dh::Target> targets;
  std::map<std::string, std::vector<std::size_t>> of_unit;
  int gpus = 0;
  for (const auto& u : units) {
    gpus += u.gpu_count();
    for (const auto& t : dh::targets_of(u, [&](const auto& a) { return reader.parent_of(a); })) {
      of_unit[u.id].push_back(targets.size());
      targets.push_back(t);
    }
  }
  reader.watch(targets);
  std::map<std::string, gh::DeviceState> states;
  std::map<std::string, gh::DeviceMemo> memos;
  std::map<std::string, gh::Verdict> verdicts;
  auto now = std::chrono::time_point_cast<std::chrono::seconds>(std::chrono::system_clock::now());
  const auto poll = [&] {
    const auto readings = reader.read();
    std::map<std::string, std::vector<gh::Finding>> found;
    for (std::size_t i = 0; i < readings.size(); ++i) {
      const auto& a = readings[i].address;
      auto v = gh::judge_device(states[a], memos[a], readings[i], targets[i], now, gh::Settings{});
      states[a] = std::move(v.state);
      memos[a] = std::move(v.memo);
      found[a] = std::move(v.findings);
    }
    for (const auto& [id, mine] : of_unit) {
      std::vector<std::pair<std::string, std::vector<gh::Finding>>> f;
      for (auto i : mine) f.emplace_back(readings[i].address, found[readings[i].address]);
      verdicts[id] = gh::judge_unit(verdicts[id], f, now);
    }
    now += std::chrono::seconds(30);
  };
  poll();  // warm-up: dentries, the first sight's baselines
  // CPU time, not wall time: what an idle agent pays is CPU, and a busy machine's scheduler would
  // add its waits to a wall-clock figure.
  const auto cpu_us = [] {
    timespec t{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
  };
  std::vector<double> us;
  for (int i = 0; i < iterations; ++i) {
    const double t0 = cpu_us();
    poll();
    us.push_back(cpu_us() - t0);
  }
  std::sort(us.begin(), us.end());
  const auto at = [&](double q) {
    return us[static_cast<std::size_t>(q * static_cast<double>(us.size() - 1))];
  };
  fmt::print(
      "health poll of {} units, {} GPUs, {} functions, CPU time: min {:.0f} µs, p50 {:.0f} µs, p90 {:.0f} "
      "µs\n",
      units.size(), gpus, targets.size(), us.front(), at(0.5), at(0.9));
  const double per_second = at(0.5) / 1000.0 / 30.0;
  fmt::print(
      "SUMMARY {{\"figure\": \"one health poll, {} GPUs ({} functions)\", \"gpunode\": \"{:.0f} µs p50 = "
      "{:.4f} ms/s at "
      "health.interval 30 s\", \"anchor\": \"CONTRACT §2 idle goal: 0.05 ms/s in all\", \"ratio\": {:.3f}, "
      "\"target\": "
      "\"≤ 0.05 ms/s\", \"met\": {}}}\n",
      gpus, targets.size(), at(0.5), per_second, per_second / 0.05, per_second <= 0.05 ? "true" : "false");
  return 0;
}
