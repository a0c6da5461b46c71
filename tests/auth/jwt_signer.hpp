// jwt_signer.hpp: a TEST-ONLY token minter (never shipped: it lives under tests/).
//
// Makes keys with OpenSSL and signs compact JWS tokens with whatever header it is handed, so a
// test can mint honest tokens (EdDSA, ES256) and deliberately broken ones (a header that lies
// about its alg, HS256 keyed with the public key, RS256, ES384, a DER ECDSA signature, ...).
// Failures here are bugs in the test set-up, so they throw.
#pragma once

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

#include <array>
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace gpunode::auth::testing {

inline std::string b64url(std::string_view bytes) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) |
                       (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                       static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (bytes.size() - i == 1) {
    const unsigned v = static_cast<unsigned char>(bytes[i]) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
  } else if (bytes.size() - i == 2) {
    const unsigned v =
        (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
  }
  return out;
}

inline void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("jwt_signer: ") + what);
}

enum class KeyKind { ed25519, p256, p384, rsa2048 };

class TestKey {
 public:
  explicit TestKey(KeyKind kind) : kind_(kind) {
    EVP_PKEY* p = nullptr;
    switch (kind) {
      case KeyKind::ed25519:
        p = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
        break;
      case KeyKind::p256:
        p = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
        break;
      case KeyKind::p384:
        p = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-384");
        break;
      case KeyKind::rsa2048:
        p = EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", std::size_t{2048});
        break;
    }
    check(p != nullptr, "keygen");
    pkey_.reset(p);
  }

