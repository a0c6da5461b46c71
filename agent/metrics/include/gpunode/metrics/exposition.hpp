// gpunode/metrics/exposition.hpp: the Prometheus text exposition format 0.0.4, written by hand
// (https://prometheus.io/docs/instrumenting/exposition_formats/). Pure: no I/O, no clock.
//
// A family is `# HELP`, `# TYPE`, then its samples; label values are escaped (backslash, double
// quote, line feed), HELP text too (backslash, line feed). A histogram's buckets are cumulative and
// end with `le="+Inf"`, followed by `_sum` and `_count` (equal to the +Inf bucket).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpunode::metrics {

inline constexpr std::string_view kContentType = "text/plain; version=0.0.4; charset=utf-8";

using Labels = std::vector<std::pair<std::string_view, std::string_view>>;

// A label value as the format wants it between double quotes: \ -> \\, " -> \", LF -> \n.
std::string escape_label_value(std::string_view value);
// A sample value: shortest round-trip decimal, NaN, +Inf, -Inf.
std::string format_value(double value);

class Writer {
 public:
  // `type`: counter, gauge or histogram. Call once per family, before its samples.
  void family(std::string_view name, std::string_view type, std::string_view help);
  void sample(std::string_view name, const Labels& labels, double value);
  void sample(std::string_view name, const Labels& labels, std::int64_t value);
  void sample(std::string_view name, const Labels& labels, std::uint64_t value);
  // One histogram series: `bounds` are the buckets' upper bounds, ascending (no +Inf);
  // `counts[i]` the observations in (bounds[i-1], bounds[i]], and counts[bounds.size()] those above
  // the last bound (so counts.size() == bounds.size() + 1). Written cumulative with +Inf, _sum, _count.
  void histogram(std::string_view name, const Labels& labels, std::span<const double> bounds,
                 std::span<const std::uint64_t> counts, double sum);

  [[nodiscard]] const std::string& text() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void series(std::string_view name, const Labels& labels, std::string_view extra_name = {},
              std::string_view extra_value = {});
  std::string out_;
};

}  // namespace gpunode::metrics
