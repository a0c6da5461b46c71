// Tables, single answers, problems and the status summary (the two pictures are in render_tree.cpp
// and render_timeline.cpp).
#include "gpunode/ctl/render.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <map>

#include "gpunode/text/printable.hpp"

namespace gpunode::ctl {
namespace json = boost::json;

namespace {

// The strings below come from the agent's answers and are for people: escaped (text::printable).
std::string str_of(const json::object& o, std::string_view key, std::string_view fallback = "") {
  const auto* v = o.if_contains(key);
  const auto* s = v == nullptr ? nullptr : v->if_string();
  return s == nullptr ? std::string(fallback) : text::printable(*s);
}

std::string text_of(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  if (v == nullptr || v->is_null()) return "-";
  if (const auto* s = v->if_string()) return s->empty() ? "-" : text::printable(*s);
  if (const auto* a = v->if_array()) {
    std::vector<std::string> parts;
    for (const auto& x : *a) {
      if (const auto* s = x.if_string()) parts.push_back(text::printable(*s));
    }
    return parts.empty() ? "-" : fmt::format("{}", fmt::join(parts, ","));
  }
  if (const auto* i = v->if_int64()) return std::to_string(*i);
  if (const auto* b = v->if_bool()) return *b ? "true" : "false";
  return "?";
}

const json::array* array_of(const json::value& body, std::string_view key) {
  const auto* o = body.if_object();
  const auto* v = o == nullptr ? nullptr : o->if_contains(key);
  return v == nullptr ? nullptr : v->if_array();
}

std::string ids(const std::vector<std::string>& v) {
  return v.empty() ? "-" : fmt::format("{}", fmt::join(v, ","));
}

std::string_view state_color(std::string_view state) {
  if (state == "active" || state == "running") return "32";
  if (state == "scheduled") return "36";
  return "2";
}

}  // namespace

std::string Style::paint(std::string_view sgr, std::string_view text) const {
  if (!color || sgr.empty() || text.empty()) return std::string(text);
  return fmt::format("\x1b[{}m{}\x1b[0m", sgr, text);
}

bool use_color(bool stdout_is_tty, const char* no_color_env) {
  return stdout_is_tty && (no_color_env == nullptr || no_color_env[0] == '\0');
}

std::size_t display_width(std::string_view text) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == 0x1b && i + 1 < text.size() && text[i + 1] == '[') {
      // SGR: ESC [ ... m
      i += 2;
      while (i < text.size() && text[i] != 'm') ++i;
      continue;
    }
    if ((c & 0xC0) != 0x80) ++n;
  }
  return n;
}

std::string table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                  const Style& style) {
  std::vector<std::size_t> w(header.size(), 0);
  for (std::size_t i = 0; i < header.size(); ++i) w[i] = display_width(header[i]);
  for (const auto& r : rows) {
    for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], display_width(r[i]));
  }
  auto line = [&](const std::vector<std::string>& cells, bool head) {
    std::string out;
    for (std::size_t i = 0; i < cells.size() && i < w.size(); ++i) {
      const bool last = i + 1 == cells.size();
      const std::string cell = head ? style.paint("1", cells[i]) : cells[i];
      out += cell;
      if (!last) out += std::string(w[i] - display_width(cells[i]) + 2, ' ');
    }
    return out + "\n";
  };
  std::string out = line(header, true);
  for (const auto& r : rows) out += line(r, false);
  return out;
}

std::string render_reservations(const std::vector<Reservation>& list, const Style& style) {
  if (list.empty()) return "no reservations\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : list) {
    rows.push_back({r.id, style.paint(state_color(r.state), r.state), r.starts_at, r.ends_at, ids(r.unit_ids),
                    ids(r.audience), ids(r.managers), ids(r.released), ids(r.reclaiming),
                    r.note.empty() ? "-" : r.note});
  }
  return table(
      {"ID", "STATE", "STARTS", "ENDS", "UNITS", "AUDIENCE", "MANAGERS", "RELEASED", "RECLAIMING", "NOTE"},
      rows, style);
}

