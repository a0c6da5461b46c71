// `gpunodectl audit export` and `audit verify` (see audit_proof.hpp).
#include "audit_proof.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <boost/json/serialize.hpp>
#include <charconv>

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

Failure usage(std::string message) {
  return Failure{kExitUsage, fmt::format("gpunodectl: {}\n", text::printable(message)), {}};
}

// aud_N's N (from 1).
std::optional<std::int64_t> audit_seq(std::string_view id) {
  if (!id.starts_with("aud_") || id.size() == 4 || id[4] == '0') return std::nullopt;
  std::int64_t n = 0;
  const auto* end = id.data() + id.size();
  const auto [p, ec] = std::from_chars(id.data() + 4, end, n);
  if (ec != std::errc{} || p != end || n < 1) return std::nullopt;
  return n;
}

// A list entry's place in the chain: a record's aud_N, a checkpoint's seq.
std::optional<std::int64_t> seq_of(const json::value& entry) {
  const auto* o = entry.if_object();
  if (o == nullptr) return std::nullopt;
  if (const auto* seq = o->if_contains("seq"); seq != nullptr && seq->is_int64()) return seq->get_int64();
  if (const auto* id = o->if_contains("id"); id != nullptr && id->is_string())
    return audit_seq(id->get_string());
  return std::nullopt;
}

// Every page of one list; its entries up to seq `upto` (the signed head) appended to `lines`, one
// JSON object a line. Entries past it are later than the export's checkpoint: the next export's.
std::expected<std::vector<std::int64_t>, Failure> append_list(
    const ProofCall& call, std::string_view key,
    const std::function<Request(const std::optional<std::string>&, std::size_t)>& page, std::int64_t upto,
    std::string& lines) {
  auto all = collect_pages(
      key, std::nullopt,
      [&](const std::optional<std::string>& token, std::size_t limit) { return call(page(token, limit)); });
  if (!all) return std::unexpected(all.error());
  const auto* list = all->doc.if_contains(key);
  if (list == nullptr || !list->is_array())
    return std::unexpected(failure(fmt::format("bad-answer: no \"{}\" list", key)));
  std::vector<std::int64_t> seqs;
  for (const auto& entry : list->get_array()) {
    const auto seq = seq_of(entry);
    if (!seq) return std::unexpected(failure(fmt::format("bad-answer: a {} entry without its seq", key)));
    if (*seq > upto) continue;
    seqs.push_back(*seq);
    lines += json::serialize(entry);
    lines += '\n';
  }
  return seqs;
}

// The agent signs the head first (POST /v1/admin/audit/checkpoint): its seq, what the export reads
// up to, so that it ends signed.
std::expected<std::int64_t, Failure> sign_head(const ProofCall& call) {
  auto answer = call(checkpoint_request());
  if (!answer) return std::unexpected(answer.error());
  const auto seq = seq_of(answer->doc);
  if (!seq || *seq < 1)
    return std::unexpected(failure("bad-answer: POST /v1/admin/audit/checkpoint answered no checkpoint seq"));
  return *seq;
}

// The export's text: the records up to the signed head (after `after` when given), then the
// checkpoints up to it (from the one at `after`, which anchors the records after it).
std::expected<std::string, Failure> export_text(const ProofCall& call, const std::string& node,
                                                const std::string& after) {
  std::optional<std::int64_t> from;
  if (!after.empty()) {
    from = audit_seq(after);
    if (!from)
      return std::unexpected(usage(fmt::format("audit export: --after {}: not an audit id (aud_N)", after)));
  }
  auto head = sign_head(call);
  if (!head) return std::unexpected(head.error());
  if (from && *from >= *head)
    return std::unexpected(
        failure(fmt::format("audit export: nothing after {}: the chain's head is aud_{}", after, *head)));
  const std::optional<std::string> cp_after =
      from ? std::optional<std::string>(std::to_string(*from - 1)) : std::nullopt;
  const std::optional<std::string> rec_after = from ? std::optional<std::string>(after) : std::nullopt;
  std::string records, checkpoints;
  auto c = append_list(
      call, "checkpoints",
      [&](const std::optional<std::string>& token, std::size_t limit) {
        return checkpoints_page(node, cp_after, limit, token);
      },
      *head, checkpoints);
  if (!c) return std::unexpected(c.error());
  if (from && (c->empty() || c->front() != *from)) {
    return std::unexpected(failure(fmt::format(
        "audit export: no checkpoint signs {}, so the records after it could not be proven; export from the "
        "start, or --after a signed record (the next is aud_{})",
        after, c->empty() ? *head : c->front())));
  }
  auto r = append_list(
      call, "records",
      [&](const std::optional<std::string>& token, std::size_t limit) {
        return audit_page(node, rec_after, limit, token);
      },
      *head, records);
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
  ex->add_option("--after", a.after,
                 "Records after this one (aud_N, a signed record), and the checkpoints from it on");
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
