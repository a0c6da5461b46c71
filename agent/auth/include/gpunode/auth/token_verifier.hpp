// gpunode/auth/token_verifier.hpp: bearer-token (JWT) verification for the HTTPS API (CONTRACT §4).
//
// A TokenVerifier holds the public keys of `auth.keys` (Ed25519 or P-256, PEM SubjectPublicKeyInfo)
// and the expected issuer and audiences. verify() takes the whole `Authorization` header value and
// either returns the token's claims or says why it was refused. It never throws for bad input and
// never copies the token (or any value taken from it) into an error's detail: details name what
// was wrong, not what was sent, so they are safe to log.
//
// Rules (the safer reading where the contract is silent; see token_verifier.cpp for more):
// - `Bearer <token>`: scheme case-insensitive, one or more spaces, then exactly one token of the
//   base64url alphabet and two dots, at most 8 KiB. No header or another scheme: `missing`.
// - Compact JWS, strict base64url (no padding, no `+`/`/`, zero unused bits). The header and the
//   payload are JSON objects without duplicate keys (also after unescaping), valid UTF-8.
// - `alg` is `EdDSA` (Ed25519 keys) or `ES256` (P-256 keys, raw 64-byte R||S); anything else,
//   including `none`, `HS*` and `RS*`, is `unsupported_alg`. A `crit` header is refused
//   (`malformed`): we understand no extensions. `jwk`/`jku`/`x5c`/`x5u` are ignored, never trusted.
// - Keys: those of the alg's type; with a `kid`, only the one whose RFC 7638 thumbprint equals it.
//   None: `unknown_key`. None verifies (or the signature is not 64 bytes): `bad_signature`.
// - The signature is checked before the payload is parsed; then the claims, in this order:
//   `iss`, `aud`, `exp`, `nbf`, `sub`, `org`, `roles`. A required claim that is absent is
//   `missing_claim`; a claim of the wrong JSON type is `malformed`.
#pragma once

#include <chrono>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/error/error.hpp"

namespace gpunode::auth {

// What a verified token says about its bearer.
struct Claims {
  std::string sub;                 // non-empty
  std::optional<std::string> org;  // absent (or JSON null) when the token has none
  std::vector<std::string> roles;  // every string of `roles`, as sent (the caller decides meaning)
  std::int64_t exp = 0;            // seconds since the epoch
  std::optional<std::int64_t> nbf;

  bool has_role(std::string_view role) const;
};

enum class Rejection {
  missing,          // no Authorization header, or not the Bearer scheme
  malformed,        // not a well-formed compact JWS/JWT, or a claim of the wrong type
  unsupported_alg,  // alg other than EdDSA / ES256 (none, HS*, RS*, ...)
  bad_signature,    // no candidate key verifies the signature
  expired,          // now > exp + leeway
  not_yet_valid,    // now + leeway < nbf
  wrong_issuer,     // iss != configured issuer
  wrong_audience,   // aud holds neither the configured audience nor the node id
  unknown_key,      // no loaded key of the alg's type (with that kid)
  missing_claim,    // iss, aud, exp or sub absent
};

// Stable snake_case name of a rejection, for logs (`AUTH=bad_signature`).
std::string_view to_string(Rejection why);

struct AuthError {
  Rejection why;
  std::string detail;  // for logs; never echoed to clients verbatim; never holds token content
};

struct VerifierConfig {
  std::string issuer;    // `auth.issuer`: tokens' iss must equal it exactly (must not be empty)
  std::string audience;  // `auth.audience`
  std::string node_id;   // `node.id`: also accepted as an audience (empty: not accepted)
  std::chrono::seconds leeway{60};
};

// Longest token (the part after "Bearer ") verify() looks at.
inline constexpr std::size_t kMaxTokenBytes = 8 * 1024;

// Immutable once built; copies share the keys. verify() is safe to call from many threads.
class TokenVerifier {
 public:
  // Loads PEM public keys. Each file may hold several `PUBLIC KEY` blocks (all are loaded); any
  // other block (a private key, a certificate, `RSA PUBLIC KEY`, EC parameters) is refused, as is
  // a key that is neither Ed25519 nor P-256 (RSA, P-384, Ed448, ...). The error names the file
  // (and the block, when the file has several) and says why. An empty list is refused too, as is
  // an empty issuer, a config with neither audience nor node id, and a negative leeway.
  static error::Result<TokenVerifier> from_files(const std::vector<std::string>& pem_files,
                                                 VerifierConfig cfg);
  // The same over PEM texts; errors name them "key #1", "key #2", ...
  static error::Result<TokenVerifier> from_pems(const std::vector<std::string>& pem_texts,
                                                VerifierConfig cfg);

  // `authorization` is the whole header value ("Bearer <jwt>"), empty when there is none.
  std::expected<Claims, AuthError> verify(std::string_view authorization,
                                          std::chrono::system_clock::time_point now) const;

  // Whether claims verify() returned hold at `now` by its rule (exp and nbf, with the leeway), and
  // the first instant they no longer do: a cache of verified tokens asks these, not its own rule.
  [[nodiscard]] bool in_time(const Claims& claims, std::chrono::system_clock::time_point now) const;
  [[nodiscard]] std::chrono::system_clock::time_point expires(const Claims& claims) const;

  // RFC 7638 thumbprints (base64url SHA-256) of the loaded keys, in load order: the `kid` values
  // that select them. For the startup log.
  std::vector<std::string> key_ids() const;

 private:
  struct Impl;
  explicit TokenVerifier(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  static error::Result<TokenVerifier> build(const std::vector<std::string>& texts,
                                            const std::vector<std::string>& labels, VerifierConfig cfg);
  std::shared_ptr<const Impl> impl_;
};

}  // namespace gpunode::auth
