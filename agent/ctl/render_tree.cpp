// `gpunodectl units` for people: the node as a tree (CONTRACT §8), in the manner of tree(1) and
// lstopo: NUMA node -> unit -> devices, reservations and VMs.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "gpunode/ctl/render.hpp"

namespace gpunode::ctl {
namespace {

struct Node {
  std::string text;
  std::vector<Node> children;
};

void draw(const Node& n, const std::string& prefix, const Style& style, std::string& out) {
  for (std::size_t i = 0; i < n.children.size(); ++i) {
    const bool last = i + 1 == n.children.size();
    out += prefix + style.paint("2", last ? "└── " : "├── ") + n.children[i].text + "\n";
    draw(n.children[i], prefix + style.paint("2", last ? "    " : "│   "), style, out);
  }
}

std::string numa_label(const std::vector<std::int64_t>& nodes) {
  if (nodes.empty()) return "NUMA node unknown";
  if (nodes.size() == 1) return fmt::format("NUMA node {}", nodes.front());
  return fmt::format("NUMA nodes {}", fmt::join(nodes, ", "));
}

std::string device_text(const Unit& u, const Device& d, const Style& style) {
  std::string name;
  for (const auto& g : u.gpus) {
    if (g.pci_address == d.pci_address && g.name) name = *g.name;
  }
  if (name.empty()) name = fmt::format("[{}:{}]", d.vendor_id, d.device_id);
  const std::string driver = d.driver ? *d.driver : style.paint("33", "no driver");
  return fmt::format("{}  {}  {}  {}", d.pci_address, d.role == "gpu" ? style.paint("1", d.role) : d.role,
                     name, driver);
}

std::string unit_text(const Unit& u, const Style& style) {
  std::string why;
  if (u.reservable) {
    why = style.paint("32", "reservable");
  } else {
    std::vector<std::string> codes;
    for (const auto& r : u.reasons) codes.push_back(r.code);
    why = style.paint("31", fmt::format("not reservable: {}", fmt::join(codes, ", ")));
    if (u.sellable) why += " (sellable on demand)";
  }
  std::string health;  // CONTRACT §8: a failing unit is marked
  if (u.health.state == "failing") health = "  " + style.paint("1;31", "FAILING");
  if (u.health.state == "warning") health = "  " + style.paint("33", "health warning");
  return fmt::format("{}  {}  {} GPU{}{}  {}", style.paint("1", u.id), u.cls, u.gpu_count,
                     u.gpu_count == 1 ? "" : "s", health, why);
}

std::string reservation_text(const Reservation& r, const std::string& unit_id, const Style& style) {
  std::string when = r.state == "scheduled" ? fmt::format("scheduled {} → {}", r.starts_at, r.ends_at)
                                            : fmt::format("{} until {}", r.state, r.ends_at);
  std::string out = fmt::format("{} {}  audience {}", style.paint("36", "reservation " + r.id), when,
                                fmt::join(r.audience, ","));
  if (!r.managers.empty()) out += fmt::format("  managers {}", fmt::join(r.managers, ","));
  auto has = [&](const std::vector<std::string>& v) {
    return std::find(v.begin(), v.end(), unit_id) != v.end();
  };
  if (has(r.released)) out += "  " + style.paint("33", "released to spot");
  if (has(r.reclaiming)) out += "  " + style.paint("35", "reclaiming");
  return out;
}

std::string vm_text(const Workload& w, const Style& style, const NodeState& s) {
  std::string who = w.tier ? fmt::format("{} of {}", *w.tier == "spot" ? style.paint("35", "spot") : *w.tier,
                                         w.org.value_or("?"))
                           : style.paint("33", "unlabelled");
  std::string out = fmt::format("VM {}{}  {}  {}", w.name, w.vm_id ? fmt::format(" ({})", *w.vm_id) : "", who,
                                w.state == "running" ? style.paint("32", w.state) : w.state);
  if (w.termination_reason) out += fmt::format("  terminated: {}", *w.termination_reason);
  if (s.unentitled) {
    if (auto it = s.unentitled->find(w.domain_uuid); it != s.unentitled->end()) {
      out += "  " + style.paint("31", fmt::format("NOT ENTITLED ({})", it->second));
    }
  }
  return out;
}

}  // namespace

std::string render_units_tree(const NodeState& s, const Style& style) {
  std::int64_t gpus = 0;
  for (const auto& u : s.units) gpus += u.gpu_count;
  Node root;
  // NUMA groups in node order, units without a NUMA node last.
  std::map<std::vector<std::int64_t>, std::vector<const Unit*>> groups;
  for (const auto& u : s.units) groups[u.numa_nodes].push_back(&u);
  std::vector<std::pair<std::vector<std::int64_t>, std::vector<const Unit*>>> ordered(groups.begin(),
                                                                                      groups.end());
  std::stable_partition(ordered.begin(), ordered.end(), [](const auto& g) { return !g.first.empty(); });
  for (const auto& [numa, units] : ordered) {
    Node group{style.paint("1", numa_label(numa)), {}};
    for (const Unit* u : units) {
      Node unit{unit_text(*u, style), {}};
      for (const auto& d : u->devices) unit.children.push_back(Node{device_text(*u, d, style), {}});
      std::vector<const Reservation*> held;
      for (const auto& r : s.reservations) {
        if (r.state != "ended" && std::find(r.unit_ids.begin(), r.unit_ids.end(), u->id) != r.unit_ids.end())
          held.push_back(&r);
      }
      std::stable_sort(held.begin(), held.end(), [](const Reservation* a, const Reservation* b) {
        return a->starts_at < b->starts_at;
      });
      for (const auto* r : held) unit.children.push_back(Node{reservation_text(*r, u->id, style), {}});
      for (const auto& w : s.workloads) {
        if (std::find(w.unit_ids.begin(), w.unit_ids.end(), u->id) != w.unit_ids.end())
          unit.children.push_back(Node{vm_text(w, style, s), {}});
      }
      group.children.push_back(std::move(unit));
    }
    root.children.push_back(std::move(group));
  }
  Node loose{style.paint("1", "VMs on no unit"), {}};
  for (const auto& w : s.workloads) {
    if (w.unit_ids.empty()) loose.children.push_back(Node{vm_text(w, style, s), {}});
  }
  if (!loose.children.empty()) root.children.push_back(std::move(loose));

  std::string out = fmt::format("node {}: {} unit{}, {} GPU{}\n", style.paint("1", s.node_id), s.units.size(),
                                s.units.size() == 1 ? "" : "s", gpus, gpus == 1 ? "" : "s");
  if (s.units.empty()) return out + "no GPU units\n";
  draw(root, "", style, out);
  return out;
}

}  // namespace gpunode::ctl
