// gpunode/proof/checkpoint.hpp: signed checkpoints of the audit chain (CONTRACT §12), and the check
// of an export (`gpunodectl audit verify`).
//
//   checkpoint = {"seq": SEQ, "hash": HASH, "at": AT, "keyId": KEYID, "signature": SIG}
//   SIG = base64url (no padding) of Ed25519 over the UTF-8 of "NODE_ID\nSEQ\nHASH\nAT"
// SEQ is the head record's sequence number (aud_SEQ) in decimal, HASH its hash, AT the RFC 3339
// UTC time the agent writes everywhere (2027-01-31T00:00:00Z), NODE_ID the node's id (also each
// record's nodeId).
#pragma once

#include <boost/json/object.hpp>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>

#include "gpunode/error/error.hpp"
#include "gpunode/proof/node_key.hpp"

namespace gpunode::proof {

// The exact bytes a checkpoint's signature is over.
std::string checkpoint_message(std::string_view node_id, std::int64_t seq, std::string_view hash,
                               std::string_view at);

// The checkpoint of the head (seq, hash) at `at`, signed with `key`.
error::Result<boost::json::object> make_checkpoint(const NodeKey& key, std::string_view node_id,
                                                   std::int64_t seq, std::string_view hash,
                                                   std::string_view at);

// Whether a JSON line of an export is a checkpoint: it has "signature" and "keyId" and no "id"
// (a record always has an "id", a checkpoint never).
bool is_checkpoint(const boost::json::object& line);

// What a whole export holds.
struct Verified {
  std::size_t records = 0, checkpoints = 0;
  std::string first_id, head_id, head_hash;
  std::string key_id;  // the given key's thumbprint, which every checkpoint is signed by
  // An export made with --after ID: the record (ID's seq) whose signed checkpoint anchors it. The
  // records up to it are not in the export, and the verdict says they were not checked.
  std::optional<std::uint64_t> anchor;
};

// Checks an export (JSON lines: the records, then the checkpoints) against a PEM public key file's
// text, failing closed (CONTRACT §12). It is whole only when all of these hold, checked in this
// order, the first that does not being the error:
//   - at least one record ("no records: ...");
//   - it starts at aud_1 (prevHash 64 zeros), or after ID where a checkpoint at ID in the export is
//     signed by the key and the first record's prevHash is the hash it signed ("the export does not
//     start at aud_1 (its first record is aud_4), and no signed checkpoint at aud_3 anchors it...");
//   - ids one after another ("aud_5: ids jump from aud_1 to aud_5"), every hash recomputed
//     (store::audit_hash: the agent's own canonical JSON and SHA-256) and every prevHash linked
//     ("aud_17: hash mismatch: stored 3fa0..., computed 9b1c...");
//   - each checkpoint (seqs ascending) at a record of the export whose hash it holds, its keyId
//     the key's thumbprint, its signature verified over checkpoint_message with the records' nodeId
//     ("checkpoint seq 40: signature does not verify with key KEYID");
//   - a checkpoint at the last record ("no checkpoint covers aud_5..aud_6: ...").
// Lines that are not JSON objects are "line 3: not a JSON object"; a key that cannot be used is an
// error naming `key_label`. Strings from the export are quoted as given (the caller escapes them
// for a terminal). The code: corrupt for anything that is not whole, invalid for lines or a key
// that cannot be read.
error::Result<Verified> verify_export(std::string_view lines, std::string_view public_key_pem,
                                      const std::string& key_label);

// The verdict in words, starting "whole: ", naming what was checked and what was not (the records
// before an anchor).
std::string describe(const Verified& verified);

}  // namespace gpunode::proof