std::string render_reservation(const Reservation& r, const Style& style) {
  std::vector<std::vector<std::string>> rows{
      {"id", style.paint("1", r.id)},    {"state", style.paint(state_color(r.state), r.state)},
      {"starts", r.starts_at},           {"ends", r.ends_at},
      {"units", ids(r.unit_ids)},        {"audience", ids(r.audience)},
      {"managers", ids(r.managers)},     {"released to spot", ids(r.released)},
      {"reclaiming", ids(r.reclaiming)},
  };
  if (r.ended_at) rows.push_back({"ended", fmt::format("{} ({})", *r.ended_at, r.end_reason.value_or("-"))});
  rows.push_back({"note", r.note.empty() ? "-" : r.note});
  rows.push_back({"version", std::to_string(r.version)});
  std::string out;
  for (const auto& row : rows) out += fmt::format("{:<17} {}\n", row[0] + ":", row[1]);
  return out;
}

std::string render_workloads(const std::vector<Workload>& list, const Style& style) {
  if (list.empty()) return "no workloads\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& w : list) {
    rows.push_back({w.name, w.vm_id.value_or("-"), w.org.value_or("-"), w.tier.value_or("unlabelled"),
                    style.paint(state_color(w.state), w.state), ids(w.unit_ids),
                    w.termination_reason.value_or("-")});
  }
  return table({"NAME", "VM", "ORG", "TIER", "STATE", "UNITS", "TERMINATED"}, rows, style);
}

std::string render_capacity(const json::value& body, const Style& style) {
  const auto* o = body.if_object();
  const auto* units = array_of(body, "units");
  std::string out = fmt::format("what {} may place on node {} now:\n", o ? str_of(*o, "orgId", "?") : "?",
                                o ? str_of(*o, "nodeId", "?") : "?");
  if (units == nullptr || units->empty()) return out + "nothing\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& x : *units) {
    const auto* e = x.if_object();
    if (e == nullptr) continue;
    rows.push_back({text_of(*e, "unitId"), text_of(*e, "class"), text_of(*e, "gpuCount"), text_of(*e, "tier"),
                    text_of(*e, "reservationId")});
  }
  return out + table({"UNIT", "CLASS", "GPUS", "TIER", "RESERVATION"}, rows, style);
}

std::string render_audit(const json::value& body, const Style& style) {
  const auto* records = array_of(body, "records");
  if (records == nullptr || records->empty()) return "no audit records\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& x : *records) {
    const auto* r = x.if_object();
    if (r == nullptr) continue;
    std::string actor = "-";
    if (const auto* a = r->if_contains("actor"); a != nullptr && a->is_object()) {
      const auto& ao = a->get_object();
      actor = fmt::format("{} ({})", text_of(ao, "sub"), text_of(ao, "via"));
    }
    const std::string result = text_of(*r, "result");
    rows.push_back({text_of(*r, "id"), text_of(*r, "at"), actor, text_of(*r, "action"),
                    text_of(*r, "reservationId"), text_of(*r, "unitIds"), text_of(*r, "vmIds"),
                    style.paint(result == "ok" ? "" : "33", result), text_of(*r, "detail")});
  }
  return table({"ID", "AT", "ACTOR", "ACTION", "RESERVATION", "UNITS", "VMS", "RESULT", "DETAIL"}, rows,
               style);
}

