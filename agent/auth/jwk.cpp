// gpunode/auth/jwk.hpp over keys.cpp's functions (one implementation of each).
#include "gpunode/auth/jwk.hpp"

#include "keys.hpp"

namespace gpunode::auth {

std::string base64url(std::string_view bytes) {
  return detail::b64url_encode(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
}

std::optional<std::string> from_base64url(std::string_view text) {
  return detail::b64url_decode(text);
}

error::Result<std::string> jwk_thumbprint(EVP_PKEY* key) {
  if (EVP_PKEY_is_a(key, "ED25519") == 1) return detail::ed25519_thumbprint(key);
  if (EVP_PKEY_is_a(key, "EC") == 1) return detail::p256_thumbprint(key);
  return error::fail(error::Errc::invalid, "a thumbprint is taken of an Ed25519 or P-256 key only");
}

error::Result<std::vector<PublicKey>> public_keys_from_pem(std::string_view text, const std::string& label) {
  auto keys = detail::load_pem(text, label);
  if (!keys) return std::unexpected(std::move(keys.error()));
  std::vector<PublicKey> out;
  for (auto& k : *keys)
    out.push_back({std::move(k.pkey), k.type == detail::KeyType::ed25519, std::move(k.thumbprint)});
  return out;
}

}  // namespace gpunode::auth
