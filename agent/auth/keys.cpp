// Token keys: loaded from PEM (Ed25519 and P-256 public keys only), their RFC 7638 thumbprints,
// base64url.
#include "keys.hpp"

#include <openssl/bio.h>
#include <openssl/core_names.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <array>
#include <limits>

#include "gpunode/config/file.hpp"

namespace gpunode::auth::detail {
namespace {

constexpr std::string_view kB64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

}  // namespace

// ---------------------------------------------------------------------------------------------
// base64url (RFC 4648 §5), strict: no padding, no whitespace, zero unused trailing bits.

int b64url_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-') return 62;
  if (c == '_') return 63;
  return -1;
}

std::optional<std::string> b64url_decode(std::string_view in) {
  if (in.size() % 4 == 1) return std::nullopt;  // no byte sequence encodes to this length
  std::string out;
  out.reserve(in.size() / 4 * 3 + 2);
  std::uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    const int v = b64url_value(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFFu));
    }
  }
  // Leftover bits (2 or 4) must be zero: otherwise two spellings would decode to the same bytes.
  if (bits > 0 && (acc & ((1u << bits) - 1u)) != 0) return std::nullopt;
  return out;
}

std::string b64url_encode(const unsigned char* data, std::size_t n) {
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  std::uint32_t acc = 0;
  int bits = 0;
  for (std::size_t i = 0; i < n; ++i) {
    acc = (acc << 8) | data[i];
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(kB64Alphabet[(acc >> bits) & 0x3Fu]);
    }
  }
  if (bits > 0) out.push_back(kB64Alphabet[(acc << (6 - bits)) & 0x3Fu]);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Keys

std::string sha256_b64url(std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), md.data(), &len, EVP_sha256(), nullptr) != 1) return {};
  return b64url_encode(md.data(), len);
}

error::Result<std::string> ed25519_thumbprint(EVP_PKEY* pkey) {
  std::array<unsigned char, 32> raw{};
  std::size_t len = raw.size();
  if (EVP_PKEY_get_raw_public_key(pkey, raw.data(), &len) != 1 || len != raw.size()) {
    return error::fail(error::Errc::invalid, "cannot read the Ed25519 public key");
  }
  // RFC 7638 §3.2 / RFC 8037 §2: members in lexicographic order, no whitespace.
  return sha256_b64url(
      fmt::format(R"({{"crv":"Ed25519","kty":"OKP","x":"{}"}})", b64url_encode(raw.data(), len)));
}

error::Result<std::string> p256_thumbprint(EVP_PKEY* pkey) {
  BIGNUM* x_raw = nullptr;
  BIGNUM* y_raw = nullptr;
  const bool got_x = EVP_PKEY_get_bn_param(pkey, OSSL_PKEY_PARAM_EC_PUB_X, &x_raw) == 1;
  BnPtr x(x_raw);
  const bool got_y = EVP_PKEY_get_bn_param(pkey, OSSL_PKEY_PARAM_EC_PUB_Y, &y_raw) == 1;
  BnPtr y(y_raw);
  std::array<unsigned char, 32> xb{};
  std::array<unsigned char, 32> yb{};
  if (!got_x || !got_y || BN_bn2binpad(x.get(), xb.data(), 32) != 32 ||
      BN_bn2binpad(y.get(), yb.data(), 32) != 32) {
    return error::fail(error::Errc::invalid, "cannot read the P-256 public point");
  }
  return sha256_b64url(fmt::format(R"({{"crv":"P-256","kty":"EC","x":"{}","y":"{}"}})",
                                   b64url_encode(xb.data(), 32), b64url_encode(yb.data(), 32)));
}

// Classifies one decoded SubjectPublicKeyInfo.
error::Result<Key> make_key(std::shared_ptr<EVP_PKEY> pkey) {
  EVP_PKEY* p = pkey.get();
  if (EVP_PKEY_is_a(p, "ED25519") == 1) {
    auto tp = ed25519_thumbprint(p);
    if (!tp) return std::unexpected(tp.error());
    return Key{std::move(pkey), KeyType::ed25519, std::move(*tp)};
  }
  if (EVP_PKEY_is_a(p, "EC") == 1) {
    std::array<char, 80> group{};
    std::size_t glen = 0;
    if (EVP_PKEY_get_group_name(p, group.data(), group.size(), &glen) != 1) {
      return error::fail(error::Errc::invalid,
                         "unsupported key type: an EC key on an unnamed curve (only P-256 is accepted)");
    }
    const std::string_view name(group.data(), glen);
    if (name != "prime256v1" && name != "P-256" && name != "secp256r1") {
      return error::fail(error::Errc::invalid,
                         fmt::format("unsupported key type: EC curve {} (only P-256 is accepted)", name));
    }
    auto tp = p256_thumbprint(p);
    if (!tp) return std::unexpected(tp.error());
    return Key{std::move(pkey), KeyType::p256, std::move(*tp)};
  }
  const char* type = EVP_PKEY_get0_type_name(p);
  return error::fail(error::Errc::invalid,
                     fmt::format("unsupported key type {} (only Ed25519 and P-256 are accepted)",
                                 type != nullptr ? type : "unknown"));
}

