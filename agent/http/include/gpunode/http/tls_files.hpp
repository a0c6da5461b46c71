// gpunode/http/tls_files.hpp: whether a TLS file holds what the agent's contexts load from it
// (check-config --files, CONTRACT §11). Each check loads the file as make_tls_context and
// make_client_tls_context do, into a context of its own, so that it fails exactly where they would.
// The error's detail is the reason only (OpenSSL's, or the system's for a file that cannot be
// opened); the caller names the file and the key. Its code is the errno's for a file that cannot be
// opened (a missing one: not_found), else invalid.
#pragma once

#include <string>

#include "gpunode/error/error.hpp"

namespace gpunode::http {

enum class TlsFileKind {
  certificate_chain,  // PEM certificates, the leaf first (api.tls.cert, central.client_cert)
  private_key,        // a PEM private key (api.tls.key, central.client_key)
  ca_certificates,    // PEM certificates to trust (api.tls.client_ca, central.ca)
};

error::Result<void> check_tls_file(const std::string& path, TlsFileKind kind);

// Whether the private key in `key` belongs to the leaf certificate of `cert` (both readable and of
// their kinds: check each first).
error::Result<void> check_key_pair(const std::string& cert, const std::string& key);

}  // namespace gpunode::http
