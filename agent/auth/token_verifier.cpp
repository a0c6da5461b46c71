// token_verifier.cpp: bearer-token verification (CONTRACT §4 "Authentication").
//
// Choices where the contract is silent (the safer reading each time):
// - Only SubjectPublicKeyInfo `PUBLIC KEY` PEM blocks are keys. A private key is refused rather
//   than reduced to its public half: a signing key has no business on the node. Several blocks in
//   one file are all loaded (a rollover file holds the old and the new key).
// - Duplicate keys ("a" and "\u0061" collide), lone surrogates and out-of-range numbers are
//   malformed: the header and payload are parsed by gpunode::json::parse_strict.
// - The signature is checked before the payload is parsed, so unauthenticated bytes reach the JSON
//   parser only through the (small) header.
// - A signature that is not 64 bytes is `bad_signature` (both algs sign 64 bytes); a base64url
//   part that does not decode is `malformed`.
// - Optional claims (`nbf`, `org`, `roles`) given as JSON null count as absent. An empty `sub` is
//   `missing_claim`. `roles` keeps every string: unknown roles simply grant nothing downstream.
// - A `kid` selects by RFC 7638 thumbprint only; an issuer's free-form kid names are not
//   understood, and such a token is `unknown_key` (refused, never "try all keys").
#include "gpunode/auth/token_verifier.hpp"

#include <fmt/format.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <array>
#include <boost/beast/core/string.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <set>
#include <system_error>
#include <utility>

#include "gpunode/json/strict.hpp"
#include "keys.hpp"

namespace gpunode::auth {

using namespace detail;

namespace {

// ---------------------------------------------------------------------------------------------
// JSON: strict (gpunode::json): no duplicate keys, no lone surrogates, numbers in range.

constexpr std::size_t kMaxJsonDepth = 16;

// The JSON object in `text`, or why not. `what` is "header" or "payload".
std::expected<boost::json::object, AuthError> parse_json_object(std::string_view text,
                                                                std::string_view what) {
  auto v = gpunode::json::parse_strict(text, kMaxJsonDepth);
  if (!v) {
    const bool repeated = v.error().what.starts_with("a key is repeated");
    return std::unexpected(
        AuthError{Rejection::malformed, repeated ? fmt::format("the {} repeats a JSON key", what)
                                                 : fmt::format("the {} is not valid JSON", what)});
  }
  if (!v->is_object()) {
    return std::unexpected(AuthError{Rejection::malformed, fmt::format("the {} is not a JSON object", what)});
  }
  return std::move(v->as_object());  // is_object() checked: cannot throw
}

std::string_view as_sv(const boost::json::string& s) {
  return {s.data(), s.size()};
}

// ---------------------------------------------------------------------------------------------
// Signatures

// JWS ES256 signs R||S (32 bytes each, big-endian); EVP_DigestVerify wants a DER ECDSA-Sig-Value.
std::optional<std::vector<unsigned char>> es256_to_der(std::string_view sig) {
  const auto* raw = reinterpret_cast<const unsigned char*>(sig.data());
  BnPtr r(BN_bin2bn(raw, 32, nullptr));
  BnPtr s(BN_bin2bn(raw + 32, 32, nullptr));
  std::unique_ptr<ECDSA_SIG, EcdsaSigFree> ecdsa(ECDSA_SIG_new());
  if (!r || !s || !ecdsa) return std::nullopt;
  if (ECDSA_SIG_set0(ecdsa.get(), r.get(), s.get()) != 1) return std::nullopt;
  (void)r.release();  // owned by ecdsa now
  (void)s.release();
  const int len = i2d_ECDSA_SIG(ecdsa.get(), nullptr);
  if (len <= 0) return std::nullopt;
  std::vector<unsigned char> der(static_cast<std::size_t>(len));
  unsigned char* out = der.data();
  if (i2d_ECDSA_SIG(ecdsa.get(), &out) != len) return std::nullopt;
  return der;
}

bool verify_with(const Key& key, std::string_view signing_input, std::string_view sig) {
  ErrorQueueGuard guard;
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  if (!ctx) return false;
  const auto* tbs = reinterpret_cast<const unsigned char*>(signing_input.data());
  if (key.type == KeyType::ed25519) {
    if (EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.pkey.get()) != 1) return false;
    return EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(sig.data()), sig.size(), tbs,
                            signing_input.size()) == 1;
  }
  const auto der = es256_to_der(sig);
  if (!der) return false;
  if (EVP_DigestVerifyInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key.pkey.get()) != 1) return false;
  return EVP_DigestVerify(ctx.get(), der->data(), der->size(), tbs, signing_input.size()) == 1;
}

