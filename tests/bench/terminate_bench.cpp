// terminate_bench: how long the agent takes to terminate 64 spot VMs through libvirt, beside virsh
// doing the same over the same node.
//
//   terminate_bench [--iterations N] [--domains N] [--virsh PATH] [--per-process] [--steps]
//
// Writes a libvirt test-driver node file (test:///DIR/spot_node.xml, in /dev/shm where there is
// one) with DOMAINS (64) running spot domains, each with its own GPU (<hostdev type='pci'>, bus
// 0x10 + i) and the §5 workload metadata (org-b, tier spot). The test driver runs inside the
// client's process and gives every connection a fresh in-memory copy of the file, so each
// iteration starts from 64 running domains. Then, each ITERATIONS (20) times after one warm-up:
//
//   agent open+list   make_libvirt(URI) and its first list(): connect (parse of the node file) + list;
//   agent list        a second list() on that connection;
//   agent terminate   terminate_spot_all() of every listed domain, grace 0 (per VM: the termination
//                     record into the live and persistent definitions, a state check, destroy, a
//                     state check), all 64 outcomes checked terminated;
//   agent list after  a list() afterwards, checked to show every domain inactive with its record;
//   virsh connect     `virsh -c URI uri`: process start + connect, what every virsh figure below includes;
//   virsh destroy     ONE virsh process running `destroy spot-1; ...; destroy spot-64`;
//   virsh meta+destroy  the same with `metadata spot-N --uri urn:gpunode:termination:1 --key gpunodet
//                     --set '<termination .../>' --live --config` before each destroy (what the agent
//                     does per VM: the fair reference);
//   commands only     for both, the sum of virsh's own per-command times (`virsh -t`), which leaves
//                     out its process start and connect;
//   --per-process     64 `virsh -c URI destroy spot-N` processes one after the other (each has its own
//                     copy of the node: this measures process start + connect, 64 times);
//   --steps           the agent's calls one kind at a time on a fresh connection: record_termination
//                     x64, state x64, destroy x64, state x64 (where terminate's time goes).
//
// Each iteration runs all of them in turn, so that load on the machine falls on every figure alike.
// Prints p50 / min / max in ms and the ratios agent / virsh (p50), against virsh's whole process and
// its commands only. Every virsh run's output is checked (64 "destroyed", 64 "Metadata modified"),
// and one run's end state as the agent's is. Not a test: it is never run by ctest.
#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "gpunode/vmctl/vmctl.hpp"

extern char** environ;

namespace {

namespace vm = gpunode::vmctl;
using Clock = std::chrono::steady_clock;

struct Stats {
  double p50_ms = 0, min_ms = 0, max_ms = 0;
};

Stats stats(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return {ms[(ms.size() - 1) / 2], ms.front(), ms.back()};
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::string bench_dir;  // the temporary dir holding the node file, removed on every exit

void remove_bench_dir() {
  std::error_code ec;
  if (!bench_dir.empty()) std::filesystem::remove_all(bench_dir, ec);
}

[[noreturn]] void die(const std::string& what) {
  fmt::print(stderr, "terminate_bench: {}\n", what);
  remove_bench_dir();
  std::exit(1);
}

std::string domain_name(int i) {
  return fmt::format("spot-{}", i + 1);
}
int index_of(const std::string& name) {
  return std::atoi(name.c_str() + 5) - 1;
}  // "spot-N" -> N - 1
std::string domain_uuid(int i) {
  return fmt::format("f0000000-0000-4000-8000-{:012x}", i + 1);
}

std::string node_xml(int domains) {
  std::string out =
      "<!-- terminate_bench: a libvirt test-driver node, every domain a running spot VM with one GPU -->\n"
      "<node>\n";
  for (int i = 0; i < domains; ++i) {
    out += fmt::format(
        "  <domain type='test'>\n"
        "    <name>{}</name>\n"
        "    <uuid>{}</uuid>\n"
        "    <metadata><gw:workload xmlns:gw=\"urn:gpunode:workload:1\" vm-id=\"vm-{}\" org=\"org-b\" "
        "tier=\"spot\"/></metadata>\n"
        "    <memory unit='KiB'>1048576</memory><vcpu>2</vcpu><os><type arch='x86_64'>hvm</type></os>\n"
        "    <devices>\n"
        "      <hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' "
        "bus='0x{:02x}' "
        "slot='0x00' function='0x0'/></source></hostdev>\n"
        "    </devices>\n"
        "  </domain>\n",
        domain_name(i), domain_uuid(i), i + 1, 0x10 + i);
  }
  out += "</node>\n";
  return out;
}

vm::TerminationRecord record_for(int i) {
  return {"capacity-reclaim", "2027-01-31T00:00:00Z", "org-a", fmt::format("aud_{}", i + 1)};
}

// Runs argv with stdout and stderr into `capture` (truncated first); returns the exit status and
// the wall time including process start; status -1 when it cannot start.
struct Spawned {
  int status = -1;
  double ms = 0;
};
Spawned spawn(const std::vector<std::string>& args, const std::string& capture) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, capture.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  auto t0 = Clock::now();
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return {-1, 0};
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) die("waitpid failed");
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), since(t0)};
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// The sum of virsh's own per-command timings (`virsh -t` prints "(Time: X ms)" after each command:
// the command's handler, from its domain lookup to its message, without process start or connect).
double timed_sum(const std::string& out) {
  double sum = 0;
  const std::string tag = "(Time: ";
  for (auto at = out.find(tag); at != std::string::npos; at = out.find(tag, at + tag.size()))
    sum += std::strtod(out.c_str() + at + tag.size(), nullptr);
  return sum;
}

