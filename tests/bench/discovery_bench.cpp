// discovery_bench: how long discovery of one host tree takes, beside lspci on the same tree.
//
//   discovery_bench HOST_ROOT AGENT [ITERATIONS]
//
// Prints, for HOST_ROOT (a fixture tree with sys/ and proc/):
//   in-process  SysfsReader::read + build_units + JSON, what the daemon pays on every rescan;
//   agent       `AGENT discover --host-root HOST_ROOT --json` as a whole process;
//   lspci       `lspci -nnk -D -A linux-sysfs -O sysfs.path=HOST_ROOT/sys/bus/pci`, the reference;
// each as min / p50 / p90 over ITERATIONS runs after one warm-up, and the ratio lspci / agent.
// Not a test: it asserts nothing and is never run by ctest.
#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json/serialize.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "gpunode/discovery/json.hpp"
#include "gpunode/discovery/pci_ids.hpp"
#include "gpunode/discovery/rules.hpp"
#include "gpunode/discovery/sysfs_reader.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
  double min_ms, p50_ms, p90_ms;
};

Stats measure(int iterations, const std::function<void()>& run) {
  run();  // warm-up: page cache, dentries, pci.ids
  std::vector<double> ms;
  for (int i = 0; i < iterations; ++i) {
    auto t0 = Clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms[static_cast<std::size_t>(q * static_cast<double>(ms.size() - 1))]; };
  return {ms.front(), at(0.5), at(0.9)};
}

// Runs argv with stdout/stderr to /dev/null; exits the bench if the command fails.
void run_quiet(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  if (rc != 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fmt::print(stderr, "discovery_bench: `{}` failed\n", args[0]);
    std::exit(1);
  }
}

void print(const char* what, const Stats& s) {
  fmt::print("{:<12} min {:8.3f} ms   p50 {:8.3f} ms   p90 {:8.3f} ms\n", what, s.min_ms, s.p50_ms, s.p90_ms);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    fmt::print(stderr, "usage: discovery_bench HOST_ROOT AGENT [ITERATIONS]\n");
    return 2;
  }
  const std::string root = argv[1];
  const std::string agent = argv[2];
  const int iterations = argc > 3 ? std::max(1, std::atoi(argv[3])) : 50;
  namespace d = gpunode::discovery;

  d::Policy policy;
  auto names = d::PciIds::load(GPUNODE_PCI_IDS, policy.gpu_vendors);
  d::SysfsReader reader(root, policy, names ? &*names : nullptr);
  d::HostSnapshot probe = reader.read();
  auto units = d::build_units(probe, policy);
  int gpus = 0;
  for (const auto& u : units) gpus += u.gpu_count();
  int functions = 0;
  if (auto* dir = ::opendir((root + "/sys/bus/pci/devices").c_str())) {
    while (auto* e = ::readdir(dir)) functions += e->d_name[0] != '.';
    ::closedir(dir);
  }
  fmt::print("host {}: {} PCI functions, {} units, {} GPUs, {} iterations each\n", root, functions,
             units.size(), gpus, iterations);

  std::size_t bytes = 0;
  Stats in_process = measure(iterations, [&] {
    auto snapshot = reader.read();
    auto u = d::build_units(snapshot, policy);
    bytes = boost::json::serialize(d::units_body("bench", u)).size();
  });
  Stats whole = measure(iterations, [&] { run_quiet({agent, "discover", "--host-root", root, "--json"}); });
  Stats lspci = measure(iterations, [&] {
    run_quiet({"lspci", "-nnk", "-D", "-A", "linux-sysfs", "-O", "sysfs.path=" + root + "/sys/bus/pci"});
  });
  print("in-process", in_process);
  print("agent", whole);
  print("lspci", lspci);
  fmt::print("JSON body {} bytes\n", bytes);
  fmt::print("ratio lspci/agent (p50): {:.1f}x   lspci/in-process (p50): {:.1f}x\n",
             lspci.p50_ms / whole.p50_ms, lspci.p50_ms / in_process.p50_ms);
  return 0;
}