// ---------------------------------------------------------------------------------------------
// Claims

AuthError reject(Rejection why, std::string detail) {
  return AuthError{why, std::move(detail)};
}

bool is_token_char(char c) {
  return c == '.' || b64url_value(c) >= 0;
}

// The token of a `Bearer` credential.
std::expected<std::string_view, AuthError> bearer_token(std::string_view value) {
  const auto ows = [](char c) { return c == ' ' || c == '\t'; };
  while (!value.empty() && ows(value.front())) value.remove_prefix(1);
  while (!value.empty() && ows(value.back())) value.remove_suffix(1);
  if (value.empty()) return std::unexpected(reject(Rejection::missing, "no Authorization header"));
  std::size_t end = 0;
  while (end < value.size() && !ows(value[end])) ++end;
  if (!boost::beast::iequals(value.substr(0, end), "Bearer")) {
    return std::unexpected(
        reject(Rejection::missing, "the Authorization header is not of the Bearer scheme"));
  }
  std::string_view token = value.substr(end);
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  if (token.empty()) return std::unexpected(reject(Rejection::malformed, "Bearer without a token"));
  if (token.size() > kMaxTokenBytes) {
    return std::unexpected(reject(
        Rejection::malformed, fmt::format("token of {} bytes, more than {}", token.size(), kMaxTokenBytes)));
  }
  if (!std::all_of(token.begin(), token.end(), is_token_char)) {
    return std::unexpected(reject(
        Rejection::malformed, "the token holds a character outside base64url and '.' (or a second token)"));
  }
  return token;
}

// An integer claim (NumericDate as whole seconds). Absent or (when `null_is_absent`) null: nullopt.
std::expected<std::optional<std::int64_t>, AuthError> int_claim(const boost::json::object& o,
                                                                std::string_view name, bool null_is_absent) {
  const boost::json::value* v = o.if_contains(boost::json::string_view(name.data(), name.size()));
  if (v == nullptr || (null_is_absent && v->is_null())) return std::optional<std::int64_t>{};
  if (const std::int64_t* i = v->if_int64()) return std::optional<std::int64_t>{*i};
  return std::unexpected(
      reject(Rejection::malformed, fmt::format("claim {} is not an integer number of seconds", name)));
}

// CONTRACT §10: a time claim (exp, nbf, iat) is seconds within 1970-01-01 .. 2199-12-31, so that
// no sum with a leeway, no conversion to a time_point and no comparison can overflow.
constexpr std::int64_t kLatestClaimTime = 7258118399;  // 2199-12-31T23:59:59Z

std::expected<std::optional<std::int64_t>, AuthError> time_claim(const boost::json::object& o,
                                                                 std::string_view name, bool null_is_absent) {
  auto v = int_claim(o, name, null_is_absent);
  if (!v || !*v) return v;
  if (**v < 0 || **v > kLatestClaimTime) {
    return std::unexpected(reject(Rejection::malformed, fmt::format("claim {} is outside 1970..2199", name)));
  }
  return v;
}

std::int64_t floor_seconds(std::chrono::system_clock::time_point t) {
  return std::chrono::floor<std::chrono::seconds>(t.time_since_epoch()).count();
}

// ---------------------------------------------------------------------------------------------
// The token, step by step (TokenVerifier::verify)

// A compact JWS: BASE64URL(header) '.' BASE64URL(payload) '.' BASE64URL(signature), decoded.
struct Jws {
  std::string_view signing_input;  // header '.' payload, as they came
  std::string header;
  std::string payload;
  std::string signature;
};