std::string render_terminations(const json::value& body, const Style& style) {
  // A dry run (CONTRACT §12) says so first, and what it lists is what the call would do.
  const auto* dry_flag = body.is_object() ? body.get_object().if_contains("dryRun") : nullptr;
  const bool dry = dry_flag != nullptr && dry_flag->is_bool() && dry_flag->get_bool();
  std::string out = dry ? "dry run: nothing was changed; the call would do this:\n" : "";
  const auto* terminated = array_of(body, "terminated");
  const auto* left = array_of(body, "leftRunning");
  std::vector<std::vector<std::string>> rows;
  for (const auto* list : {terminated, left}) {
    if (list == nullptr) continue;
    for (const auto& x : *list) {
      const auto* e = x.if_object();
      if (e == nullptr) continue;
      const bool stopped = list == terminated;
      rows.push_back({text_of(*e, "name"), text_of(*e, "vmId"), text_of(*e, "unitIds"),
                      stopped ? style.paint("31", dry ? "would be terminated" : "terminated")
                              : fmt::format("left running ({})", text_of(*e, "reason"))});
    }
  }
  if (const auto* a = array_of(body, "terminating")) {
    for (const auto& x : *a) {
      if (const auto* e = x.if_object())
        rows.push_back(
            {text_of(*e, "name"), text_of(*e, "vmId"), text_of(*e, "unitIds"), "terminating (another call)"});
    }
  }
  if (rows.empty())
    return out +
           (dry ? "no VM would be terminated, none left running\n" : "no VM terminated, none left running\n");
  return out + table({"VM", "VMID", "UNITS", "OUTCOME"}, rows, style);
}

std::string render_problem(unsigned status, std::string_view body) {
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  const auto* o = ec ? nullptr : v.if_object();
  if (o == nullptr || o->if_contains("code") == nullptr) {
    const std::string shown = text::printable(body.substr(0, 200));
    return fmt::format("gpunodectl: http-{}: the agent answered {} without a problem body{}{}\n", status,
                       status, shown.empty() ? "" : ": ", shown);
  }
  std::string detail(str_of(*o, "detail"));
  if (detail.empty()) detail = str_of(*o, "title");
  std::string out = fmt::format("gpunodectl: {}: {}\n", str_of(*o, "code", "?"), detail);
  if (const auto* errs = array_of(v, "errors")) {
    for (const auto& e : *errs) {
      if (const auto* eo = e.if_object())
        out += fmt::format("  {}: {}\n", str_of(*eo, "field", "?"), str_of(*eo, "message"));
    }
  }
  if (const auto* blocking = array_of(v, "blockingReservationIds")) {
    for (const auto& b : *blocking) {
      if (const auto* s = b.if_string())
        out += fmt::format("  blocked by reservation {}\n", text::printable(*s));
    }
  }
  if (const auto* units = array_of(v, "units")) {
    for (const auto& u : *units) {
      const auto* uo = u.if_object();
      if (uo == nullptr) continue;
      std::vector<std::string> codes;
      if (const auto* rs = array_of(u, "reasons")) {
        for (const auto& r : *rs) {
          if (const auto* ro = r.if_object()) codes.emplace_back(str_of(*ro, "code"));
        }
      }
      out += fmt::format("  {}: {}\n", str_of(*uo, "unitId", "?"), fmt::join(codes, ", "));
    }
  }
  if (const auto* ws = array_of(v, "workloads")) {
    for (const auto& w : *ws) {
      if (const auto* wo = w.if_object()) {
        out += fmt::format("  occupied by VM {} ({})\n", str_of(*wo, "name", "?"),
                           text_of(*wo, "vmId") == "-" ? "unlabelled" : text_of(*wo, "vmId"));
      }
    }
  }
  return out;
}

