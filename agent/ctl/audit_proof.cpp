// `gpunodectl audit export` and `audit verify` (see audit_proof.hpp).
#include "audit_proof.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <boost/json/serialize.hpp>

#include "gpunode/config/file.hpp"
#include "gpunode/text/printable.hpp"

namespace gpunode::ctl {
namespace json = boost::json;

namespace {

constexpr std::size_t kMaxExport = std::size_t{1} << 30;  // 1 GiB: about two million records

Failure failure(std::string message) {
  return Failure{kExitProblem, fmt::format("gpunodectl: {}\n", text::printable(message)), {}};
}

Result failed(const Failure& f) {
  return Result{f.exit_code, {}, f.message};
}

// Every page of one list, its entries appended to `lines`, one JSON object a line.
std::expected<void, Failure> append_list(
    const ProofCall& call, std::string_view key,
    const std::function<Request(const std::optional<std::string>&, std::size_t)>& page, std::string& lines) {
  auto all = collect_pages(
      key, std::nullopt,
      [&](const std::optional<std::string>& token, std::size_t limit) { return call(page(token, limit)); });
  if (!all) return std::unexpected(all.error());
  const auto* list = all->doc.if_contains(key);
  if (list == nullptr || !list->is_array())
    return std::unexpected(failure(fmt::format("bad-answer: no \"{}\" list", key)));
  for (const auto& entry : list->get_array()) {
    lines += json::serialize(entry);
    lines += '\n';
  }
  return {};
}

// The export's text. The checkpoints are read first: the chain only grows, so the records read
// after them reach every checkpoint's head. Written records first, then checkpoints.
std::expected<std::string, Failure> export_text(const ProofCall& call, const std::string& node,
                                                const std::string& after) {
  std::optional<std::string> after_id, after_seq;
  if (!after.empty()) {
    after_id = after;
    after_seq = after.starts_with("aud_") ? after.substr(4) : after;  // the agent says when it is not aud_N
  }
  std::string records, checkpoints;
  auto c = append_list(
      call, "checkpoints",
      [&](const std::optional<std::string>& token, std::size_t limit) {
        return checkpoints_page(node, after_seq, limit, token);
      },
      checkpoints);
  if (!c) return std::unexpected(c.error());
  auto r = append_list(
      call, "records",
      [&](const std::optional<std::string>& token, std::size_t limit) {
        return audit_page(node, after_id, limit, token);
      },
      records);
  if (!r) return std::unexpected(r.error());
  return records + checkpoints;
}

// The node key's public PEM as the agent shows it (GET audit/checkpoints' auditKey).
std::expected<std::string, Failure> live_key(const ProofCall& call, const std::string& node) {
  auto page = call(checkpoints_page(node, std::nullopt, 1, std::nullopt));
  if (!page) return std::unexpected(page.error());
  const auto* o = page->doc.if_object();
  const auto* key = o != nullptr ? o->if_contains("auditKey") : nullptr;
  if (key == nullptr || !key->is_string())
    return std::unexpected(
        failure("bad-answer: GET audit/checkpoints has no auditKey (an agent before 0.3.0?)"));
  return std::string(key->get_string());
}

std::expected<std::string, Failure> read_input(const std::string& path, std::size_t limit,
                                               std::string_view what) {
  auto text = config::read_file(path, limit);
  if (!text)
    return std::unexpected(
        Failure{kExitUsage,
                fmt::format("gpunodectl: audit verify: cannot read {} {}: {}\n", what, text::printable(path),
                            config::read_error_text(text.error(), limit)),
                {}});
  return std::move(*text);
}

}  // namespace

void proof_arguments(CLI::App& audit, ProofArgs& a) {
  audit.require_subcommand(0, 1);
  auto* ex = audit.add_subcommand("export", "The records, then the signed checkpoints, as JSON lines");
  ex->add_option("--after", a.after, "Records after this one (aud_N), and the checkpoints after it");
  ex->add_option("--output", a.output, "Write FILE (atomically, mode 0600) instead of stdout");
  auto* ve = audit.add_subcommand(
      "verify", "Recompute the chain and check its signed checkpoints: an export, else the live agent's");
  auto* file = ve->add_option("--file", a.file, "An export (gpunodectl audit export) to check offline");
  auto* key = ve->add_option("--key", a.key, "The node's audit public key (PEM), with --file");
  file->needs(key);
  key->needs(file);
}

Result audit_export(const ProofCall& call, const std::string& node, const ProofArgs& a) {
  auto text = export_text(call, node, a.after);
  if (!text) return failed(text.error());
  if (a.output.empty()) return Result{kExitOk, std::move(*text), {}};
  if (auto w = config::write_file_atomic(a.output, *text, 0600, true); !w) {
    return failed(failure(fmt::format("audit export: cannot write {}: {}", a.output,
                                      config::read_error_text(w.error(), kMaxExport))));
  }
  return Result{kExitOk, {}, {}};
}

Result audit_verify(const ProofCall& call, const std::string& node, const ProofArgs& a, const Env& env) {
  if (!env.verify_export)
    return failed(failure("audit verify: not available (gpunode-agent-proof.so is not installed)"));
  std::string lines, key_pem, key_label;
  if (!a.file.empty()) {
    auto t = read_input(a.file, kMaxExport, "the export");
    if (!t) return failed(t.error());
    auto k = read_input(a.key, std::size_t{64} << 10, "the key");
    if (!k) return failed(k.error());
    lines = std::move(*t);
    key_pem = std::move(*k);
    key_label = a.key;
  } else {
    auto k = live_key(call, node);
    if (!k) return failed(k.error());
    auto t = export_text(call, node, {});
    if (!t) return failed(t.error());
    lines = std::move(*t);
    key_pem = std::move(*k);
    key_label = "the agent's auditKey";
  }
  auto verdict = env.verify_export(lines, key_pem, key_label);
  if (!verdict) return failed(failure(fmt::format("audit verify: {}", verdict.error().detail)));
  return Result{kExitOk, fmt::format("audit verify: {}\n", text::printable(*verdict)), {}};
}

}  // namespace gpunode::ctl