std::expected<Jws, AuthError> decode_jws(std::string_view token) {
  const std::size_t dot1 = token.find('.');
  const std::size_t dot2 = dot1 == std::string_view::npos ? dot1 : token.find('.', dot1 + 1);
  if (dot2 == std::string_view::npos || token.find('.', dot2 + 1) != std::string_view::npos) {
    const auto parts = std::count(token.begin(), token.end(), '.') + 1;
    return std::unexpected(
        reject(Rejection::malformed, fmt::format("a JWS has 3 parts, this token {}", parts)));
  }
  const std::string_view signing_input = token.substr(0, dot2);
  auto header_text = b64url_decode(token.substr(0, dot1));
  auto payload_text = b64url_decode(token.substr(dot1 + 1, dot2 - dot1 - 1));
  auto signature = b64url_decode(token.substr(dot2 + 1));
  if (!header_text || !payload_text || !signature) {
    const char* which = !header_text ? "header" : !payload_text ? "payload" : "signature";
    return std::unexpected(
        reject(Rejection::malformed, fmt::format("the {} is not strict base64url", which)));
  }
  return Jws{signing_input, std::move(*header_text), std::move(*payload_text), std::move(*signature)};
}

// What the header asks for: the key type its alg signs with, and a key by thumbprint (kid).
struct JwsHeader {
  KeyType type{};
  std::optional<std::string> kid;
};

std::expected<JwsHeader, AuthError> read_header(std::string_view text) {
  auto header = parse_json_object(text, "header");
  if (!header) return std::unexpected(header.error());
  const boost::json::value* alg = header->if_contains("alg");
  if (alg == nullptr) return std::unexpected(reject(Rejection::malformed, "the header has no alg"));
  if (!alg->is_string())
    return std::unexpected(reject(Rejection::malformed, "the header's alg is not a string"));
  JwsHeader out;
  if (as_sv(alg->get_string()) == "EdDSA") {
    out.type = KeyType::ed25519;
  } else if (as_sv(alg->get_string()) == "ES256") {
    out.type = KeyType::p256;
  } else {
    return std::unexpected(reject(Rejection::unsupported_alg, "alg is not EdDSA or ES256"));
  }
  if (header->contains("crit")) {
    return std::unexpected(reject(Rejection::malformed, "the header has crit: no extension is understood"));
  }
  if (const boost::json::value* k = header->if_contains("kid")) {
    if (!k->is_string())
      return std::unexpected(reject(Rejection::malformed, "the header's kid is not a string"));
    out.kid = std::string(as_sv(k->get_string()));
  }
  return out;
}

// Whether a key the header allows verifies the signature.
std::expected<void, AuthError> check_signature(const std::vector<Key>& keys, const JwsHeader& header,
                                               const Jws& jws) {
  std::vector<const Key*> candidates;
  for (const Key& k : keys) {
    if (k.type == header.type && (!header.kid || *header.kid == k.thumbprint)) candidates.push_back(&k);
  }
  const char* type_name = header.type == KeyType::ed25519 ? "Ed25519" : "P-256";
  if (candidates.empty()) {
    return std::unexpected(
        reject(Rejection::unknown_key, header.kid ? fmt::format("no {} key has the token's kid", type_name)
                                                  : fmt::format("no {} key is loaded", type_name)));
  }
  if (jws.signature.size() != 64) {
    return std::unexpected(reject(Rejection::bad_signature, fmt::format("signature of {} bytes, {} signs 64",
                                                                        jws.signature.size(), type_name)));
  }
  const bool verified = std::any_of(candidates.begin(), candidates.end(), [&](const Key* k) {
    return verify_with(*k, jws.signing_input, jws.signature);
  });
  if (!verified) {
    return std::unexpected(
        reject(Rejection::bad_signature,
               fmt::format("no {} key verifies the signature ({} tried)", type_name, candidates.size())));
  }
  return {};
}

std::expected<void, AuthError> check_issuer(const boost::json::object& payload, const VerifierConfig& cfg) {
  const boost::json::value* iss = payload.if_contains("iss");
  if (iss == nullptr) return std::unexpected(reject(Rejection::missing_claim, "no iss claim"));
  if (!iss->is_string()) return std::unexpected(reject(Rejection::malformed, "claim iss is not a string"));
  if (as_sv(iss->get_string()) != cfg.issuer) {
    return std::unexpected(reject(Rejection::wrong_issuer, "iss is not the configured issuer"));
  }
  return {};
}

