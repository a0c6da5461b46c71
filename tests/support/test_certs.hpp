// Certificates for tests that speak TLS (tests/http, tests/report): a CA, two server certificates,
// a client certificate from the CA and a self-signed ("rogue") one, made with OpenSSL's API into a
// temporary directory once per test program.
#pragma once

#include <doctest/doctest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdlib.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

namespace gpunode::test_certs {

// A directory removed with everything in it at the end of the program.
struct CertDir {
  std::filesystem::path path;
  CertDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "gpunode-certs-XXXXXX").string();
    path = ::mkdtemp(tmpl.data());
  }
  ~CertDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  CertDir(const CertDir&) = delete;
  CertDir& operator=(const CertDir&) = delete;
  std::string file(std::string_view name) const { return (path / name).string(); }
};

struct Key {
  EVP_PKEY* p = nullptr;
  explicit Key(EVP_PKEY* k) : p(k) { REQUIRE(p != nullptr); }
  ~Key() { EVP_PKEY_free(p); }
  Key(const Key&) = delete;
  Key& operator=(const Key&) = delete;
};

struct Cert {
  X509* p = nullptr;
  ~Cert() { X509_free(p); }
};

inline void add_ext(X509* x, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, x, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  REQUIRE(ext != nullptr);
  X509_add_ext(x, ext, -1);
  X509_EXTENSION_free(ext);
}

// A certificate for `key` named `cn`, signed by issuer (or self-signed).
inline void make_cert(Cert& out, const char* cn, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key, bool ca) {
  static std::atomic<long> serial{1};
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
  X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x), 86400);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn), -1, -1, 0);
  X509_set_issuer_name(x, issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509* signer = issuer != nullptr ? issuer : x;
  add_ext(x, signer, NID_subject_key_identifier, "hash");
  if (ca) {
    add_ext(x, signer, NID_basic_constraints, "critical,CA:TRUE");
    add_ext(x, signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_ext(x, signer, NID_basic_constraints, "CA:FALSE");
    add_ext(x, signer, NID_key_usage, "critical,digitalSignature,keyEncipherment");
    add_ext(x, signer, NID_ext_key_usage, "serverAuth,clientAuth");
    add_ext(x, signer, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
  }
  if (issuer != nullptr) add_ext(x, signer, NID_authority_key_identifier, "keyid:always");
  REQUIRE(X509_sign(x, issuer_key != nullptr ? issuer_key : key, EVP_sha256()) > 0);
  out.p = x;
}

inline void write_pem(const std::string& path, X509* cert, EVP_PKEY* key) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f != nullptr);
  if (cert != nullptr) PEM_write_X509(f, cert);
  if (key != nullptr) PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
}

// One set of files for the whole run: a CA, the server's RSA certificate (so that an RSA key
// exchange suite could be chosen if the server allowed it), a second server certificate (EC, for
// the reload test), a client certificate from the CA and a self-signed one.
struct Certs {
  CertDir dir;
  std::string ca, server_cert, server_key, server2_cert, server2_key, client_cert, client_key, rogue_cert,
      rogue_key;
  Certs() {
    Key ca_key{EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256")};
    Key server_key_{EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", std::size_t{2048})};
    Key server2_key_{EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256")};
    Key client_key_{EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256")};
    Key rogue_key_{EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256")};
    Cert ca_c, server_c, server2_c, client_c, rogue_c;
    make_cert(ca_c, "gpunode test CA", ca_key.p, nullptr, nullptr, true);
    make_cert(server_c, "gpunode-one", server_key_.p, ca_c.p, ca_key.p, false);
    make_cert(server2_c, "gpunode-two", server2_key_.p, ca_c.p, ca_key.p, false);
    make_cert(client_c, "central", client_key_.p, ca_c.p, ca_key.p, false);
    make_cert(rogue_c, "central", rogue_key_.p, nullptr, nullptr, false);
    ca = dir.file("ca.pem");
    write_pem(ca, ca_c.p, nullptr);
    server_cert = dir.file("server.pem");
    write_pem(server_cert, server_c.p, nullptr);
    server_key = dir.file("server.key");
    write_pem(server_key, nullptr, server_key_.p);
    server2_cert = dir.file("server2.pem");
    write_pem(server2_cert, server2_c.p, nullptr);
    server2_key = dir.file("server2.key");
    write_pem(server2_key, nullptr, server2_key_.p);
    client_cert = dir.file("client.pem");
    write_pem(client_cert, client_c.p, nullptr);
    client_key = dir.file("client.key");
    write_pem(client_key, nullptr, client_key_.p);
    rogue_cert = dir.file("rogue.pem");
    write_pem(rogue_cert, rogue_c.p, nullptr);
    rogue_key = dir.file("rogue.key");
    write_pem(rogue_key, nullptr, rogue_key_.p);
  }
};

inline const Certs& certs() {
  static const Certs c;
  return c;
}

}  // namespace gpunode::test_certs
