// gpunode/proof/node_key.hpp: the node's audit signing key (CONTRACT §12), an Ed25519 private key
// in a PEM file (PKCS#8), created at first start when missing.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "gpunode/error/error.hpp"

typedef struct evp_pkey_st EVP_PKEY;

namespace gpunode::proof {

class NodeKey {
 public:
  // Reads the key at `path`. When there is no file, makes a new key and writes it there, mode 0600,
  // atomically (a temporary file, fsync, then a link that never replaces a file another process put
  // there meanwhile: that one is read instead). A file that is not an Ed25519 private key PEM is an
  // error naming the file and what it holds; so is one that cannot be read or written.
  static error::Result<NodeKey> load_or_create(const std::string& path);
  // A key from PEM text (-----BEGIN PRIVATE KEY-----, Ed25519); `label` names it in errors.
  static error::Result<NodeKey> from_pem(std::string_view pem, const std::string& label);
  // A fresh key (not written anywhere).
  static error::Result<NodeKey> generate();

  // RFC 7638 thumbprint of the public key (auth::jwk_thumbprint).
  const std::string& key_id() const { return key_id_; }
  // The public key as PEM (SubjectPublicKeyInfo, -----BEGIN PUBLIC KEY-----): the heartbeat's auditKey.
  const std::string& public_pem() const { return public_pem_; }
  // The private key as PEM (PKCS#8), as load_or_create writes it.
  error::Result<std::string> private_pem() const;
  // The Ed25519 signature (64 bytes, raw) of `message`.
  error::Result<std::string> sign(std::string_view message) const;

 private:
  NodeKey(std::shared_ptr<EVP_PKEY> pkey, std::string key_id, std::string public_pem)
      : pkey_(std::move(pkey)), key_id_(std::move(key_id)), public_pem_(std::move(public_pem)) {}
  static error::Result<NodeKey> from_pkey(std::shared_ptr<EVP_PKEY> pkey, const std::string& label);
  std::shared_ptr<EVP_PKEY> pkey_;
  std::string key_id_;
  std::string public_pem_;
};

}  // namespace gpunode::proof