// One virsh process on URI running `script` (with -t); checks its output says each of `expect`
// as often as wanted. Returns the wall time of the process and the sum of its command timings.
struct VirshRun {
  double wall_ms = 0, commands_ms = 0;
};
VirshRun virsh_once(const std::string& virsh, const std::string& uri, const std::string& script,
                    const std::string& capture, const std::vector<std::pair<std::string, int>>& expect) {
  auto r = spawn({virsh, "-t", "-c", uri, script}, capture);
  const std::string out = slurp(capture);
  if (r.status != 0) die(fmt::format("`{}` exited {}:\n{}", virsh, r.status, out));
  for (const auto& [what, want] : expect) {
    if (int got = count(out, what); got != want)
      die(fmt::format("virsh said \"{}\" {} times, not {}:\n{}", what, got, want, out));
  }
  return {r.ms, timed_sum(out)};
}

std::vector<vm::Domain> must_list(vm::Hypervisor& hv) {
  auto domains = hv.list();
  if (!domains) die("list: " + domains.error().detail);
  return std::move(*domains);
}

// After terminate: every domain inactive and carrying its record.
void check_after(vm::Hypervisor& hv, int domains) {
  auto after = must_list(hv);
  if (static_cast<int>(after.size()) != domains)
    die(fmt::format("list afterwards gave {} domains", after.size()));
  for (const auto& d : after) {
    if (d.active()) die(d.name + " is still " + d.state);
    if (!d.termination || *d.termination != record_for(index_of(d.name)))
      die(d.name + " lacks its termination record");
  }
}

void print(const std::string& what, const Stats& s) {
  fmt::print("{:<42} p50 {:9.3f} ms   min {:9.3f} ms   max {:9.3f} ms\n", what, s.p50_ms, s.min_ms, s.max_ms);
}

void usage() {
  fmt::print(
      stderr,
      "usage: terminate_bench [--iterations N] [--domains N] [--virsh PATH] [--per-process] [--steps]\n");
  std::exit(2);
}

struct Options {
  int iterations = 20;
  int domains = 64;
  std::string virsh = "virsh";
  bool per_process = false;
  bool steps = false;
};

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "--iterations")
      o.iterations = std::max(1, std::atoi(value().c_str()));
    else if (a == "--domains")
      o.domains = std::clamp(std::atoi(value().c_str()), 1, 200);
    else if (a == "--virsh")
      o.virsh = value();
    else if (a == "--per-process")
      o.per_process = true;
    else if (a == "--steps")
      o.steps = true;
    else
      usage();
  }
  return o;
}

// The node file in its temporary dir (bench_dir, removed on every exit), its URI, and the file
// every virsh run's output goes to.
struct Node {
  std::string uri;
  std::string capture;
};

