#include "gpunode/metrics/exposition.hpp"

#include <fmt/format.h>

#include <cmath>

namespace gpunode::metrics {

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

namespace {

std::string escape_help(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

}  // namespace

void Writer::family(std::string_view name, std::string_view type, std::string_view help) {
  out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escape_help(help), name, type);
}

void Writer::series(std::string_view name, const Labels& labels, std::string_view extra_name,
                    std::string_view extra_value) {
  out_ += name;
  if (labels.empty() && extra_name.empty()) return;
  out_ += '{';
  bool first = true;
  auto one = [&](std::string_view k, std::string_view v) {
    if (!first) out_ += ',';
    first = false;
    out_ += k;
    out_ += "=\"";
    out_ += escape_label_value(v);
    out_ += '"';
  };
  for (const auto& [k, v] : labels) one(k, v);
  if (!extra_name.empty()) one(extra_name, extra_value);
  out_ += '}';
}

void Writer::sample(std::string_view name, const Labels& labels, double value) {
  series(name, labels);
  out_ += ' ';
  out_ += format_value(value);
  out_ += '\n';
}

void Writer::sample(std::string_view name, const Labels& labels, std::int64_t value) {
  series(name, labels);
  out_ += fmt::format(" {}\n", value);
}

void Writer::sample(std::string_view name, const Labels& labels, std::uint64_t value) {
  series(name, labels);
  out_ += fmt::format(" {}\n", value);
}

void Writer::histogram(std::string_view name, const Labels& labels, std::span<const double> bounds,
                       std::span<const std::uint64_t> counts, double sum) {
  const std::string bucket = fmt::format("{}_bucket", name);
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    cumulative += i < counts.size() ? counts[i] : 0;
    series(bucket, labels, "le", format_value(bounds[i]));
    out_ += fmt::format(" {}\n", cumulative);
  }
  cumulative += bounds.size() < counts.size() ? counts[bounds.size()] : 0;
  series(bucket, labels, "le", "+Inf");
  out_ += fmt::format(" {}\n", cumulative);
  series(fmt::format("{}_sum", name), labels);
  out_ += ' ' + format_value(sum) + '\n';
  series(fmt::format("{}_count", name), labels);
  out_ += fmt::format(" {}\n", cumulative);
}

}  // namespace gpunode::metrics
