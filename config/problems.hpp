// Internal: the problems found while loading agent.yaml, with their 1-based positions, collected
// for load_string (config.cpp) and the YAML parse before it (document.cpp).
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "gpunode/config/config.hpp"

namespace gpunode::config {

struct Pos {
  int line = 1;
  int column = 1;
};

inline constexpr Pos kNowhere{0, 0};  // a problem of the whole file: printed as "FILE: message"

// yaml-cpp marks are 0-based (-1 when a node has none).
inline Pos pos_of(const YAML::Mark& mark) {
  return {std::max(mark.line, 0) + 1, std::max(mark.column, 0) + 1};
}
inline Pos pos_of(const YAML::Node& node) {
  return pos_of(node.Mark());
}

class Problems {
 public:
  explicit Problems(const std::string& file) : file_(file) {}

  void add(Pos pos, std::string message) {
    list_.push_back({file_, pos.line, pos.column, std::move(message)});
  }

  // In file order; problems at one position keep the order they were found in.
  std::vector<Problem> take_sorted() {
    std::stable_sort(list_.begin(), list_.end(), [](const Problem& a, const Problem& b) {
      return std::pair(a.line, a.column) < std::pair(b.line, b.column);
    });
    return std::move(list_);
  }

 private:
  const std::string& file_;
  std::vector<Problem> list_;
};

}  // namespace gpunode::config