std::string render_status(const StatusView& v, const Style& style) {
  std::map<std::string, int> by_class, by_state;
  int reservable = 0;
  std::int64_t gpus = 0;
  for (const auto& u : v.state.units) {
    ++by_class[u.cls];
    reservable += u.reservable ? 1 : 0;
    gpus += u.gpu_count;
  }
  for (const auto& r : v.state.reservations) ++by_state[r.state];
  if (v.ended && *v.ended > 0) by_state["ended"] = static_cast<int>(*v.ended);
  int running = 0;
  for (const auto& w : v.state.workloads) running += w.state == "running" ? 1 : 0;
  auto counts = [](const std::map<std::string, int>& m) {
    std::vector<std::string> parts;
    for (const auto& [k, n] : m) parts.push_back(fmt::format("{} {}", n, k));
    return parts.empty() ? std::string("none") : fmt::format("{}", fmt::join(parts, ", "));
  };
  std::string out;
  auto row = [&](std::string_view k, const std::string& val) {
    out += fmt::format("{:<13} {}\n", fmt::format("{}:", k), val);
  };
  row("node", style.paint("1", v.node_id));
  row("agent", fmt::format("gpunode-agent {}", v.version));
  row("revision", std::to_string(v.revision));
  row("units", fmt::format("{} ({} GPUs; {} reservable): {}", v.state.units.size(), gpus, reservable,
                           counts(by_class)));
  row("reservations", counts(by_state));
  row("workloads", fmt::format("{} ({} running)", v.state.workloads.size(), running));
  row("outbox", v.outbox_depth ? fmt::format("{} undelivered events", *v.outbox_depth)
                               : std::string("unknown (the agent serves no outbox metric)"));
  row("libvirt", style.paint(v.libvirt == "connected" ? "32" : "33", v.libvirt) +
                     (v.libvirt_detail.empty() ? "" : ": " + v.libvirt_detail));
  if (!v.state.unentitled) {
    row("unentitled", "unknown (the agent does not say)");
  } else if (v.state.unentitled->empty()) {
    row("unentitled", "none");
  } else {
    // Which VMs run on units they are not entitled to (CONTRACT §9): the agent leaves them running.
    std::vector<std::string> names;
    for (const auto& w : v.state.workloads) {
      if (auto it = v.state.unentitled->find(w.domain_uuid); it != v.state.unentitled->end())
        names.push_back(fmt::format("{} ({})", w.name, it->second));
    }
    if (names.empty()) names.push_back(fmt::format("{} domains", v.state.unentitled->size()));
    row("unentitled",
        style.paint("31", fmt::format("{} VM{} on units {} not entitled to: {}", v.state.unentitled->size(),
                                      v.state.unentitled->size() == 1 ? "" : "s",
                                      v.state.unentitled->size() == 1 ? "it is" : "they are",
                                      fmt::join(names, "; "))));
  }
  return out;
}

json::value status_json(const StatusView& v) {
  json::object by_class, by_state;
  int reservable = 0, running = 0;
  std::int64_t gpus = 0;
  for (const auto& u : v.state.units) {
    auto& n = by_class[u.cls];
    n = (n.is_int64() ? n.get_int64() : 0) + 1;
    reservable += u.reservable ? 1 : 0;
    gpus += u.gpu_count;
  }
  for (const auto& s : {"scheduled", "active", "ended"}) by_state[s] = 0;
  for (const auto& r : v.state.reservations) {
    auto& n = by_state[r.state];
    n = (n.is_int64() ? n.get_int64() : 0) + 1;
  }
  if (v.ended) by_state["ended"] = static_cast<std::int64_t>(*v.ended);
  for (const auto& w : v.state.workloads) running += w.state == "running" ? 1 : 0;
  json::value outbox = nullptr;
  if (v.outbox_depth) outbox = static_cast<std::int64_t>(*v.outbox_depth);
  return json::object{{"nodeId", v.node_id},
                      {"version", v.version},
                      {"revision", v.revision},
                      {"units", json::object{{"total", v.state.units.size()},
                                             {"gpus", gpus},
                                             {"reservable", reservable},
                                             {"byClass", std::move(by_class)}}},
                      {"reservations", std::move(by_state)},
                      {"workloads", json::object{{"total", v.state.workloads.size()}, {"running", running}}},
                      {"outboxDepth", std::move(outbox)},
                      {"libvirt", v.libvirt},
                      {"unentitledWorkloads",
                       v.state.unentitled ? json::value(static_cast<std::int64_t>(v.state.unentitled->size()))
                                          : json::value(nullptr)}};
}

}  // namespace gpunode::ctl
