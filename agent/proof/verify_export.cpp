// The check of an export (see checkpoint.hpp): the chain by store::verify_chain (the agent's own
// hash), then each checkpoint against the records and the key.
#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/evp.h>

#include <map>
#include <memory>
#include <vector>

#include "gpunode/auth/jwk.hpp"
#include "gpunode/json/strict.hpp"
#include "gpunode/proof/checkpoint.hpp"
#include "gpunode/store/audit_chain.hpp"

namespace gpunode::proof {
namespace {
namespace json = boost::json;

struct Lines {
  std::vector<json::object> records, checkpoints;
};

// An export or key that is not what it must be (not JSON lines, not one Ed25519 key): invalid.
std::unexpected<error::Error> malformed(std::string why) {
  return error::fail(error::Errc::invalid, std::move(why));
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

// One checkpoint against the records (by seq) and the key; the break's text, if any.
std::optional<std::string> check_checkpoint(const json::object& cp, std::size_t n,
                                            const std::map<std::int64_t, const json::object*>& by_seq,
                                            const auth::PublicKey& key, std::int64_t& last_seq) {
  const auto* seq_v = cp.if_contains("seq");
  const auto seq = seq_v != nullptr && seq_v->is_int64() ? seq_v->get_int64() : std::int64_t{0};
  if (seq < 1) return fmt::format("checkpoint {}: \"seq\" is not an integer from 1", n);
  const auto where = fmt::format("checkpoint seq {}", seq);
  const auto hash = string_at(cp, "hash"), at = string_at(cp, "at");
  const auto key_id = string_at(cp, "keyId"), sig = string_at(cp, "signature");
  if (hash.empty() || at.empty() || key_id.empty() || sig.empty())
    return fmt::format("{}: \"hash\", \"at\", \"keyId\" and \"signature\" must be non-empty strings", where);
  if (seq <= last_seq) return fmt::format("{}: not after checkpoint seq {}", where, last_seq);
  last_seq = seq;
  const auto record = by_seq.find(seq);
  if (record == by_seq.end())
    return fmt::format("{}: no record {} in the export", where,
                       store::format_audit_id(static_cast<std::uint64_t>(seq)));
  const auto record_hash = string_at(*record->second, "hash");
  if (hash != record_hash) {
    return fmt::format("{}: hash differs from {}'s: checkpoint {}, record {}", where,
                       store::format_audit_id(static_cast<std::uint64_t>(seq)), short_hash(hash),
                       short_hash(record_hash));
  }
  if (key_id != key.thumbprint)
    return fmt::format("{}: signed by key {}, not by the given key {}", where, key_id, key.thumbprint);
  const auto raw = auth::from_base64url(sig);
  const auto message = checkpoint_message(string_at(*record->second, "nodeId"), seq, hash, at);
  if (!raw || raw->size() != 64 || !signature_verifies(key, *raw, message))
    return fmt::format("{}: signature does not verify with key {}", where, key.thumbprint);
  return std::nullopt;
}

}  // namespace

error::Result<Verified> verify_export(std::string_view text, std::string_view public_key_pem,
                                      const std::string& key_label) {
  auto key = read_key(public_key_pem, key_label);
  if (!key) return std::unexpected(std::move(key.error()));
  auto lines = split(text);
  if (!lines) return std::unexpected(std::move(lines.error()));
  Verified out;
  out.records = lines->records.size();
  out.checkpoints = lines->checkpoints.size();
  std::string first_prev(store::kGenesisPrevHash);
  if (!lines->records.empty()) {
    out.first_id = string_at(lines->records.front(), "id");
    out.from_genesis = out.first_id == "aud_1";
    // A slice (export --after): the chain is checked from its first record's prevHash, as given.
    if (!out.from_genesis) first_prev = string_at(lines->records.front(), "prevHash");
  }
  if (auto whole = store::verify_chain(lines->records, first_prev); !whole) {
    const auto& b = whole.error();
    return error::fail(
        error::Errc::corrupt,
        fmt::format("{}: {}", b.record_id.empty() ? fmt::format("record {}", b.index + 1) : b.record_id,
                    b.reason));
  }
  std::map<std::int64_t, const json::object*> by_seq;
  for (const auto& r : lines->records) {
    if (auto seq = store::parse_audit_id(string_at(r, "id")))
      by_seq.emplace(static_cast<std::int64_t>(*seq), &r);
  }
  if (!lines->records.empty()) {
    out.head_id = string_at(lines->records.back(), "id");
    out.head_hash = string_at(lines->records.back(), "hash");
  }
  std::int64_t last_seq = 0;
  std::size_t n = 0;
  for (const auto& cp : lines->checkpoints) {
    if (auto broken = check_checkpoint(cp, ++n, by_seq, *key, last_seq))
      return error::fail(error::Errc::corrupt, std::move(*broken));
  }
  return out;
}

}  // namespace gpunode::proof
