// gpunode/http/client_tls.hpp: the TLS context of the agent's own HTTPS client (reporting to the
// central API, CONTRACT §6), hardened like the server's (CONTRACT §7 TLS).
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <memory>
#include <string>

#include "gpunode/error/error.hpp"

namespace gpunode::http {

struct ClientTlsFiles {
  std::string ca;    // PEM: the server's certificate must chain to one of these
  std::string cert;  // PEM chain, leaf first: this client's certificate (mTLS)
  std::string key;   // PEM private key of `cert`
};

// A client context per CONTRACT §7: TLS 1.2 and 1.3 only, ECDHE + AEAD suites for 1.2, no
// renegotiation or compression; verify_peer against `ca` only (not the system's store); the client
// certificate and key loaded and checked to match. The host name is checked per connection
// (SSL_set1_host, SNI) by the caller. Errors name the file and the reason, with codes as
// make_tls_context's.
error::Result<std::shared_ptr<boost::asio::ssl::context>> make_client_tls_context(
    const ClientTlsFiles& files);

}  // namespace gpunode::http