// aud, a string or an array of strings, must name the configured audience or the node id.
std::expected<void, AuthError> check_audience(const boost::json::object& payload, const VerifierConfig& cfg) {
  const boost::json::value* aud = payload.if_contains("aud");
  if (aud == nullptr) return std::unexpected(reject(Rejection::missing_claim, "no aud claim"));
  const auto ours = [&](const boost::json::string& s) {
    const std::string_view v = as_sv(s);
    return (!cfg.audience.empty() && v == cfg.audience) || (!cfg.node_id.empty() && v == cfg.node_id);
  };
  bool for_us = false;
  if (aud->is_string()) {
    for_us = ours(aud->get_string());
  } else if (aud->is_array()) {
    for (const boost::json::value& a : aud->get_array()) {
      if (!a.is_string())
        return std::unexpected(reject(Rejection::malformed, "claim aud holds a non-string"));
      for_us = for_us || ours(a.get_string());
    }
  } else {
    return std::unexpected(
        reject(Rejection::malformed, "claim aud is neither a string nor an array of strings"));
  }
  if (!for_us) {
    return std::unexpected(
        reject(Rejection::wrong_audience, "aud holds neither the configured audience nor the node id"));
  }
  return {};
}

// Whether now is within exp and nbf, give or take the leeway: verify()'s rule, and in_time()'s.
std::expected<void, AuthError> check_times(const Claims& c, std::int64_t now_s, std::int64_t leeway) {
  if (now_s - leeway > c.exp) {  // now > exp + leeway, without overflow near INT64_MAX
    return std::unexpected(
        reject(Rejection::expired, fmt::format("expired: exp={} now={} leeway={}s", c.exp, now_s, leeway)));
  }
  if (c.nbf && now_s + leeway < *c.nbf) {
    return std::unexpected(
        reject(Rejection::not_yet_valid,
               fmt::format("not yet valid: nbf={} now={} leeway={}s", *c.nbf, now_s, leeway)));
  }
  return {};
}

// exp (required), nbf and iat: bounded, and now within exp and nbf give or take the leeway.
std::expected<void, AuthError> read_validity(const boost::json::object& payload, std::int64_t now_s,
                                             std::int64_t leeway, Claims& claims) {
  auto exp = time_claim(payload, "exp", false);
  if (!exp) return std::unexpected(exp.error());
  if (!*exp) return std::unexpected(reject(Rejection::missing_claim, "no exp claim"));
  claims.exp = **exp;
  if (auto late = check_times(claims, now_s, leeway); !late) return late;
  auto nbf = time_claim(payload, "nbf", true);
  if (!nbf) return std::unexpected(nbf.error());
  if (auto iat = time_claim(payload, "iat", true); !iat) return std::unexpected(iat.error());  // only bounded
  claims.nbf = *nbf;
  return check_times(claims, now_s, leeway);
}