  // The key of a PEM private key: the same key in every run (the fuzzers' reproducers need it).
  static TestKey from_private_pem(KeyKind kind, std::string_view pem) {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())),
                                                  &BIO_free);
    check(bio != nullptr, "PEM buffer");
    EVP_PKEY* p = PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr);
    check(p != nullptr, "PEM private key");
    return TestKey(kind, p);
  }

  KeyKind kind() const { return kind_; }

  std::string public_pem() const {
    return write([&](BIO* b) { return PEM_write_bio_PUBKEY(b, pkey_.get()); });
  }
  std::string private_pem() const {
    return write([&](BIO* b) {
      return PEM_write_bio_PrivateKey(b, pkey_.get(), nullptr, nullptr, 0, nullptr, nullptr);
    });
  }

  // RFC 7638 thumbprint, computed here independently of the verifier (from the encoded point).
  std::string thumbprint() const {
    std::string jwk;
    if (kind_ == KeyKind::ed25519) {
      std::array<unsigned char, 32> raw{};
      std::size_t len = raw.size();
      check(EVP_PKEY_get_raw_public_key(pkey_.get(), raw.data(), &len) == 1, "raw public key");
      jwk = R"({"crv":"Ed25519","kty":"OKP","x":")" + b64url({reinterpret_cast<char*>(raw.data()), len}) +
            R"("})";
    } else if (kind_ == KeyKind::p256) {
      std::array<unsigned char, 65> pt{};
      std::size_t len = 0;
      check(EVP_PKEY_get_octet_string_param(pkey_.get(), OSSL_PKEY_PARAM_ENCODED_PUBLIC_KEY, pt.data(),
                                            pt.size(), &len) == 1 &&
                len == 65 && pt[0] == 4,
            "encoded point");
      const std::string_view p(reinterpret_cast<char*>(pt.data()), len);
      jwk = R"({"crv":"P-256","kty":"EC","x":")" + b64url(p.substr(1, 32)) + R"(","y":")" +
            b64url(p.substr(33, 32)) + R"("})";
    } else {
      throw std::runtime_error("jwt_signer: thumbprint only for Ed25519 and P-256");
    }
    std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
    unsigned int mdlen = 0;
    check(EVP_Digest(jwk.data(), jwk.size(), md.data(), &mdlen, EVP_sha256(), nullptr) == 1, "sha256");
    return b64url({reinterpret_cast<char*>(md.data()), mdlen});
  }

  // The key's natural JWS signature over `input`: Ed25519 (64 bytes), ECDSA as raw R||S
  // (P-256 with SHA-256: 64 bytes; P-384 with SHA-384: 96 bytes), RSA PKCS#1 v1.5 with SHA-256.
  // With `der_ecdsa`, an ECDSA signature is left in DER (the classic interop mistake).
  std::string sign_raw(std::string_view input, bool der_ecdsa = false) const {
    std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
    const EVP_MD* md = kind_ == KeyKind::ed25519 ? nullptr
                       : kind_ == KeyKind::p384  ? EVP_sha384()
                                                 : EVP_sha256();
    check(EVP_DigestSignInit(ctx.get(), nullptr, md, nullptr, pkey_.get()) == 1, "sign init");
    std::size_t len = 0;
    const auto* in = reinterpret_cast<const unsigned char*>(input.data());
    check(EVP_DigestSign(ctx.get(), nullptr, &len, in, input.size()) == 1, "sign size");
    std::vector<unsigned char> sig(len);
    check(EVP_DigestSign(ctx.get(), sig.data(), &len, in, input.size()) == 1, "sign");
    sig.resize(len);
    if (kind_ == KeyKind::ed25519 || kind_ == KeyKind::rsa2048 || der_ecdsa) {
      return {reinterpret_cast<char*>(sig.data()), sig.size()};
    }
    const int half = kind_ == KeyKind::p384 ? 48 : 32;
    const unsigned char* p = sig.data();
    std::unique_ptr<ECDSA_SIG, decltype(&ECDSA_SIG_free)> es(
        d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(sig.size())), &ECDSA_SIG_free);
    check(es != nullptr, "d2i ECDSA_SIG");
    std::vector<unsigned char> raw(static_cast<std::size_t>(2 * half));
    check(BN_bn2binpad(ECDSA_SIG_get0_r(es.get()), raw.data(), half) == half, "r");
    check(BN_bn2binpad(ECDSA_SIG_get0_s(es.get()), raw.data() + half, half) == half, "s");
    return {reinterpret_cast<char*>(raw.data()), raw.size()};
  }

 private:
  template <typename F>
  static std::string write(F f) {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
    check(bio != nullptr && f(bio.get()) == 1, "PEM write");
    char* data = nullptr;
    const long len = BIO_ctrl(bio.get(), BIO_CTRL_INFO, 0, static_cast<void*>(&data));  // BIO_get_mem_data
    return {data, static_cast<std::size_t>(len)};
  }

  TestKey(KeyKind kind, EVP_PKEY* p) : kind_(kind) { pkey_.reset(p); }

  struct Free {
    void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  };
  KeyKind kind_;
  std::unique_ptr<EVP_PKEY, Free> pkey_;
};

// `header.payload` of the given JSON texts.
inline std::string signing_input(std::string_view header_json, std::string_view payload_json) {
  return b64url(header_json) + "." + b64url(payload_json);
}

// A compact JWS signed by `key` (its natural algorithm) whatever `header_json` claims.
inline std::string mint(const TestKey& key, std::string_view header_json, std::string_view payload_json) {
  const std::string input = signing_input(header_json, payload_json);
  return input + "." + b64url(key.sign_raw(input));
}

// A compact JWS MACed with HMAC-SHA256 under `secret` (for the key-confusion attack).
inline std::string mint_hs256(std::string_view secret, std::string_view header_json,
                              std::string_view payload_json) {
  const std::string input = signing_input(header_json, payload_json);
  std::array<unsigned char, EVP_MAX_MD_SIZE> mac{};
  unsigned int len = 0;
  check(HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
             reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac.data(), &len) != nullptr,
        "HMAC");
  return input + "." + b64url({reinterpret_cast<char*>(mac.data()), len});
}

}  // namespace gpunode::auth::testing
