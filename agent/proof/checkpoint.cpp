// Signed checkpoints (see checkpoint.hpp).
#include "gpunode/proof/checkpoint.hpp"

#include <fmt/format.h>

#include "gpunode/auth/jwk.hpp"

namespace gpunode::proof {

std::string checkpoint_message(std::string_view node_id, std::int64_t seq, std::string_view hash,
                               std::string_view at) {
  return fmt::format("{}\n{}\n{}\n{}", node_id, seq, hash, at);
}

error::Result<boost::json::object> make_checkpoint(const NodeKey& key, std::string_view node_id,
                                                   std::int64_t seq, std::string_view hash,
                                                   std::string_view at) {
  auto sig = key.sign(checkpoint_message(node_id, seq, hash, at));
  if (!sig) return std::unexpected(sig.error());
  return boost::json::object{{"seq", seq},
                             {"hash", hash},
                             {"at", at},
                             {"keyId", key.key_id()},
                             {"signature", auth::base64url(*sig)}};
}

bool is_checkpoint(const boost::json::object& line) {
  return line.contains("signature") && line.contains("keyId") && !line.contains("id");
}

}  // namespace gpunode::proof
