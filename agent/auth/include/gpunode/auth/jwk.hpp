// gpunode/auth/jwk.hpp: what the token keys' code knows of keys, for the other users of keys (the
// audit's node key, gpunode/proof): base64url, RFC 7638 thumbprints, public keys read from PEM.
// One implementation (agent/auth/keys.cpp); this header only exposes it.
#pragma once

#include <openssl/err.h>
#include <openssl/types.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/error/error.hpp"

namespace gpunode::auth {

// Drops whatever OpenSSL queued on this thread, so one failure never colours the next call.
struct ErrorQueueGuard {
  ErrorQueueGuard() = default;
  ErrorQueueGuard(const ErrorQueueGuard&) = delete;
  ErrorQueueGuard& operator=(const ErrorQueueGuard&) = delete;
  ~ErrorQueueGuard() { ERR_clear_error(); }
};

// base64url (RFC 4648 §5) without padding.
std::string base64url(std::string_view bytes);
// Strict: no padding, no whitespace, zero unused trailing bits; nullopt otherwise.
std::optional<std::string> from_base64url(std::string_view text);

// The RFC 7638 thumbprint (base64url SHA-256 of the canonical JWK: for Ed25519
// {"crv":"Ed25519","kty":"OKP","x":"..."}) of an Ed25519 or P-256 key (public or private).
error::Result<std::string> jwk_thumbprint(EVP_PKEY* key);

// One public key of a PEM text (-----BEGIN PUBLIC KEY----- blocks, Ed25519 or P-256).
struct PublicKey {
  std::shared_ptr<EVP_PKEY> pkey;
  bool ed25519 = false;    // else P-256
  std::string thumbprint;  // RFC 7638
};
// Every key of the text; `label` (a file name) names it in errors.
error::Result<std::vector<PublicKey>> public_keys_from_pem(std::string_view text, const std::string& label);

}  // namespace gpunode::auth