Node make_node(int domains) {
  namespace fs = std::filesystem;
  std::string tmpl =
      (fs::is_directory("/dev/shm") && ::access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                                                                       : fs::temp_directory_path().string()) +
      "/gpunode-terminate-bench.XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) die("mkdtemp failed");
  const fs::path dir = tmpl;
  bench_dir = tmpl;
  std::atexit(remove_bench_dir);
  const std::string xml_path = (dir / "spot_node.xml").string();
  {
    std::ofstream out(xml_path);
    out << node_xml(domains);
    if (!out) die("cannot write " + xml_path);
  }
  return {"test://" + xml_path, (dir / "virsh.out").string()};
}

// ---- the agent ----
struct AgentTimes {
  std::vector<double> open_list_ms, list_ms, terminate_ms, after_ms;
};

void agent_round(const Node& node, int domains, const vm::Sleeper& sleeper, AgentTimes& times, bool keep) {
  auto t0 = Clock::now();
  auto hv = vm::make_libvirt(node.uri);
  auto listed = must_list(*hv);
  const double open_list = since(t0);
  t0 = Clock::now();
  listed = must_list(*hv);
  const double list = since(t0);
  if (static_cast<int>(listed.size()) != domains) die(fmt::format("list gave {} domains", listed.size()));
  std::vector<vm::TerminationJob> jobs;
  jobs.reserve(listed.size());
  for (const auto& d : listed) {
    if (!d.active() || !d.label || d.label->tier != vm::Tier::spot || d.pci_addresses.size() != 1)
      die(d.name + " is not a running spot domain with one GPU");
    jobs.push_back(vm::TerminationJob{d, record_for(index_of(d.name)), std::chrono::seconds{0}});
  }
  t0 = Clock::now();
  auto outcomes = vm::terminate_spot_all(*hv, jobs, sleeper);
  const double terminate = since(t0);
  for (const auto& o : outcomes) {
    if (!o.result) die(o.uuid + ": " + o.result.error().detail);
    if (!o.result->terminated) die(o.uuid + " not terminated: " + o.result->detail);
  }
  t0 = Clock::now();
  check_after(*hv, domains);
  const double after = since(t0);
  if (!keep) return;
  times.open_list_ms.push_back(open_list);
  times.list_ms.push_back(list);
  times.terminate_ms.push_back(terminate);
  times.after_ms.push_back(after);
}

// ---- the agent's calls one kind at a time (--steps) ----
struct StepTimes {
  std::vector<double> rec_ms, state1_ms, destroy_ms, state2_ms;
};

void steps_round(const Node& node, int domains, StepTimes& times, bool keep) {
  auto hv = vm::make_libvirt(node.uri);
  auto listed = must_list(*hv);
  auto timed = [&](const std::function<void(const vm::Domain&)>& call) {
    auto t0 = Clock::now();
    for (const auto& d : listed) call(d);
    return since(t0);
  };
  auto state = [&](const vm::Domain& d) {
    if (!hv->state(d.uuid)) die("state failed");
  };
  const double rec = timed([&](const vm::Domain& d) {
    if (!hv->record_termination(d.uuid, record_for(index_of(d.name)))) die("record_termination failed");
  });
  const double s1 = timed(state);
  const double des = timed([&](const vm::Domain& d) {
    if (!hv->destroy(d.uuid)) die("destroy failed");
  });
  const double s2 = timed(state);
  check_after(*hv, domains);
  if (!keep) return;
  times.rec_ms.push_back(rec);
  times.state1_ms.push_back(s1);
  times.destroy_ms.push_back(des);
  times.state2_ms.push_back(s2);
}

// ---- virsh ----
struct VirshScripts {
  std::string destroys;
  std::string meta_destroys;
  std::string check;  // after meta_destroys: every domain's state and record, as the agent's run is checked
};

VirshScripts virsh_scripts(int domains) {
  VirshScripts s;
  for (int i = 0; i < domains; ++i) {
    const auto r = record_for(i);
    s.destroys += fmt::format("destroy {}; ", domain_name(i));
    // virsh's own quoting: the element in single quotes, its attributes in double quotes.
    s.meta_destroys += fmt::format(
        "metadata {} --uri {} --key {} --set '<termination reason=\"{}\" at=\"{}\" by=\"{}\" "
        "audit-id=\"{}\"/>' "
        "--live --config; destroy {}; ",
        domain_name(i), vm::termination_ns, vm::termination_prefix, r.reason, r.at, r.by, r.audit_id,
        domain_name(i));
    s.check +=
        fmt::format("domstate {0}; metadata {0} --uri {1} --config; ", domain_name(i), vm::termination_ns);
  }
  return s;
}

