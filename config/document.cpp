// Parsing agent.yaml's text into one YAML document (see document.hpp).
#include "document.hpp"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <sstream>
#include <string>

#include "gpunode/text/printable.hpp"
#include "text.hpp"

namespace gpunode::config::document {
namespace {

// What one pass of yaml-cpp's event parser over the whole stream shows, beyond the first
// document's tree. It is taken before YAML::Load because of two yaml-cpp 0.7 defects:
// - a ',' outside any flow collection is never consumed: each further document is a null at the
//   same place, so YAML::LoadAll loops and allocates forever (jbeder/yaml-cpp#1040, fixed by
//   #1319 after 0.7): a null document at the same mark as the one before means "stuck";
// - a quoted scalar that is never closed runs to the end of the file, so `issuer: "https://x`
//   silently swallows every key after it. Such a scalar is the last one of the stream.
struct StreamFacts {
  std::optional<YAML::Mark> stuck;            // where the parser stopped making progress
  std::optional<YAML::Mark> last_scalar;      // the start of the stream's last scalar
  std::optional<YAML::Mark> second_document;  // the start of the second document with content
};

class StreamScan final : public YAML::EventHandler {
 public:
  struct First {
    YAML::Mark mark;
    bool content = false;  // anything but a lone null
  };

  void start_document() { first_.reset(); }
  [[nodiscard]] const std::optional<First>& first() const { return first_; }
  [[nodiscard]] const std::optional<YAML::Mark>& last_scalar() const { return last_scalar_; }

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { note(mark, false); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { note(mark, true); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override {
    note(mark, true);
    last_scalar_ = mark;
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    note(mark, true);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    note(mark, true);
  }
  void OnMapEnd() override {}

 private:
  void note(const YAML::Mark& mark, bool content) {
    if (!first_) first_ = First{mark, content};
  }

  std::optional<First> first_;
  std::optional<YAML::Mark> last_scalar_;
};

// Throws what yaml-cpp throws for a syntax error.
StreamFacts scan_stream(std::string_view source) {
  std::istringstream in{std::string(source)};
  YAML::Parser parser(in);
  StreamScan scan;
  StreamFacts facts;
  int with_content = 0;
  constexpr int kNone = -2;  // a mark's pos is -1 at the least
  int previous_null = kNone;
  // Every document but a stuck one consumes input, so this bound is never reached otherwise.
  for (std::size_t n = 0; n <= source.size() + 1; ++n) {
    scan.start_document();
    if (!parser.HandleNextDocument(scan)) break;
    const auto& first = scan.first();
    if (first && first->content) {
      if (++with_content == 2) facts.second_document = first->mark;
      previous_null = kNone;
      continue;
    }
    const int at = first ? first->mark.pos : -1;
    if (previous_null == at) {
      facts.stuck = first ? first->mark : YAML::Mark();
      break;
    }
    previous_null = at;
  }
  facts.last_scalar = scan.last_scalar();
  return facts;
}

// The byte offset in `source` of a yaml-cpp mark, whose pos does not count a byte order mark.
std::size_t offset_of(std::string_view source, const YAML::Mark& mark) {
  const std::size_t bom = source.starts_with("\xef\xbb\xbf") ? 3 : 0;
  return bom + static_cast<std::size_t>(std::max(mark.pos, 0));
}

// Whether the quoted scalar opening at source[open] has its closing quote.
bool quote_closes(std::string_view source, std::size_t open) {
  const char quote = source[open];
  for (std::size_t i = open + 1; i < source.size(); ++i) {
    if (quote == '"' && source[i] == '\\') {
      ++i;  // an escape: the next character cannot close
    } else if (source[i] == quote) {
      if (quote == '\'' && i + 1 < source.size() && source[i + 1] == '\'') {
        ++i;  // '' is a quote inside single quotes
      } else {
        return true;
      }
    }
  }
  return false;
}

bool is_unclosed_quote(std::string_view source, const YAML::Mark& mark) {
  const std::size_t open = offset_of(source, mark);
  if (open >= source.size() || (source[open] != '"' && source[open] != '\'')) return false;
  return !quote_closes(source, open);
}

std::string unexpected_text(std::string_view source, const YAML::Mark& mark) {
  const std::size_t at = offset_of(source, mark);
  if (at >= source.size()) return "syntax error: unexpected end of file";
  const unsigned char c = static_cast<unsigned char>(source[at]);
  if (c < 0x21 || c > 0x7e) return "syntax error: unexpected character";
  return "syntax error: unexpected " + text::quote(source.substr(at, 1));
}

void report_syntax_error(std::string_view source, const YAML::ParserException& e, Problems& problems) {
  const Pos pos = pos_of(e.mark);
  // yaml-cpp words a tab in the indentation as "illegal map value" and the like: say what it is.
  if (const auto tab = text::indentation_tab(source, pos.line)) {
    problems.add({pos.line, *tab}, "syntax error: tab in indentation (YAML indents with spaces)");
    return;
  }
  problems.add(pos, "syntax error: " + gpunode::text::printable(e.msg, gpunode::text::Escapes::c_string));
}

}  // namespace

std::optional<YAML::Node> parse(std::string_view source, Problems& problems) {
  try {
    const StreamFacts facts = scan_stream(source);
    if (facts.stuck) {
      problems.add(pos_of(*facts.stuck), unexpected_text(source, *facts.stuck));
      return std::nullopt;
    }
    if (facts.last_scalar && is_unclosed_quote(source, *facts.last_scalar)) {
      problems.add(pos_of(*facts.last_scalar), "syntax error: this quoted string is never closed");
      return std::nullopt;
    }
    if (facts.second_document) {
      problems.add(pos_of(*facts.second_document),
                   "a config file holds one YAML document; this is a second one");
    }
    return YAML::Load(std::string(source));  // one document: never the loop of LoadAll
  } catch (const YAML::DeepRecursion& e) {
    problems.add(pos_of(e.mark), "syntax error: nesting is too deep");
  } catch (const YAML::ParserException& e) {
    report_syntax_error(source, e, problems);
  } catch (const std::exception& e) {  // yaml-cpp's other exceptions, std::bad_alloc
    problems.add(kNowhere,
                 "cannot parse: " + gpunode::text::printable(e.what(), gpunode::text::Escapes::c_string));
  }
  return std::nullopt;
}

}  // namespace gpunode::config::document