// Who the token speaks for: sub (required, not empty), org and roles.
std::expected<void, AuthError> read_subject(const boost::json::object& payload, Claims& claims) {
  const boost::json::value* sub = payload.if_contains("sub");
  if (sub == nullptr) return std::unexpected(reject(Rejection::missing_claim, "no sub claim"));
  if (!sub->is_string()) return std::unexpected(reject(Rejection::malformed, "claim sub is not a string"));
  if (sub->get_string().empty())
    return std::unexpected(reject(Rejection::missing_claim, "claim sub is empty"));
  claims.sub = std::string(as_sv(sub->get_string()));

  if (const boost::json::value* org = payload.if_contains("org"); org != nullptr && !org->is_null()) {
    if (!org->is_string()) return std::unexpected(reject(Rejection::malformed, "claim org is not a string"));
    claims.org = std::string(as_sv(org->get_string()));
  }

  if (const boost::json::value* roles = payload.if_contains("roles"); roles != nullptr && !roles->is_null()) {
    if (!roles->is_array())
      return std::unexpected(reject(Rejection::malformed, "claim roles is not an array"));
    for (const boost::json::value& r : roles->get_array()) {
      if (!r.is_string())
        return std::unexpected(reject(Rejection::malformed, "claim roles holds a non-string"));
      claims.roles.emplace_back(as_sv(r.get_string()));
    }
  }
  return {};
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct TokenVerifier::Impl {
  VerifierConfig cfg;
  std::vector<Key> keys;
};

bool Claims::has_role(std::string_view role) const {
  return std::find(roles.begin(), roles.end(), role) != roles.end();
}

std::string_view to_string(Rejection why) {
  switch (why) {
    case Rejection::missing:
      return "missing";
    case Rejection::malformed:
      return "malformed";
    case Rejection::unsupported_alg:
      return "unsupported_alg";
    case Rejection::bad_signature:
      return "bad_signature";
    case Rejection::expired:
      return "expired";
    case Rejection::not_yet_valid:
      return "not_yet_valid";
    case Rejection::wrong_issuer:
      return "wrong_issuer";
    case Rejection::wrong_audience:
      return "wrong_audience";
    case Rejection::unknown_key:
      return "unknown_key";
    case Rejection::missing_claim:
      return "missing_claim";
  }
  return "unknown";
}

error::Result<TokenVerifier> TokenVerifier::build(const std::vector<std::string>& texts,
                                                  const std::vector<std::string>& labels,
                                                  VerifierConfig cfg) {
  if (cfg.issuer.empty()) return error::fail(error::Errc::invalid, "auth.issuer is empty");
  if (cfg.audience.empty() && cfg.node_id.empty()) {
    return error::fail(error::Errc::invalid,
                       "neither auth.audience nor the node id is set: no token could be for us");
  }
  if (cfg.leeway < std::chrono::seconds(0) || cfg.leeway > std::chrono::hours(24)) {
    return error::fail(error::Errc::invalid, "the leeway must be between 0 s and 24 h");
  }
  if (texts.empty())
    return error::fail(error::Errc::invalid, "auth.keys is empty: no token could ever verify");
  auto impl = std::make_shared<Impl>();
  impl->cfg = std::move(cfg);
  for (std::size_t i = 0; i < texts.size(); ++i) {
    auto keys = load_pem(texts[i], labels[i]);
    if (!keys) return std::unexpected(keys.error());
    for (Key& k : *keys) impl->keys.push_back(std::move(k));
  }
  return TokenVerifier(std::move(impl));
}

error::Result<TokenVerifier> TokenVerifier::from_files(const std::vector<std::string>& pem_files,
                                                       VerifierConfig cfg) {
  std::vector<std::string> texts;
  for (const std::string& path : pem_files) {
    auto text = read_key_file(path);
    if (!text) return std::unexpected(text.error());
    texts.push_back(std::move(*text));
  }
  return build(texts, pem_files, std::move(cfg));
}

error::Result<TokenVerifier> TokenVerifier::from_pems(const std::vector<std::string>& pem_texts,
                                                      VerifierConfig cfg) {
  std::vector<std::string> labels;
  for (std::size_t i = 0; i < pem_texts.size(); ++i) labels.push_back(fmt::format("key #{}", i + 1));
  return build(pem_texts, labels, std::move(cfg));
}

std::vector<std::string> TokenVerifier::key_ids() const {
  std::vector<std::string> ids;
  for (const Key& k : impl_->keys) ids.push_back(k.thumbprint);
  return ids;
}

std::expected<Claims, AuthError> TokenVerifier::verify(std::string_view authorization,
                                                       std::chrono::system_clock::time_point now) const {
  const auto token = bearer_token(authorization);
  if (!token) return std::unexpected(token.error());
  const auto jws = decode_jws(*token);
  if (!jws) return std::unexpected(jws.error());
  const auto header = read_header(jws->header);
  if (!header) return std::unexpected(header.error());
  if (auto ok = check_signature(impl_->keys, *header, *jws); !ok) return std::unexpected(ok.error());

  // Claims, now that they are known to come from the issuer's key.
  const auto payload = parse_json_object(jws->payload, "payload");
  if (!payload) return std::unexpected(payload.error());
  const VerifierConfig& cfg = impl_->cfg;
  if (auto ok = check_issuer(*payload, cfg); !ok) return std::unexpected(ok.error());
  if (auto ok = check_audience(*payload, cfg); !ok) return std::unexpected(ok.error());
  Claims claims;
  if (auto ok = read_validity(*payload, floor_seconds(now), cfg.leeway.count(), claims); !ok)
    return std::unexpected(ok.error());
  if (auto ok = read_subject(*payload, claims); !ok) return std::unexpected(ok.error());
  return claims;
}

bool TokenVerifier::in_time(const Claims& claims, std::chrono::system_clock::time_point now) const {
  return check_times(claims, floor_seconds(now), impl_->cfg.leeway.count()).has_value();
}

std::chrono::system_clock::time_point TokenVerifier::expires(const Claims& claims) const {
  // exp is bounded to 2199 by time_claim: no overflow.
  return std::chrono::system_clock::time_point(std::chrono::seconds(claims.exp + 1) + impl_->cfg.leeway);
}

}  // namespace gpunode::auth
