// gpunode/ctl/render.hpp: what gpunodectl prints for people. Pure: plain data and `now` in, text
// out; colour is a Style the caller decides (a terminal, and NO_COLOR unset or empty).
#pragma once

#include <boost/json/value.hpp>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/ctl/model.hpp"

namespace gpunode::ctl {

struct Style {
  bool color = false;
  // SGR codes: "1" bold, "2" dim, "31" red, "32" green, "33" yellow, "34" blue, "35" magenta, "36" cyan.
  [[nodiscard]] std::string paint(std::string_view sgr, std::string_view text) const;
};

// Colour when stdout is a terminal and NO_COLOR is unset or empty (https://no-color.org).
bool use_color(bool stdout_is_tty, const char* no_color_env);

// Display width of UTF-8 text without SGR escapes (one column per code point).
std::size_t display_width(std::string_view text);

// A table: a header row and rows, columns padded to the widest cell, two spaces apart.
std::string table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                  const Style& style);

// `units`: the node as a tree, NUMA node -> unit -> devices, each unit with its class,
// reservable or why not, its reservation (released or reclaiming), and the VMs on it.
std::string render_units_tree(const NodeState& s, const Style& style);

// `timeline`: one row per unit, reservations as labelled bars over `weeks` weeks from the start
// of today (UTC), a date axis on top, a legend below. `width` is the terminal's.
std::string render_timeline(const NodeState& s, Time now, int weeks, std::size_t width, const Style& style);

// `health`: a row per function each unit is judged on (unit, state, reasons, the function, its role,
// power state, link width of its widest, speed), then each reason with its detail and since.
std::string render_health(const std::vector<UnitHealthView>& units, const Style& style);

// Lists and answers.
std::string render_reservations(const std::vector<Reservation>& list, const Style& style);
std::string render_reservation(const Reservation& r, const Style& style);
std::string render_workloads(const std::vector<Workload>& list, const Style& style);
std::string render_capacity(const boost::json::value& body, const Style& style);
std::string render_audit(const boost::json::value& body, const Style& style);
// reclaim and terminate-spot: {"terminated": [...], "leftRunning": [...]} (and a reservation).
std::string render_terminations(const boost::json::value& body, const Style& style);

// A problem+json answer as CONTRACT §8 wants it on stderr: `gpunodectl: CODE: detail`, then one
// line per errors[] entry, then what the problem names (blocking reservations, units' reasons,
// occupying workloads). A body that is not a problem is said so with the status.
std::string render_problem(unsigned status, std::string_view body);

// `status`: the node at a glance.
struct StatusView {
  std::string node_id, version;
  std::int64_t revision = 0;
  NodeState state;
  std::optional<double> outbox_depth;  // nullopt: the agent does not say
  // The ended reservations, which GET state does not hold (CONTRACT §4): from the agent's metrics.
  std::optional<double> ended;
  std::string libvirt = "unknown";  // "connected", "disconnected", "unknown" (as in the heartbeat)
  std::string libvirt_detail;       // why, for people
};
std::string render_status(const StatusView& v, const Style& style);
boost::json::value status_json(const StatusView& v);

}  // namespace gpunode::ctl
