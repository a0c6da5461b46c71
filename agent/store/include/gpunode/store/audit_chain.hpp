// gpunode/store/audit_chain.hpp: the audit record's hash and the chain rule (CONTRACT §4, §7).
//
//   hash = lowercase hex SHA-256 of canonical_json(record without its "hash" key)
//   the first record's prevHash is kGenesisPrevHash (64 zeros), every later one's is the hash of the
//   record before it; ids are "aud_N" (N decimal from 1, no leading zeros), each the one after the
//   record before it (aud_N, aud_N+1, ...): the agent numbers them so, and a gap is a record gone.
#pragma once

#include <boost/json/object.hpp>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/error/error.hpp"

namespace gpunode::store {

inline constexpr std::string_view kGenesisPrevHash =
    "0000000000000000000000000000000000000000000000000000000000000000";

// Lowercase hex SHA-256 of `bytes` (OpenSSL). Fails only if OpenSSL does.
error::Result<std::string> sha256_hex(std::string_view bytes);

// The record's hash. A "hash" key, if the record has one, is left out (so a stored record can be
// checked as is); "prevHash" is part of what is hashed. Errors are canonical_json's (a double,
// invalid UTF-8), naming the JSON path.
error::Result<std::string> audit_hash(const boost::json::object& record);

// Sets record["prevHash"] = prev_hash and record["hash"] = its hash: how a record joins the chain.
error::Result<void> seal_audit_record(boost::json::object& record, std::string_view prev_hash);

// "aud_42" -> 42; nullopt-like error for anything else ("aud_0", "aud_007", "aud_", "aud_-1", "x").
error::Result<std::uint64_t> parse_audit_id(std::string_view id);
std::string format_audit_id(std::uint64_t sequence);

struct ChainBreak {
  std::size_t index = 0;  // position in the list given to verify_chain
  std::string record_id;  // the record's "id" as given ("" when it has none or it is not a string)
  std::string reason;     // e.g. "hash mismatch: stored 3f..., computed 9a..."
};

// Checks records in order, starting from `first_prev_hash` (kGenesisPrevHash for the whole chain;
// the hash of the record before the first given one for a slice). Reports the first bad record:
// no string id / not aud_N / not the id after the one before ("ids jump from aud_3 to aud_5"), no
// "hash" or "prevHash" string, prevHash not the previous record's hash, hash not the record's hash.
// Where the chain must start (aud_1, or a signed anchor) is the caller's rule (proof::verify_export).
// An empty list is a valid chain.
std::expected<void, ChainBreak> verify_chain(const std::vector<boost::json::object>& records,
                                             std::string_view first_prev_hash = kGenesisPrevHash);

}  // namespace gpunode::store
