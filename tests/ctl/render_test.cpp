// The pictures and tables from fixed JSON (data/state.json: GET .../state of the demo host, with
// reservations made by gpunodectl; see data/README.md), compared with the expected text, with and
// without colour. GPUNODE_CTL_UPDATE=1 rewrites the expected files (then read the diff).
#include "gpunode/ctl/render.hpp"

#include <doctest/doctest.h>

#include <boost/json/parse.hpp>
#include <cstdlib>
#include <fstream>
#include <sstream>

using namespace gpunode::ctl;
namespace json = boost::json;
using namespace std::chrono_literals;

namespace {

std::string data(const std::string& name) {
  return std::string(GPUNODE_CTL_TEST_DATA) + "/" + name;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

NodeState demo_state() {
  auto v = json::parse(slurp(data("state.json")));
  auto s = decode_state(v);
  REQUIRE(s);
  return *s;
}

// The capture's time (data/README.md).
const Time kNow = std::chrono::sys_days{std::chrono::year{2026} / 12 / 3} + 13h + 51min + 46s;

void expect_text(const std::string& got, const std::string& file) {
  if (const char* u = std::getenv("GPUNODE_CTL_UPDATE"); u != nullptr && *u != '\0') {
    std::ofstream(data(file), std::ios::binary) << got;
  }
  const std::string want = slurp(data(file));
  INFO("expected text: tests/ctl/data/" << file);
  CHECK(got == want);
}

}  // namespace

TEST_CASE("colour only on a terminal, and never with NO_COLOR set non-empty") {
  CHECK(use_color(true, nullptr));
  CHECK(use_color(true, ""));
  CHECK_FALSE(use_color(true, "1"));
  CHECK_FALSE(use_color(true, "0"));
  CHECK_FALSE(use_color(false, nullptr));
  CHECK(Style{true}.paint("1", "x") == "\x1b[1mx\x1b[0m");
  CHECK(Style{false}.paint("1", "x") == "x");
  CHECK(display_width("\x1b[1;36m├── é\x1b[0m") == 5);
}

TEST_CASE("units: the tree, NUMA node -> unit -> devices, reservations and VMs") {
  const auto s = demo_state();
  expect_text(render_units_tree(s, Style{false}), "units.txt");
  expect_text(render_units_tree(s, Style{true}), "units.color.txt");
}

TEST_CASE("timeline: a bar per reservation over the coming weeks") {
  const auto s = demo_state();
  expect_text(render_timeline(s, kNow, 4, 100, Style{false}), "timeline.txt");
  expect_text(render_timeline(s, kNow, 4, 100, Style{true}), "timeline.color.txt");
  // Narrow terminals and long spans get wider columns: the axis (as wide as the chart) fits.
  for (std::size_t width : {60U, 80U, 100U, 160U}) {
    for (int weeks : {1, 4, 12, 52}) {
      std::istringstream lines(render_timeline(s, kNow, weeks, width, Style{false}));
      std::string line;
      while (std::getline(lines, line)) {
        if (line.find("(▼ now)") != std::string::npos)
          CHECK_MESSAGE(display_width(line) <= width, weeks << " weeks: " << line);
      }
    }
  }
}

TEST_CASE("a node without units or reservations") {
  NodeState s;
  s.node_id = "empty";
  CHECK(render_units_tree(s, Style{false}) == "node empty: 0 units, 0 GPUs\nno GPU units\n");
  const auto t = render_timeline(s, kNow, 1, 100, Style{false});
  CHECK(t.find("no GPU units\n") != std::string::npos);
  CHECK(t.find("no reservations in these weeks\n") != std::string::npos);
}

TEST_CASE("lists for people") {
  const auto s = demo_state();
  expect_text(render_reservations(s.reservations, Style{false}), "reservations.txt");
  expect_text(render_workloads(s.workloads, Style{false}), "workloads.txt");
  CHECK(render_reservations({}, Style{false}) == "no reservations\n");
}