// Every key of one PEM text. `label` names the text in errors.
error::Result<std::vector<Key>> load_pem(std::string_view text, const std::string& label) {
  ErrorQueueGuard guard;
  if (text.size() > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    return error::fail(error::Errc::too_large, fmt::format("{}: too large for a key file", label));
  }
  BioPtr bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
  if (!bio) return error::fail(error::Errc::internal, fmt::format("{}: out of memory", label));
  std::vector<Key> keys;
  for (int block = 1;; ++block) {
    char* name_raw = nullptr;
    char* header_raw = nullptr;
    unsigned char* data_raw = nullptr;
    long len = 0;
    ERR_clear_error();
    const int ok = PEM_read_bio(bio.get(), &name_raw, &header_raw, &data_raw, &len);
    std::unique_ptr<char, OsslFree> name(name_raw);
    std::unique_ptr<char, OsslFree> header(header_raw);
    std::unique_ptr<unsigned char, OsslFree> data(data_raw);
    if (ok != 1) {
      const unsigned long err = ERR_peek_last_error();
      if (ERR_GET_LIB(err) == ERR_LIB_PEM && ERR_GET_REASON(err) == PEM_R_NO_START_LINE) {
        if (keys.empty())
          return error::fail(error::Errc::invalid,
                             fmt::format("{}: not a PEM public key (no -----BEGIN line)", label));
        return keys;  // end of the text
      }
      return error::fail(
          error::Errc::invalid,
          fmt::format("{}: PEM block {} is damaged (bad base64 or a missing -----END line)", label, block));
    }
    const std::string_view kind(name.get());
    const auto where = [&] { return block == 1 ? label : fmt::format("{} (PEM block {})", label, block); };
    if (kind != "PUBLIC KEY") {
      if (kind.find("PRIVATE KEY") != std::string_view::npos) {
        return error::fail(
            error::Errc::invalid,
            fmt::format("{}: holds a private key ({}); auth.keys takes public keys only", where(), kind));
      }
      if (kind == "RSA PUBLIC KEY")
        return error::fail(error::Errc::invalid, fmt::format("{}: unsupported key type RSA", where()));
      return error::fail(error::Errc::invalid,
                         fmt::format("{}: a \"{}\" block, not a PEM public key (-----BEGIN PUBLIC KEY-----)",
                                     where(), kind));
    }
    if (header && header.get()[0] != '\0') {
      return error::fail(error::Errc::invalid,
                         fmt::format("{}: a public key block may not carry PEM headers", where()));
    }
    const unsigned char* p = data.get();
    std::shared_ptr<EVP_PKEY> pkey(d2i_PUBKEY(nullptr, &p, len), PkeyFree{});
    if (!pkey || p != data.get() + len) {
      return error::fail(error::Errc::invalid,
                         fmt::format("{}: not a valid public key (bad SubjectPublicKeyInfo)", where()));
    }
    auto key = make_key(std::move(pkey));
    if (!key) return error::fail(key.error().code, fmt::format("{}: {}", where(), key.error().detail));
    keys.push_back(std::move(*key));
  }
}

// A key file: at most 1 MiB (config::read_file), its errors named as a key file's.
error::Result<std::string> read_key_file(const std::string& path) {
  constexpr std::size_t kMaxKeyFile = 1 << 20;
  auto text = config::read_file(path, kMaxKeyFile);
  if (text) return std::move(*text);
  const int err = text.error();
  if (err == EFBIG)
    return error::fail(error::Errc::too_large, fmt::format("{}: larger than 1 MiB, not a key file", path));
  return std::unexpected(
      error::Error{error::errno_code(err),
                   fmt::format("{}: cannot read: {}", path, config::read_error_text(err, kMaxKeyFile)), err,
                   error::Native::os});
}

}  // namespace gpunode::auth::detail