// Once, checked: every domain shut off with its record in the persistent definition.
void check_virsh_end_state(const Options& o, const Node& node, const VirshScripts& scripts) {
  virsh_once(o.virsh, node.uri, scripts.meta_destroys + scripts.check, node.capture,
             {{"destroyed", o.domains}, {"shut off", o.domains}});
  const std::string out = slurp(node.capture);
  for (int i = 0; i < o.domains; ++i) {
    if (count(out, fmt::format("audit-id=\"{}\"", record_for(i).audit_id)) != 1)
      die(domain_name(i) + " lacks its termination record after virsh");
  }
}

// The sum of the "(Time: ...)" after each "Metadata modified" in a virsh -t run's output.
double metadata_only_ms(const std::string& out) {
  double meta_only = 0;
  for (auto at = out.find("Metadata modified"); at != std::string::npos;
       at = out.find("Metadata modified", at + 1)) {
    const auto t = out.find("(Time: ", at);
    if (t != std::string::npos) meta_only += std::strtod(out.c_str() + t + 7, nullptr);
  }
  return meta_only;
}

struct VirshTimes {
  std::vector<double> connect_ms, destroy_all_ms, meta_destroy_ms, loop_ms, destroy_cmd_ms, meta_cmd_ms,
      meta_only_ms;
};

void virsh_round(const Options& o, const Node& node, const VirshScripts& scripts, VirshTimes& times,
                 bool keep) {
  const std::string& virsh = o.virsh;
  const std::string& uri = node.uri;
  const std::string& capture = node.capture;
  const auto c = virsh_once(virsh, uri, "uri", capture, {{uri, 1}});
  const auto d = virsh_once(virsh, uri, scripts.destroys, capture, {{"destroyed", o.domains}});
  const auto m = virsh_once(virsh, uri, scripts.meta_destroys, capture,
                            {{"Metadata modified", o.domains}, {"destroyed", o.domains}});
  // The metadata commands' share of m: the "(Time: ...)" after each "Metadata modified".
  const double meta_only = metadata_only_ms(slurp(capture));
  double l = 0;
  if (o.per_process) {
    for (int i = 0; i < o.domains; ++i)
      l += virsh_once(virsh, uri, "destroy " + domain_name(i), capture, {{"destroyed", 1}}).wall_ms;
  }
  if (!keep) return;
  times.connect_ms.push_back(c.wall_ms);
  times.destroy_all_ms.push_back(d.wall_ms);
  times.meta_destroy_ms.push_back(m.wall_ms);
  times.destroy_cmd_ms.push_back(d.commands_ms);
  times.meta_cmd_ms.push_back(m.commands_ms);
  times.meta_only_ms.push_back(meta_only);
  if (o.per_process) times.loop_ms.push_back(l);
}

// ---- the table ----
void print_agent_table(const Options& o, const AgentTimes& agent, const StepTimes& steps) {
  const std::string n = std::to_string(o.domains);
  fmt::print("\n");
  print("agent open+list(" + n + ")", stats(agent.open_list_ms));
  print("agent list(" + n + ")", stats(agent.list_ms));
  print("agent terminate_spot_all(" + n + ")", stats(agent.terminate_ms));
  print("agent list(" + n + ") after, checked", stats(agent.after_ms));
  if (o.steps) {
    print("  record_termination x" + n, stats(steps.rec_ms));
    print("  state x" + n + " (running)", stats(steps.state1_ms));
    print("  destroy x" + n, stats(steps.destroy_ms));
    print("  state x" + n + " (shut off)", stats(steps.state2_ms));
  }
}

