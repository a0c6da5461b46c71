// The check of an export (see checkpoint.hpp). It fails closed: "whole" needs records, the ids one
// after another from where an export must start (aud_1, or the record after a signed anchor), the
// chain recomputed (store::verify_chain, the agent's own hash), every checkpoint's record and
// signature, and a checkpoint at the last record. Whatever is missing is the refusal, by name.
#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/evp.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "gpunode/auth/jwk.hpp"
#include "gpunode/json/strict.hpp"
#include "gpunode/proof/checkpoint.hpp"
#include "gpunode/store/audit_chain.hpp"

namespace gpunode::proof {
namespace {
namespace json = boost::json;
using store::format_audit_id;

struct Lines {
  std::vector<json::object> records, checkpoints;
};

// An export or key that is not what it must be (not JSON lines, not one Ed25519 key): invalid.
std::unexpected<error::Error> malformed(std::string why) {
  return error::fail(error::Errc::invalid, std::move(why));
}
// What was written is not whole: corrupt.
std::unexpected<error::Error> broken(std::string why) {
  return error::fail(error::Errc::corrupt, std::move(why));
}

// The export's lines, records and checkpoints apart (records first, then checkpoints).
error::Result<Lines> split(std::string_view text) {
  Lines out;
  std::size_t line_no = 0;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    const auto line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (line.empty()) continue;
    auto v = gpunode::json::parse_strict(line);
    if (!v) return malformed(fmt::format("line {}: not JSON: {}", line_no, v.error().to_string()));
    auto* o = v->if_object();
    if (o == nullptr) return malformed(fmt::format("line {}: not a JSON object", line_no));
    if (is_checkpoint(*o)) {
      out.checkpoints.push_back(std::move(*o));
    } else if (o->contains("id")) {
      if (!out.checkpoints.empty())
        return malformed(fmt::format("line {}: an audit record after the checkpoints", line_no));
      out.records.push_back(std::move(*o));
    } else {
      return malformed(fmt::format(
          "line {}: neither an audit record (no \"id\") nor a checkpoint (no \"keyId\" and \"signature\")",
          line_no));
    }
  }
  return out;
}

std::string short_hash(std::string_view h) {
  return h.size() > 16 ? fmt::format("{}...", h.substr(0, 16)) : std::string(h);
}

std::string_view string_at(const json::object& o, std::string_view key) {
  const auto* v = o.if_contains(key);
  return v != nullptr && v->is_string() ? std::string_view(v->get_string()) : std::string_view();
}

// The one Ed25519 public key of a PEM text.
error::Result<auth::PublicKey> read_key(std::string_view pem, const std::string& label) {
  auto keys = auth::public_keys_from_pem(pem, label);
  if (!keys) return std::unexpected(std::move(keys.error()));
  if (keys->size() != 1)
    return malformed(fmt::format("{}: holds {} keys; give the node's one audit key", label, keys->size()));
  if (!keys->front().ed25519)
    return malformed(fmt::format("{}: a P-256 key; audit checkpoints are signed with Ed25519", label));
  return std::move(keys->front());
}

bool signature_verifies(const auth::PublicKey& key, std::string_view signature, std::string_view message) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  const bool ok =
      ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.pkey.get()) == 1 &&
      EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                       reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  ERR_clear_error();
  return ok;
}

// A checkpoint line's fields (views into the line).
struct Checkpoint {
  std::int64_t seq = 0;
  std::string_view hash, at, key_id, signature;
  std::string where() const { return fmt::format("checkpoint seq {}", seq); }
};

// The checkpoints as given, each with its fields, seqs strictly ascending.
error::Result<std::vector<Checkpoint>> read_checkpoints(const std::vector<json::object>& lines) {
  std::vector<Checkpoint> out;
  for (std::size_t n = 1; n <= lines.size(); ++n) {
    const auto& o = lines[n - 1];
    const auto* seq = o.if_contains("seq");
    Checkpoint cp{seq != nullptr && seq->is_int64() ? seq->get_int64() : std::int64_t{0},
                  string_at(o, "hash"), string_at(o, "at"), string_at(o, "keyId"), string_at(o, "signature")};
    if (cp.seq < 1) return broken(fmt::format("checkpoint {}: \"seq\" is not an integer from 1", n));
    if (cp.hash.empty() || cp.at.empty() || cp.key_id.empty() || cp.signature.empty())
      return broken(fmt::format("{}: \"hash\", \"at\", \"keyId\" and \"signature\" must be non-empty strings",
                                cp.where()));
    if (!out.empty() && cp.seq <= out.back().seq)
      return broken(fmt::format("{}: not after checkpoint seq {}", cp.where(), out.back().seq));
    out.push_back(cp);
  }
  return out;
}

// That `cp` is signed by `key` over NODE_ID\nSEQ\nHASH\nAT; corrupt with the break's text, if not.
error::Result<void> signed_by(const Checkpoint& cp, std::string_view node_id, const auth::PublicKey& key) {
  if (cp.key_id != key.thumbprint)
    return broken(
        fmt::format("{}: signed by key {}, not by the given key {}", cp.where(), cp.key_id, key.thumbprint));
  const auto raw = auth::from_base64url(cp.signature);
  const auto message = checkpoint_message(node_id, cp.seq, cp.hash, cp.at);
  if (!raw || raw->size() != 64 || !signature_verifies(key, *raw, message))
    return broken(fmt::format("{}: signature does not verify with key {}", cp.where(), key.thumbprint));
  return {};
}

