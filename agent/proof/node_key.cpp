// The node's audit signing key (see node_key.hpp): Ed25519 through OpenSSL 3's EVP interface.
#include "gpunode/proof/node_key.hpp"

#include <fmt/format.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <cerrno>

#include "gpunode/auth/jwk.hpp"
#include "gpunode/config/file.hpp"

namespace gpunode::proof {
namespace {

struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;

using auth::ErrorQueueGuard;

constexpr std::size_t kMaxKeyFile = 64 * 1024;  // an Ed25519 PEM is 119 bytes

// What a memory BIO holds, as a string.
std::string bio_text(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_ctrl(bio, BIO_CTRL_INFO, 0, static_cast<void*>(&data));
  return n > 0 && data != nullptr ? std::string(data, static_cast<std::size_t>(n)) : std::string();
}

}  // namespace

error::Result<NodeKey> NodeKey::from_pkey(std::shared_ptr<EVP_PKEY> pkey, const std::string& label) {
  if (EVP_PKEY_is_a(pkey.get(), "ED25519") != 1) {
    const char* type = EVP_PKEY_get0_type_name(pkey.get());
    return error::fail(
        error::Errc::invalid,
        fmt::format("{}: a {} key, not Ed25519 (audit.signing_key must be an Ed25519 private key)", label,
                    type != nullptr ? type : "unknown"));
  }
  auto id = auth::jwk_thumbprint(pkey.get());
  if (!id) return error::fail(id.error().code, fmt::format("{}: {}", label, id.error().detail));
  BioPtr out(BIO_new(BIO_s_mem()));
  if (!out || PEM_write_bio_PUBKEY(out.get(), pkey.get()) != 1)
    return error::fail(error::Errc::internal, fmt::format("{}: cannot write the public key as PEM", label));
  auto pem = bio_text(out.get());
  return NodeKey(std::move(pkey), std::move(*id), std::move(pem));
}

error::Result<NodeKey> NodeKey::from_pem(std::string_view pem, const std::string& label) {
  ErrorQueueGuard guard;
  if (pem.size() > kMaxKeyFile)
    return error::fail(error::Errc::too_large, fmt::format("{}: larger than 64 KiB, not a key file", label));
  if (pem.find("-----BEGIN PRIVATE KEY-----") == std::string_view::npos) {
    return error::fail(error::Errc::invalid,
                       fmt::format("{}: not a PEM private key (no -----BEGIN PRIVATE KEY----- line); "
                                   "audit.signing_key must be an Ed25519 private key (PKCS#8)",
                                   label));
  }
  BioPtr in(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!in) return error::fail(error::Errc::internal, fmt::format("{}: out of memory", label));
  EVP_PKEY* raw = PEM_read_bio_PrivateKey(in.get(), nullptr, nullptr, nullptr);
  if (raw == nullptr) {
    return error::fail(error::Errc::invalid,
                       fmt::format("{}: a damaged PEM private key (bad base64, a missing -----END line, or "
                                   "not PKCS#8)",
                                   label));
  }
  return from_pkey(std::shared_ptr<EVP_PKEY>(raw, EVP_PKEY_free), label);
}

error::Result<NodeKey> NodeKey::generate() {
  ErrorQueueGuard guard;
  EVP_PKEY* raw = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (raw == nullptr) return error::fail(error::Errc::internal, "cannot make an Ed25519 key (OpenSSL)");
  return from_pkey(std::shared_ptr<EVP_PKEY>(raw, EVP_PKEY_free), "a new Ed25519 key");
}

error::Result<std::string> NodeKey::private_pem() const {
  ErrorQueueGuard guard;
  BioPtr out(BIO_new(BIO_s_mem()));
  if (!out || PEM_write_bio_PrivateKey(out.get(), pkey_.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1)
    return error::fail(error::Errc::internal, "cannot write the private key as PEM");
  return bio_text(out.get());
}

error::Result<NodeKey> NodeKey::load_or_create(const std::string& path) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto text = config::read_file(path, kMaxKeyFile);
    if (text) return from_pem(*text, path);
    if (text.error() != ENOENT) {
      return std::unexpected(error::Error{error::errno_code(text.error()),
                                          fmt::format("{}: cannot read the audit signing key: {}", path,
                                                      config::read_error_text(text.error(), kMaxKeyFile)),
                                          text.error(), error::Native::os});
    }
    auto fresh = generate();
    if (!fresh) return fresh;
    auto pem = fresh->private_pem();
    if (!pem) return std::unexpected(pem.error());
    auto written = config::write_file_atomic(path, *pem, 0600, false);
    if (written) return fresh;
    if (written.error() != EEXIST) {  // EEXIST: another process made it meanwhile; read that one
      return std::unexpected(
          error::from_errno(written.error(), fmt::format("{}: cannot create the audit signing key", path)));
    }
  }
  return error::fail(error::Errc::busy, fmt::format("{}: the audit signing key keeps changing", path));
}

error::Result<std::string> NodeKey::sign(std::string_view message) const {
  ErrorQueueGuard guard;
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  std::string sig(64, '\0');
  std::size_t len = sig.size();
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, pkey_.get()) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &len,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1 ||
      len != 64) {
    return error::fail(error::Errc::internal, "cannot sign with the audit signing key (OpenSSL)");
  }
  return sig;
}

}  // namespace gpunode::proof