void print_virsh_table(const Options& o, const AgentTimes& agent, const VirshTimes& virsh_times) {
  const int domains = o.domains;
  const std::string n = std::to_string(domains);
  const Stats a_open = stats(agent.open_list_ms), a_term = stats(agent.terminate_ms);
  const Stats v_conn = stats(virsh_times.connect_ms), v_des = stats(virsh_times.destroy_all_ms),
              v_meta = stats(virsh_times.meta_destroy_ms);
  const Stats v_des_cmd = stats(virsh_times.destroy_cmd_ms), v_meta_cmd = stats(virsh_times.meta_cmd_ms);
  print("virsh connect only (1 process)", v_conn);
  print("virsh " + n + " destroy (1 process)", v_des);
  print("virsh " + n + " metadata+destroy (1 process)", v_meta);
  if (o.per_process) print("virsh " + n + " destroy (" + n + " processes)", stats(virsh_times.loop_ms));
  print("virsh " + n + " destroy, commands only", v_des_cmd);
  print("virsh " + n + " metadata+destroy, commands only", v_meta_cmd);
  print("  metadata --live --config x" + n, stats(virsh_times.meta_only_ms));
  fmt::print("(commands only: the sum of virsh -t's per-command times, without process start and connect)\n");
  fmt::print(
      "\nratio agent terminate / virsh metadata+destroy (p50): {:.2f}x whole process, {:.2f}x commands "
      "only\n",
      a_term.p50_ms / v_meta.p50_ms, a_term.p50_ms / v_meta_cmd.p50_ms);
  fmt::print(
      "ratio agent terminate / virsh destroy (p50):          {:.2f}x whole process, {:.2f}x commands only\n",
      a_term.p50_ms / v_des.p50_ms, a_term.p50_ms / v_des_cmd.p50_ms);
  fmt::print(
      "per VM (p50): agent terminate {:.1f} us, virsh metadata+destroy {:.1f} us, virsh destroy {:.1f} us\n",
      1000 * a_term.p50_ms / domains, 1000 * v_meta_cmd.p50_ms / domains, 1000 * v_des_cmd.p50_ms / domains);
  fmt::print("ratio agent open+list+terminate / virsh metadata+destroy process (p50): {:.2f}x\n",
             (a_open.p50_ms + a_term.p50_ms) / v_meta.p50_ms);
  // make bench's table (tests/bench/summary.py): the agent's whole job from a fresh connection
  // (open, list, terminate) beside one virsh process doing the same (connect, metadata, destroy).
  // Issue 14 had it at 0.45-0.51 before; it is to hold.
  const double whole = a_open.p50_ms + a_term.p50_ms;
  const double r = whole / v_meta.p50_ms;
  fmt::print(
      R"j(SUMMARY {{"figure": "terminate {} spot VMs (test driver): open, list, terminate", "gpunode": "{:.1f} ms", "anchor": "virsh metadata+destroy, one process: {:.1f} ms", "ratio": {:.3f}, "target": "≤ 0.51 (hold)", "met": {}}})j"
      "\n",
      domains, whole, v_meta.p50_ms, r, r <= 0.51 ? "true" : "false");
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  const Node node = make_node(o.domains);

  const bool have_virsh = spawn({o.virsh, "-v"}, node.capture).status == 0;
  fmt::print("node {}: {} running spot domains (one GPU each), grace 0, {} iterations each after a warm-up\n",
             node.uri, o.domains, o.iterations);
  if (have_virsh)
    fmt::print("virsh {}", slurp(node.capture));
  else
    fmt::print("virsh: `{}` cannot run; no reference figures\n", o.virsh);

  // Each iteration runs the agent, its steps and virsh one after the other, so that a burst of load
  // on the machine falls on all of them rather than on whichever ran during it.
  AgentTimes agent_times;
  StepTimes step_times;
  VirshTimes virsh_times;
  int slept = 0;
  const vm::Sleeper sleeper = [&](std::chrono::milliseconds) {
    ++slept;
    return true;
  };
  const VirshScripts scripts = virsh_scripts(o.domains);
  if (have_virsh) check_virsh_end_state(o, node, scripts);

  for (int it = -1; it < o.iterations; ++it) {  // -1: the warm-up
    agent_round(node, o.domains, sleeper, agent_times, it >= 0);
    if (o.steps) steps_round(node, o.domains, step_times, it >= 0);
    if (have_virsh) virsh_round(o, node, scripts, virsh_times, it >= 0);
  }
  if (slept != 0) die("terminate_spot_all slept with grace 0");

  print_agent_table(o, agent_times, step_times);
  if (have_virsh) print_virsh_table(o, agent_times, virsh_times);
  return 0;
}