// Where the records must start: aud_1 after 64 zeros, or (an export made with --after ID) the record
// after ID, after the hash a checkpoint at ID signed. The prevHash the first record must carry.
error::Result<std::string> start_of(std::uint64_t first, const std::vector<Checkpoint>& cps,
                                    std::string_view node_id, const auth::PublicKey& key, Verified& out) {
  if (first == 1) return std::string(store::kGenesisPrevHash);
  const auto anchor = static_cast<std::int64_t>(first - 1);
  const auto at =
      std::find_if(cps.begin(), cps.end(), [&](const Checkpoint& cp) { return cp.seq == anchor; });
  if (at == cps.end()) {
    return broken(fmt::format(
        "the export does not start at aud_1 (its first record is {}), and no signed checkpoint at {} anchors "
        "it: an export made with --after starts after a checkpoint's record, and carries that checkpoint",
        format_audit_id(first), format_audit_id(first - 1)));
  }
  if (auto ok = signed_by(*at, node_id, key); !ok) return std::unexpected(std::move(ok.error()));
  out.anchor = first - 1;
  return std::string(at->hash);
}

// Each checkpoint (but the anchor, checked by start_of) against the record at its seq and the key.
error::Result<void> check_checkpoints(const std::vector<Checkpoint>& cps,
                                      const std::vector<json::object>& records, std::uint64_t first,
                                      std::string_view node_id, const auth::PublicKey& key,
                                      const Verified& out) {
  const auto last = first + records.size() - 1;
  for (const auto& cp : cps) {
    const auto seq = static_cast<std::uint64_t>(cp.seq);
    if (out.anchor && seq == *out.anchor) continue;
    if (seq < first || seq > last)
      return broken(fmt::format("{}: no record {} in the export", cp.where(), format_audit_id(seq)));
    const auto record_hash = string_at(records[seq - first], "hash");
    if (cp.hash != record_hash) {
      return broken(fmt::format("{}: hash differs from {}'s: checkpoint {}, record {}", cp.where(),
                                format_audit_id(seq), short_hash(cp.hash), short_hash(record_hash)));
    }
    if (auto ok = signed_by(cp, node_id, key); !ok) return std::unexpected(std::move(ok.error()));
  }
  return {};
}

}  // namespace

error::Result<Verified> verify_export(std::string_view text, std::string_view public_key_pem,
                                      const std::string& key_label) {
  auto key = read_key(public_key_pem, key_label);
  if (!key) return std::unexpected(std::move(key.error()));
  auto lines = split(text);
  if (!lines) return std::unexpected(std::move(lines.error()));
  const auto& records = lines->records;
  if (records.empty())
    return broken(lines->checkpoints.empty() ? "no records: the export is empty"
                                             : "no records: the export holds only checkpoints");
  Verified out;
  out.records = records.size();
  out.checkpoints = lines->checkpoints.size();
  out.key_id = key->thumbprint;
  out.first_id = string_at(records.front(), "id");
  const auto first = store::parse_audit_id(out.first_id);
  if (!first) return broken(fmt::format("record 1: {}", first.error().detail));
  // The node id every signature is over: the records'. Each record's own is part of its hash, so the
  // chain, once proven, says it is theirs.
  const auto node_id = string_at(records.front(), "nodeId");
  auto cps = read_checkpoints(lines->checkpoints);
  if (!cps) return std::unexpected(std::move(cps.error()));
  auto first_prev = start_of(*first, *cps, node_id, *key, out);
  if (!first_prev) return std::unexpected(std::move(first_prev.error()));
  if (auto whole = store::verify_chain(records, *first_prev); !whole) {
    const auto& b = whole.error();
    return broken(fmt::format(
        "{}: {}", b.record_id.empty() ? fmt::format("record {}", b.index + 1) : b.record_id, b.reason));
  }
  if (auto ok = check_checkpoints(*cps, records, *first, node_id, *key, out); !ok)
    return std::unexpected(std::move(ok.error()));
  const auto last = *first + records.size() - 1;
  const auto signed_to = cps->empty() ? std::uint64_t{0} : static_cast<std::uint64_t>(cps->back().seq);
  if (signed_to < last) {
    return broken(
        fmt::format("no checkpoint covers {}..{}: nothing signed says they were written by the agent",
                    format_audit_id(std::max(signed_to + 1, *first)), format_audit_id(last)));
  }
  out.head_id = string_at(records.back(), "id");
  out.head_hash = string_at(records.back(), "hash");
  return out;
}

std::string describe(const Verified& v) {
  const auto from = v.anchor ? fmt::format(
                                   "after the signed checkpoint at {} (the records up to it are not in this "
                                   "export and were not checked here)",
                                   format_audit_id(*v.anchor))
                             : std::string("from the chain's first record");
  return fmt::format(
      "whole: {} record{}, {} to {} {}, every hash recomputed and linked; {} checkpoint{} "
      "verified with key {}, the last at the head {} {}",
      v.records, v.records == 1 ? "" : "s", v.first_id, v.head_id, from, v.checkpoints,
      v.checkpoints == 1 ? "" : "s", v.key_id, v.head_id, v.head_hash);
}

}  // namespace gpunode::proof
