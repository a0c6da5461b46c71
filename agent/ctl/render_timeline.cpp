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

}  // namespace

std::string render_timeline(const NodeState& s, Time now, int weeks, std::size_t width, const Style& style) {
  weeks = std::clamp(weeks, 1, 520);
  const Time start = std::chrono::floor<days>(now);
  const Time end = start + days(7 * weeks);
  const std::int64_t span = (end - start).count();

  std::size_t label_w = 4;
  for (const auto& u : s.units) label_w = std::max(label_w, display_width(u.id));
  const std::size_t avail = std::max<std::size_t>(width > label_w + 14 ? width - label_w - 14 : 0, 28);
  std::int64_t slot = kSlots.back();
  for (auto c : kSlots) {
    if (static_cast<std::size_t>((span + c - 1) / c) <= avail) {
      slot = c;
      break;
    }
  }
  const auto cols = static_cast<std::size_t>((span + slot - 1) / slot);
  auto col_of = [&](Time t) { return (t - start).count() / slot; };

  // The reservations drawn: not ended, overlapping the window, in start order; each gets a key.
  std::vector<const Reservation*> shown;
  std::size_t later = 0;
  for (const auto& r : s.reservations) {
    if (r.state == "ended" || !r.starts || !r.ends) continue;
    if (*r.starts >= end) {
      ++later;
      continue;
    }
    if (*r.ends <= start) continue;
    shown.push_back(&r);
  }
  std::stable_sort(shown.begin(), shown.end(),
                   [](const Reservation* a, const Reservation* b) { return *a->starts < *b->starts; });

  std::string out =
      fmt::format("timeline of node {}: {} week{} from {:%Y-%m-%d} (UTC), one column = {}\n\n",
                  style.paint("1", s.node_id), weeks, weeks == 1 ? "" : "s", start, slot_text(slot));
  // The axis: a date at each week's start where it fits, ticks below, now marked.
  const std::string pad(label_w + 2, ' ');
  std::string dates(cols + 8, ' ');
  std::vector<std::string> ticks(cols, "─");
  std::size_t free_from = 0;
  for (int w = 0; w <= weeks; ++w) {
    const Time t = start + days(7 * w);
    const auto c = static_cast<std::size_t>(col_of(t));
    if (c < cols) ticks[c] = "┬";
    const std::string label = fmt::format("{:%b %d}", t);
    if (c >= free_from && c + label.size() <= dates.size()) {
      dates.replace(c, label.size(), label);
      free_from = c + label.size() + 1;
    }
  }
  ticks[static_cast<std::size_t>(
      std::clamp<std::int64_t>(col_of(now), 0, static_cast<std::int64_t>(cols) - 1))] = "▼";
  while (!dates.empty() && dates.back() == ' ') dates.pop_back();
  out += pad + dates + "\n";
  std::string tick_line;
  for (const auto& t : ticks) tick_line += t;
  out += pad + style.paint("2", tick_line) + " " + style.paint("2", "(▼ now)") + "\n";

  for (const auto& u : s.units) {
    std::vector<Cell> cells(cols);
    for (std::size_t c = 0; c < cols; ++c) {
      if ((static_cast<std::int64_t>(c) * slot) % 86400 == 0 && slot < 86400) cells[c].glyph = "·";
    }
    std::vector<std::string> notes;
    for (std::size_t i = 0; i < shown.size(); ++i) {
      const auto& r = *shown[i];
      if (std::find(r.unit_ids.begin(), r.unit_ids.end(), u.id) == r.unit_ids.end()) continue;
      const auto a = static_cast<std::size_t>(std::max<std::int64_t>(col_of(std::max(*r.starts, start)), 0));
      const auto b = static_cast<std::size_t>(((std::min(*r.ends, end) - start).count() + slot - 1) / slot);
      // The bar: the key, then the first audience org when it fits, then ━ to the end.
      std::string label = key_of(i);
      if (!r.audience.empty()) {
        const std::string named =
            fmt::format("{} {}{}", label, r.audience.front(),
                        r.audience.size() > 1 ? fmt::format(" +{}", r.audience.size() - 1) : "");
        if (display_width(named) + 1 <= b - std::min(a, b)) label = named;
      }
      const auto glyphs = code_points(label);
      std::size_t k = 0;
      for (std::size_t c = a; c < b && c < cols; ++c, ++k) {
        cells[c].owner = static_cast<int>(i);
        cells[c].glyph = k < glyphs.size() ? glyphs[k] : "━";
      }
      // A term that goes on past the window ends in an arrow.
      if (*r.ends > end && b > a && b - a > glyphs.size()) cells[std::min(b, cols) - 1].glyph = "▶";
      if (std::find(r.released.begin(), r.released.end(), u.id) != r.released.end())
        notes.push_back(key_of(i) + " released to spot");
      if (std::find(r.reclaiming.begin(), r.reclaiming.end(), u.id) != r.reclaiming.end())
        notes.push_back(key_of(i) + " reclaiming");
    }
    if (!u.reservable) notes.emplace_back("not reservable");
    // Runs of cells with one owner are painted together.
    std::string row;
    for (std::size_t c = 0; c < cols;) {
      std::size_t e = c;
      std::string run;
      while (e < cols && cells[e].owner == cells[c].owner) run += cells[e++].glyph;
      const int o = cells[c].owner;
      row += o < 0 ? style.paint("2", run)
                   : style.paint(fmt::format("1;{}", kPalette[static_cast<std::size_t>(o) % kPalette.size()]),
                                 run);
      c = e;
    }
    if (notes.empty()) {
      while (row.ends_with(' ')) row.pop_back();
    }
    const std::string id = fmt::format("{:<{}}", u.id, label_w);
    out += style.paint("1", id) + "  " + row +
           (notes.empty() ? "" : "  " + fmt::format("{}", fmt::join(notes, "; "))) + "\n";
  }
  if (s.units.empty()) out += "no GPU units\n";

  out += "\n";
  if (shown.empty()) {
    out += "no reservations in these weeks\n";
  } else {
    std::vector<std::vector<std::string>> rows;
    for (std::size_t i = 0; i < shown.size(); ++i) {
      const auto& r = *shown[i];
      rows.push_back({style.paint(fmt::format("1;{}", kPalette[i % kPalette.size()]), key_of(i)), r.id,
                      r.state, fmt::format("{:%Y-%m-%d %H:%M} → {:%Y-%m-%d %H:%M}", *r.starts, *r.ends),
                      fmt::format("{}", fmt::join(r.audience, ",")),
                      r.managers.empty() ? "-" : fmt::format("{}", fmt::join(r.managers, ",")),
                      r.note.empty() ? "-" : r.note});
    }
    out += table({"", "RESERVATION", "STATE", "TERM (UTC)", "AUDIENCE", "MANAGERS", "NOTE"}, rows, style);
  }
  if (later > 0)
    out += fmt::format("{} more reservation{} start{} after {:%Y-%m-%d}\n", later, later == 1 ? "" : "s",
                       later == 1 ? "s" : "", end);
  return out;
}

}  // namespace gpunode::ctl
