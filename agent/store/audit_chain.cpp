// Audit hash and chain verification (see the header).
#include "gpunode/store/audit_chain.hpp"

#include <fmt/format.h>
#include <openssl/evp.h>

#include <charconv>

#include "gpunode/store/canonical_json.hpp"

namespace gpunode::store {
namespace {

constexpr std::string_view kIdPrefix = "aud_";

std::string short_hash(std::string_view h) {
  return h.size() > 16 ? fmt::format("{}...", h.substr(0, 16)) : std::string(h);
}

// SHA-256 fetched from the providers once: given EVP_sha256(), each EVP_Digest call looks the
// algorithm up again (a lock and a hash lookup per call). Never freed:
// it lives as long as the process. Thread-safe (a function-local static).
const EVP_MD* sha256_md() {
  static EVP_MD* const fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return fetched != nullptr ? fetched : EVP_sha256();
}

}  // namespace

error::Result<std::string> sha256_hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &digest_len, sha256_md(), nullptr) != 1 ||
      digest_len != 32) {
    return error::fail(error::Errc::internal, "SHA-256 failed (OpenSSL EVP_Digest)");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (unsigned int i = 0; i < digest_len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0x0f]);
  }
  return out;
}

error::Result<std::string> audit_hash(const boost::json::object& record) {
  auto text = canonical_json(record, std::string_view("hash"));
  if (!text) return std::unexpected(std::move(text.error()));
  return sha256_hex(*text);
}

error::Result<void> seal_audit_record(boost::json::object& record, std::string_view prev_hash) {
  record["prevHash"] = prev_hash;
  auto h = audit_hash(record);
  if (!h) return std::unexpected(std::move(h.error()));
  record["hash"] = *h;
  return {};
}

error::Result<std::uint64_t> parse_audit_id(std::string_view id) {
  if (!id.starts_with(kIdPrefix))
    return error::fail(error::Errc::invalid, fmt::format("id \"{}\" is not aud_N", id));
  const auto digits = id.substr(kIdPrefix.size());
  if (digits.empty() || digits.front() == '0') {
    return error::fail(error::Errc::invalid,
                       fmt::format("id \"{}\" is not aud_N with N a decimal from 1", id));
  }
  std::uint64_t n = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc{} || end != digits.data() + digits.size()) {
    return error::fail(error::Errc::invalid,
                       fmt::format("id \"{}\" is not aud_N with N a decimal from 1", id));
  }
  return n;
}

std::string format_audit_id(std::uint64_t sequence) {
  return fmt::format("{}{}", kIdPrefix, sequence);
}

std::expected<void, ChainBreak> verify_chain(const std::vector<boost::json::object>& records,
                                             std::string_view first_prev_hash) {
  std::string prev_hash(first_prev_hash);
  std::uint64_t prev_seq = 0;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const auto& r = records[i];
    ChainBreak brk{i, "", ""};
    const auto* id = r.if_contains("id");
    if (id == nullptr || !id->is_string()) {
      brk.reason = "record has no string \"id\"";
      return std::unexpected(std::move(brk));
    }
    brk.record_id = std::string(id->get_string());
    auto seq = parse_audit_id(brk.record_id);
    if (!seq) {
      brk.reason = std::move(seq.error().detail);
      return std::unexpected(std::move(brk));
    }
    if (i > 0 && *seq != prev_seq + 1) {
      brk.reason = fmt::format("ids jump from {} to {}", format_audit_id(prev_seq), brk.record_id);
      return std::unexpected(std::move(brk));
    }
    const auto* stored = r.if_contains("hash");
    const auto* prev = r.if_contains("prevHash");
    if (stored == nullptr || !stored->is_string()) {
      brk.reason = "record has no string \"hash\"";
      return std::unexpected(std::move(brk));
    }
    if (prev == nullptr || !prev->is_string()) {
      brk.reason = "record has no string \"prevHash\"";
      return std::unexpected(std::move(brk));
    }
    if (prev->get_string() != prev_hash) {
      brk.reason = i == 0 ? fmt::format("prevHash {} is not the previous record's hash {}",
                                        short_hash(prev->get_string()), short_hash(prev_hash))
                          : fmt::format("prevHash {} does not link to {} (its hash {})",
                                        short_hash(prev->get_string()), format_audit_id(prev_seq),
                                        short_hash(prev_hash));
      return std::unexpected(std::move(brk));
    }
    auto computed = audit_hash(r);
    if (!computed) {
      brk.reason = fmt::format("cannot hash the record: {}", computed.error().detail);
      return std::unexpected(std::move(brk));
    }
    if (stored->get_string() != *computed) {
      brk.reason = fmt::format("hash mismatch: stored {}, computed {}", short_hash(stored->get_string()),
                               short_hash(*computed));
      return std::unexpected(std::move(brk));
    }
    prev_hash = *computed;
    prev_seq = *seq;
  }
  return {};
}

}  // namespace gpunode::store
