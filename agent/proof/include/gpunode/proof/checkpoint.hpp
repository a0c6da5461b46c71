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
  std::string first_id, head_id, head_hash;  // empty when there are no records
  bool from_genesis = true;  // the first record is aud_1 (else its prevHash is taken as given)
};

// Checks an export (JSON lines: the records, then the checkpoints) against a PEM public key file's
// text: every record's hash recomputed (store::audit_hash: the agent's own canonical JSON and
// SHA-256), each prevHash linked to the record before (64 zeros before aud_1), ids ascending; each
// checkpoint's seq a record of the export whose hash it holds, its keyId the key's thumbprint, its
// signature verified over checkpoint_message with the record's nodeId. The error is the first
// break, starting with what it is about: "aud_17: hash mismatch: stored 3fa0..., computed 9b1c...",
// "checkpoint seq 40: signature does not verify with key KEYID", "line 3: not a JSON object"; a key
// that cannot be used is an error naming `key_label`. Strings from the export are quoted as given
// (the caller escapes them for a terminal). The code: corrupt for a break (the chain or a
// checkpoint is not what was written), invalid for lines or a key that cannot be read.
error::Result<Verified> verify_export(std::string_view lines, std::string_view public_key_pem,
                                      const std::string& key_label);

}  // namespace gpunode::proof
