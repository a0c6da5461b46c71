// `gpunodectl timeline` for people: one row per unit, each reservation a labelled bar over the
// coming weeks, a date axis on top and a legend below.
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>

#include "gpunode/ctl/render.hpp"

namespace gpunode::ctl {
namespace {

using std::chrono::days;
using std::chrono::seconds;

constexpr std::array<std::string_view, 5> kPalette{"36", "35", "33", "32", "34"};
// One column is the smallest of these that lets the chart fit.
constexpr std::array<std::int64_t, 13> kSlots{3600,  7200,   10800,  14400,  21600,   28800,  43200,
                                              86400, 172800, 345600, 604800, 1209600, 2419200};

std::string key_of(std::size_t i) {
  if (i < 26) return std::string(1, static_cast<char>('A' + i));
  if (i < 52) return std::string(1, static_cast<char>('a' + (i - 26)));
  return "*";
}

std::string slot_text(std::int64_t s) {
  if (s % 86400 == 0) return fmt::format("{} day{}", s / 86400, s == 86400 ? "" : "s");
  return fmt::format("{} h", s / 3600);
}

// UTF-8 text cut into its code points, one per column.
std::vector<std::string> code_points(std::string_view text) {
  std::vector<std::string> out;
  for (char c : text) {
    if ((static_cast<unsigned char>(c) & 0xC0) == 0x80 && !out.empty())
      out.back().push_back(c);
    else
      out.emplace_back(1, c);
  }
  return out;
}

// A cell of the chart: a glyph, and the reservation it belongs to (or none).
struct Cell {
  std::string glyph = " ";
  int owner = -1;
};

// The chart's geometry: the window drawn, one column's seconds, the columns, the unit ids' width.
struct Grid {
  Time start, end;
  std::int64_t slot = 0;
  std::size_t cols = 0;
  std::size_t label_w = 4;
  std::int64_t col_of(Time t) const { return (t - start).count() / slot; }
};

// The window from today for `weeks`, in the fewest columns that let the chart fit `width`.
Grid grid_for(const NodeState& s, Time now, int weeks, std::size_t width) {
  Grid g;
  g.start = std::chrono::floor<days>(now);
  g.end = g.start + days(7 * weeks);
  const std::int64_t span = (g.end - g.start).count();
  for (const auto& u : s.units) g.label_w = std::max(g.label_w, display_width(u.id));
  const std::size_t avail = std::max<std::size_t>(width > g.label_w + 14 ? width - g.label_w - 14 : 0, 28);
  g.slot = kSlots.back();
  for (auto c : kSlots) {
    if (static_cast<std::size_t>((span + c - 1) / c) <= avail) {
      g.slot = c;
      break;
    }
  }
  g.cols = static_cast<std::size_t>((span + g.slot - 1) / g.slot);
  return g;
}

// The reservations drawn: not ended, overlapping the window, in start order (the index of each is
// its key); and how many start after it.
struct Drawn {
  std::vector<const Reservation*> shown;
  std::size_t later = 0;
};

Drawn drawn_in(const NodeState& s, const Grid& g) {
  Drawn d;
  for (const auto& r : s.reservations) {
    if (r.state == "ended" || !r.starts || !r.ends) continue;
    if (*r.starts >= g.end) {
      ++d.later;
      continue;
    }
    if (*r.ends <= g.start) continue;
    d.shown.push_back(&r);
  }
  std::stable_sort(d.shown.begin(), d.shown.end(),
                   [](const Reservation* a, const Reservation* b) { return *a->starts < *b->starts; });
  return d;
}

// The axis: a date at each week's start where it fits, ticks below, now marked.
std::string axis(const Grid& g, int weeks, Time now, const Style& style) {
  const std::string pad(g.label_w + 2, ' ');
  std::string dates(g.cols + 8, ' ');
  std::vector<std::string> ticks(g.cols, "─");
  std::size_t free_from = 0;
  for (int w = 0; w <= weeks; ++w) {
    const Time t = g.start + days(7 * w);
    const auto c = static_cast<std::size_t>(g.col_of(t));
    if (c < g.cols) ticks[c] = "┬";
    const std::string label = fmt::format("{:%b %d}", t);
    if (c >= free_from && c + label.size() <= dates.size()) {
      dates.replace(c, label.size(), label);
      free_from = c + label.size() + 1;
    }
  }
  ticks[static_cast<std::size_t>(
      std::clamp<std::int64_t>(g.col_of(now), 0, static_cast<std::int64_t>(g.cols) - 1))] = "▼";
  while (!dates.empty() && dates.back() == ' ') dates.pop_back();
  std::string tick_line;
  for (const auto& t : ticks) tick_line += t;
  return pad + dates + "\n" + pad + style.paint("2", tick_line) + " " + style.paint("2", "(▼ now)") + "\n";
}

// Reservation `i`'s bar in a unit's cells: the key, then the first audience org when it fits, then
// ━ to the end; a term that goes on past the window ends in an arrow.
void draw_bar(std::vector<Cell>& cells, const Reservation& r, std::size_t i, const Grid& g) {
  const auto a = static_cast<std::size_t>(std::max<std::int64_t>(g.col_of(std::max(*r.starts, g.start)), 0));
  const auto b =
      static_cast<std::size_t>(((std::min(*r.ends, g.end) - g.start).count() + g.slot - 1) / g.slot);
  std::string label = key_of(i);
  if (!r.audience.empty()) {
    const std::string named =
        fmt::format("{} {}{}", label, r.audience.front(),
                    r.audience.size() > 1 ? fmt::format(" +{}", r.audience.size() - 1) : "");
    if (display_width(named) + 1 <= b - std::min(a, b)) label = named;
  }
  const auto glyphs = code_points(label);
  std::size_t k = 0;
  for (std::size_t c = a; c < b && c < g.cols; ++c, ++k) {
    cells[c].owner = static_cast<int>(i);
    cells[c].glyph = k < glyphs.size() ? glyphs[k] : "━";
  }
  if (*r.ends > g.end && b > a && b - a > glyphs.size()) cells[std::min(b, g.cols) - 1].glyph = "▶";
}

// The cells as text: runs of cells with one owner are painted together.
std::string painted(const std::vector<Cell>& cells, const Style& style) {
  std::string row;
  for (std::size_t c = 0; c < cells.size();) {
    std::size_t e = c;
    std::string run;
    while (e < cells.size() && cells[e].owner == cells[c].owner) run += cells[e++].glyph;
    const int o = cells[c].owner;
    row += o < 0 ? style.paint("2", run)
                 : style.paint(fmt::format("1;{}", kPalette[static_cast<std::size_t>(o) % kPalette.size()]),
                               run);
    c = e;
  }
  return row;
}

// A unit's row: its id, the bars of the reservations on it over the days' dots, and notes.
std::string unit_row(const Unit& u, const std::vector<const Reservation*>& shown, const Grid& g,
                     const Style& style) {
  std::vector<Cell> cells(g.cols);
  for (std::size_t c = 0; c < g.cols; ++c) {
    if ((static_cast<std::int64_t>(c) * g.slot) % 86400 == 0 && g.slot < 86400) cells[c].glyph = "·";
  }
  std::vector<std::string> notes;
  for (std::size_t i = 0; i < shown.size(); ++i) {
    const auto& r = *shown[i];
    if (std::find(r.unit_ids.begin(), r.unit_ids.end(), u.id) == r.unit_ids.end()) continue;
    draw_bar(cells, r, i, g);
    if (std::find(r.released.begin(), r.released.end(), u.id) != r.released.end())
      notes.push_back(key_of(i) + " released to spot");
    if (std::find(r.reclaiming.begin(), r.reclaiming.end(), u.id) != r.reclaiming.end())
      notes.push_back(key_of(i) + " reclaiming");
  }
  if (!u.reservable) notes.emplace_back("not reservable");
  std::string row = painted(cells, style);
  if (notes.empty()) {
    while (row.ends_with(' ')) row.pop_back();
  }
  const std::string id = fmt::format("{:<{}}", u.id, g.label_w);
  return style.paint("1", id) + "  " + row +
         (notes.empty() ? "" : "  " + fmt::format("{}", fmt::join(notes, "; "))) + "\n";
}

// The legend: each key's reservation.
std::string legend(const std::vector<const Reservation*>& shown, const Style& style) {
  std::vector<std::vector<std::string>> rows;
  for (std::size_t i = 0; i < shown.size(); ++i) {
    const auto& r = *shown[i];
    rows.push_back({style.paint(fmt::format("1;{}", kPalette[i % kPalette.size()]), key_of(i)), r.id, r.state,
                    fmt::format("{:%Y-%m-%d %H:%M} → {:%Y-%m-%d %H:%M}", *r.starts, *r.ends),
                    fmt::format("{}", fmt::join(r.audience, ",")),
                    r.managers.empty() ? "-" : fmt::format("{}", fmt::join(r.managers, ",")),
                    r.note.empty() ? "-" : r.note});
  }
  return table({"", "RESERVATION", "STATE", "TERM (UTC)", "AUDIENCE", "MANAGERS", "NOTE"}, rows, style);
}

}  // namespace

std::string render_timeline(const NodeState& s, Time now, int weeks, std::size_t width, const Style& style) {
  weeks = std::clamp(weeks, 1, 520);
  const Grid g = grid_for(s, now, weeks, width);
  const Drawn d = drawn_in(s, g);
  std::string out =
      fmt::format("timeline of node {}: {} week{} from {:%Y-%m-%d} (UTC), one column = {}\n\n",
                  style.paint("1", s.node_id), weeks, weeks == 1 ? "" : "s", g.start, slot_text(g.slot));
  out += axis(g, weeks, now, style);
  for (const auto& u : s.units) out += unit_row(u, d.shown, g, style);
  if (s.units.empty()) out += "no GPU units\n";
  out += "\n";
  out += d.shown.empty() ? "no reservations in these weeks\n" : legend(d.shown, style);
  if (d.later > 0)
    out += fmt::format("{} more reservation{} start{} after {:%Y-%m-%d}\n", d.later, d.later == 1 ? "" : "s",
                       d.later == 1 ? "s" : "", g.end);
  return out;
}

}  // namespace gpunode::ctl
