// Token keys (private to gpunode_auth): OpenSSL ownership, the keys as loaded from PEM, their RFC
// 7638 thumbprints, and base64url. keys.cpp loads them; token_verifier.cpp verifies with them.
#pragma once

#include <fmt/format.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>

#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/auth/jwk.hpp"
#include "gpunode/error/error.hpp"

namespace gpunode::auth::detail {

// ---------------------------------------------------------------------------------------------
// OpenSSL ownership

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};
struct BnFree {
  void operator()(BIGNUM* p) const { BN_free(p); }
};
struct EcdsaSigFree {
  void operator()(ECDSA_SIG* p) const { ECDSA_SIG_free(p); }
};
struct OsslFree {
  void operator()(void* p) const { OPENSSL_free(p); }
};

using BioPtr = std::unique_ptr<BIO, BioFree>;
using BnPtr = std::unique_ptr<BIGNUM, BnFree>;

using auth::ErrorQueueGuard;  // gpunode/auth/jwk.hpp

enum class KeyType { ed25519, p256 };

struct Key {
  std::shared_ptr<EVP_PKEY> pkey;
  KeyType type;
  std::string thumbprint;  // RFC 7638, base64url SHA-256
};

// base64url (RFC 4648 §5), strict: no padding, no whitespace, zero unused trailing bits.
int b64url_value(char c);  // -1 for a character outside the alphabet
std::optional<std::string> b64url_decode(std::string_view in);
std::string b64url_encode(const unsigned char* data, std::size_t n);

// RFC 7638 thumbprints of an Ed25519 and a P-256 key.
error::Result<std::string> ed25519_thumbprint(EVP_PKEY* pkey);
error::Result<std::string> p256_thumbprint(EVP_PKEY* pkey);

// Every key of one PEM text. `label` names the text in errors.
error::Result<std::vector<Key>> load_pem(std::string_view text, const std::string& label);
// A key file: at most 1 MiB (config::read_file), its errors named as a key file's.
error::Result<std::string> read_key_file(const std::string& path);

}  // namespace gpunode::auth::detail
