// The server's and the reporting client's TLS contexts (CONTRACT §7: TLS 1.2 and 1.3, ECDHE + AEAD
// suites, no renegotiation).
#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>

#include "gpunode/http/client_tls.hpp"
#include "gpunode/http/server.hpp"
#include "gpunode/http/tls_files.hpp"
#include "server_state.hpp"

namespace gpunode::http {
namespace {

// Mozilla "intermediate", less the DHE suites: ECDHE key exchange, AES-GCM or ChaCha20-Poly1305.
constexpr const char* kTls12Ciphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
constexpr const char* kTls13Suites =
    "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256";
constexpr const char* kGroups = "X25519:P-256:P-384";

// Drains OpenSSL's error queue; the first entry is the most specific one.
std::string ssl_reason() {
  unsigned long first = ERR_get_error();
  while (ERR_get_error() != 0) {
  }
  if (first == 0) return "unknown OpenSSL error";
  if (ERR_SYSTEM_ERROR(first)) return std::strerror(static_cast<int>(ERR_GET_REASON(first)));
  if (const char* r = ERR_reason_error_string(first)) return r;
  std::array<char, 256> buf{};
  ERR_error_string_n(first, buf.data(), buf.size());
  return buf.data();
}

// A readable file, else the errno that says why (OpenSSL's message for a missing file is poor).
std::optional<int> unreadable(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return errno;
  std::fclose(f);
  return std::nullopt;
}

// What OpenSSL would not take: a file that is not what it must be (not PEM, not a key, a key of
// another certificate). The detail is `what` and OpenSSL's reason.
std::unexpected<error::Error> refused(std::string what) {
  return error::fail(error::Errc::invalid, fmt::format("{}: {}", what, ssl_reason()));
}

// What both sides share: protocol versions, suites, groups, no renegotiation or compression.
// Its failures are the agent's own (constants OpenSSL 3 always takes): internal.
error::Result<void> harden(SSL_CTX* h) {
  const auto cannot = [](std::string_view what) {
    return error::fail(error::Errc::internal, fmt::format("TLS: cannot set {}: {}", what, ssl_reason()));
  };
  if (SSL_CTX_set_min_proto_version(h, TLS1_2_VERSION) != 1 ||
      SSL_CTX_set_max_proto_version(h, TLS1_3_VERSION) != 1) {
    return cannot("protocol versions");
  }
  SSL_CTX_set_options(h, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_CIPHER_SERVER_PREFERENCE |
                             SSL_OP_NO_SSLv2 | SSL_OP_NO_SSLv3 | SSL_OP_NO_TLSv1 | SSL_OP_NO_TLSv1_1);
  if (SSL_CTX_set_cipher_list(h, kTls12Ciphers) != 1 || SSL_CTX_set_ciphersuites(h, kTls13Suites) != 1) {
    return cannot("cipher suites");
  }
  if (SSL_CTX_set1_groups_list(h, kGroups) != 1) {
    return cannot("key exchange groups");
  }
  return {};
}

// The certificate chain and its key, checked to match. `what` names them in errors ("TLS").
error::Result<void> load_identity(SSL_CTX* h, const std::string& cert, const std::string& key,
                                  std::string_view what) {
  const auto cert_what = fmt::format("{} certificate {}", what, cert);
  if (auto err = unreadable(cert)) return std::unexpected(error::from_errno(*err, cert_what));
  if (SSL_CTX_use_certificate_chain_file(h, cert.c_str()) != 1) return refused(cert_what);
  const auto key_what = fmt::format("{} key {}", what, key);
  if (auto err = unreadable(key)) return std::unexpected(error::from_errno(*err, key_what));
  if (SSL_CTX_use_PrivateKey_file(h, key.c_str(), SSL_FILETYPE_PEM) != 1) return refused(key_what);
  if (SSL_CTX_check_private_key(h) != 1)
    return refused(fmt::format("{} does not match certificate {}", key_what, cert));
  return {};
}

// Trusts exactly the certificates in `ca` (a PEM file).
error::Result<void> load_ca(SSL_CTX* h, const std::string& ca, std::string_view what) {
  const auto ca_what = fmt::format("{} {}", what, ca);
  if (auto err = unreadable(ca)) return std::unexpected(error::from_errno(*err, ca_what));
  if (SSL_CTX_load_verify_locations(h, ca.c_str(), nullptr) != 1) return refused(ca_what);
  return {};
}

}  // namespace

error::Result<std::shared_ptr<boost::asio::ssl::context>> make_tls_context(const TlsFiles& files) {
  namespace ssl = boost::asio::ssl;
  ERR_clear_error();
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  SSL_CTX* h = ctx->native_handle();
  if (auto hard = harden(h); !hard) return std::unexpected(std::move(hard.error()));
  static constexpr unsigned char kSidContext[] = "gpunode";
  SSL_CTX_set_session_id_context(h, kSidContext, sizeof kSidContext - 1);
  if (auto id = load_identity(h, files.cert, files.key, "TLS"); !id)
    return std::unexpected(std::move(id.error()));
  if (!files.client_ca.empty()) {
    if (auto ca = load_ca(h, files.client_ca, "TLS client CA"); !ca)
      return std::unexpected(std::move(ca.error()));
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files.client_ca.c_str());
    if (names == nullptr) {
      return error::fail(error::Errc::invalid, fmt::format("TLS client CA {}: no certificate in it ({})",
                                                           files.client_ca, ssl_reason()));
    }
    SSL_CTX_set_client_CA_list(h, names);  // takes ownership
    SSL_CTX_set_verify(h, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  ERR_clear_error();
  return ctx;
}

error::Result<std::shared_ptr<boost::asio::ssl::context>> make_client_tls_context(
    const ClientTlsFiles& files) {
  namespace ssl = boost::asio::ssl;
  ERR_clear_error();
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
  SSL_CTX* h = ctx->native_handle();
  if (auto hard = harden(h); !hard) return std::unexpected(std::move(hard.error()));
  if (auto ca = load_ca(h, files.ca, "central CA"); !ca) return std::unexpected(std::move(ca.error()));
  if (auto id = load_identity(h, files.cert, files.key, "central client"); !id)
    return std::unexpected(std::move(id.error()));
  SSL_CTX_set_verify(h, SSL_VERIFY_PEER, nullptr);
  ERR_clear_error();
  return ctx;
}

error::Result<void> check_tls_file(const std::string& path, TlsFileKind kind) {
  ERR_clear_error();
  boost::asio::ssl::context scratch(boost::asio::ssl::context::tls);
  SSL_CTX* h = scratch.native_handle();
  if (auto err = unreadable(path)) return std::unexpected(error::os_error(*err, std::strerror(*err)));
  int ok = 0;
  switch (kind) {
    case TlsFileKind::certificate_chain:
      ok = SSL_CTX_use_certificate_chain_file(h, path.c_str());
      break;
    case TlsFileKind::private_key:
      ok = SSL_CTX_use_PrivateKey_file(h, path.c_str(), SSL_FILETYPE_PEM);
      break;
    case TlsFileKind::ca_certificates:
      ok = SSL_CTX_load_verify_locations(h, path.c_str(), nullptr);
      break;
  }
  if (ok != 1) {
    return refused(kind == TlsFileKind::private_key ? "not a PEM private key" : "not PEM certificates");
  }
  ERR_clear_error();
  return {};
}

error::Result<void> check_key_pair(const std::string& cert, const std::string& key) {
  ERR_clear_error();
  boost::asio::ssl::context scratch(boost::asio::ssl::context::tls);
  if (auto id = load_identity(scratch.native_handle(), cert, key, "TLS"); !id) {
    ERR_clear_error();
    return error::fail(error::Errc::invalid, fmt::format("does not belong to the certificate in {}", cert));
  }
  return {};
}

namespace detail {

error::Result<void> client_certificate_accepted(SSL* ssl, SSL_CTX* current) {
  if ((SSL_CTX_get_verify_mode(current) & SSL_VERIFY_PEER) == 0) return {};  // no client CA now
  X509* leaf = SSL_get0_peer_certificate(ssl);
  if (leaf == nullptr) {
    return error::fail(error::Errc::permission,
                       "the client presented no certificate, and api.tls.client_ca now requires one");
  }
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> check(X509_STORE_CTX_new(),
                                                                        &X509_STORE_CTX_free);
  // As the handshake verifies a client: the context's CA store and parameters, the SSL client
  // purpose, the chain the client sent (SSL_get_peer_cert_chain: without the leaf on a server).
  const bool ready =
      check &&
      X509_STORE_CTX_init(check.get(), SSL_CTX_get_cert_store(current), leaf, SSL_get_peer_cert_chain(ssl)) ==
          1 &&
      X509_STORE_CTX_set_default(check.get(), "ssl_client") == 1 &&
      X509_VERIFY_PARAM_set1(X509_STORE_CTX_get0_param(check.get()), SSL_CTX_get0_param(current)) == 1;
  if (!ready) {
    return error::fail(
        error::Errc::internal,
        "the client certificate could not be checked against api.tls.client_ca: " + ssl_reason());
  }
  if (X509_verify_cert(check.get()) != 1) {
    auto refused =
        error::fail(error::Errc::permission,
                    fmt::format("the client certificate is not accepted by api.tls.client_ca now: {}",
                                X509_verify_cert_error_string(X509_STORE_CTX_get_error(check.get()))));
    ERR_clear_error();
    return refused;
  }
  ERR_clear_error();
  return {};
}

}  // namespace detail

}  // namespace gpunode::http
