#include "gpunode/ctl/socket_path.hpp"

#include <vector>

#include <fmt/format.h>

namespace gpunode::ctl {
namespace {

struct Line {
  std::size_t number = 0;  // 1-based
  std::size_t indent = 0;
  std::string_view text;   // without indentation, comment and trailing blanks
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// Cuts a comment: '#' at the start or after a blank, outside quotes.
std::string_view strip_comment(std::string_view s) {
  char quote = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote != 0) {
      if (c == '\\' && quote == '"') ++i;
      else if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '#' && (i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t')) {
      return s.substr(0, i);
    }
  }
  return s;
}

std::vector<Line> lines_of(std::string_view text) {
  std::vector<Line> out;
  std::size_t number = 0;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view raw = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++number;
    std::size_t indent = 0;
    while (indent < raw.size() && raw[indent] == ' ') ++indent;
    const std::string_view body = trim(strip_comment(raw.substr(indent)));
    if (body.empty() || body == "---") continue;
    out.push_back(Line{number, indent, body});
  }
  return out;
}

// A scalar value: plain, 'single' or "double" quoted.
std::expected<std::string, std::string> scalar(std::string_view v) {
  v = trim(v);
  if (v.empty()) return std::unexpected(std::string("the value is empty"));
  if (v.front() == '\'') {
    std::string out;
    for (std::size_t i = 1; i < v.size(); ++i) {
      if (v[i] == '\'') {
        if (i + 1 < v.size() && v[i + 1] == '\'') {
          out.push_back('\'');
          ++i;
          continue;
        }
        if (i + 1 != v.size()) return std::unexpected(std::string("text after the closing quote"));
        return out;
      }
      out.push_back(v[i]);
    }
    return std::unexpected(std::string("the quote is not closed"));
  }
  if (v.front() == '"') {
    std::string out;
    for (std::size_t i = 1; i < v.size(); ++i) {
      const char c = v[i];
      if (c == '"') {
        if (i + 1 != v.size()) return std::unexpected(std::string("text after the closing quote"));
        return out;
      }
      if (c == '\\') {
        if (++i == v.size()) break;
        switch (v[i]) {
          case '"': case '\\': case '/': out.push_back(v[i]); break;
          case 't': out.push_back('\t'); break;
          case ' ': out.push_back(' '); break;
          default: return std::unexpected(fmt::format("the escape \\{} is not understood here", v[i]));
        }
        continue;
      }
      out.push_back(c);
    }
    return std::unexpected(std::string("the quote is not closed"));
  }
  if (v.front() == '&' || v.front() == '*' || v.front() == '!' || v.front() == '|' || v.front() == '>' ||
      v.front() == '{' || v.front() == '[') {
    return std::unexpected(fmt::format("\"{}\" is not a plain path", v));
  }
  return std::string(v);
}

// "key: value" -> (key, value); nullopt when the line is not a mapping entry.
std::optional<std::pair<std::string_view, std::string_view>> entry(std::string_view line) {
  // The key of agent.yaml is a plain word; a quoted key is taken as written without quotes.
  const auto colon = line.find(':');
  if (colon == std::string_view::npos || (colon + 1 < line.size() && line[colon + 1] != ' ' && line[colon + 1] != '\t')) {
    return std::nullopt;
  }
  std::string_view key = trim(line.substr(0, colon));
  if (key.size() >= 2 && (key.front() == '"' || key.front() == '\'') && key.back() == key.front()) key = key.substr(1, key.size() - 2);
  return std::pair{key, trim(line.substr(colon + 1))};
}

// `{socket: /x, allowed_uids: [0]}`: the value of `socket`, splitting at top-level commas.
std::expected<std::optional<std::string>, std::string> from_flow(std::string_view v) {
  if (v.size() < 2 || v.back() != '}') return std::unexpected(std::string("a flow mapping on one line is expected: {socket: PATH}"));
  v = v.substr(1, v.size() - 2);
  int depth = 0;
  char quote = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= v.size(); ++i) {
    const char c = i < v.size() ? v[i] : ',';
    if (quote != 0) {
      if (c == '\\' && quote == '"') ++i;
      else if (c == quote) quote = 0;
      continue;
    }
    if (c == '\'' || c == '"') quote = c;
    else if (c == '[' || c == '{') ++depth;
    else if (c == ']' || c == '}') --depth;
    else if (c == ',' && depth == 0) {
      auto e = entry(trim(v.substr(start, i - start)));
      if (e && e->first == "socket") {
        auto s = scalar(e->second);
        if (!s) return std::unexpected(s.error());
        return std::optional<std::string>(std::move(*s));
      }
      start = i + 1;
    }
  }
  return std::optional<std::string>();
}

}  // namespace

std::expected<std::optional<std::string>, std::string> admin_socket_from_yaml(std::string_view text) {
  const auto lines = lines_of(text);
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto& l = lines[i];
    if (l.indent != 0) continue;
    auto e = entry(l.text);
    if (!e || e->first != "admin") continue;
    auto at = [&](const std::string& what) { return fmt::format("line {}: admin: {}", l.number, what); };
    if (!e->second.empty()) {
      if (e->second.front() != '{') return std::unexpected(at("a mapping is expected"));
      auto s = from_flow(e->second);
      if (!s) return std::unexpected(at(s.error()));
      return s;
    }
    // A block mapping: the lines indented under `admin:`, keys at the first one's indentation.
    std::size_t child = 0;
    for (std::size_t j = i + 1; j < lines.size() && lines[j].indent > 0; ++j) {
      const auto& c = lines[j];
      if (child == 0) child = c.indent;
      if (c.indent != child) continue;
      auto ce = entry(c.text);
      if (!ce || ce->first != "socket") continue;
      auto s = scalar(ce->second);
      if (!s) return std::unexpected(fmt::format("line {}: admin.socket: {}", c.number, s.error()));
      return std::optional<std::string>(std::move(*s));
    }
    return std::optional<std::string>();
  }
  return std::optional<std::string>();
}

std::expected<SocketChoice, std::string> choose_socket(const std::optional<std::string>& flag, std::string_view config_path,
                                                       const std::optional<std::string>& config_text) {
  if (flag) return SocketChoice{*flag, "--socket"};
  if (config_text) {
    auto s = admin_socket_from_yaml(*config_text);
    if (!s) return std::unexpected(fmt::format("cannot read admin.socket from {}: {}; pass --socket PATH", config_path, s.error()));
    if (*s) return SocketChoice{**s, fmt::format("admin.socket of {}", config_path)};
  }
  return SocketChoice{std::string(kDefaultSocket), "the default"};
}

}  // namespace gpunode::ctl
