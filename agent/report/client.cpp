// One keep-alive HTTPS connection to the central API (see client.hpp). Shape after Beast's
// example/http/client/async-ssl: SNI, verify_peer, host name verification, a timeout before
// every operation.
#include "client.hpp"

#include <fmt/format.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/url/parse.hpp>

#include "gpunode/report/policy.hpp"

namespace gpunode::report::detail {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using asio::redirect_error;
using asio::use_awaitable;
using boost::system::error_code;

error::Result<Endpoint> parse_endpoint(std::string_view url) {
  const auto u = boost::urls::parse_absolute_uri(url);
  if (!u)
    return error::fail(error::Errc::invalid, fmt::format("central.url {}: {}", url, u.error().message()));
  if (u->scheme() != "https")
    return error::fail(error::Errc::invalid, fmt::format("central.url {}: not https", url));
  Endpoint e;
  e.host = u->host_address();
  if (e.host.empty()) return error::fail(error::Errc::invalid, fmt::format("central.url {}: no host", url));
  e.ip_literal =
      u->host_type() == boost::urls::host_type::ipv4 || u->host_type() == boost::urls::host_type::ipv6;
  e.port = u->has_port() ? std::string(u->port()) : "443";
  e.host_header = std::string(u->encoded_host_and_port());
  e.base_path = std::string(u->encoded_path());
  while (!e.base_path.empty() && e.base_path.back() == '/') e.base_path.pop_back();
  return e;
}

namespace {

bool timed_out(const error_code& ec) {
  return ec == beast::error::timeout || ec == asio::error::operation_aborted;
}

std::string describe(const error_code& ec) {
  return timed_out(ec) ? "timed out" : ec.message();
}

// The one mapping of the network's error codes: a timeout, an errno by errno's rule (refused,
// unreachable, reset: unavailable), anything else (TLS, a short read) the central API
// unavailable. The detail is `what` and the reason, as the log always read.
error::Error net_error(const error_code& ec, std::string what) {
  error::Errc code = error::Errc::unavailable;
  if (timed_out(ec))
    code = error::Errc::timeout;
  else if (ec.category() == boost::system::system_category())
    code = error::errno_code(ec.value());
  return error::Error{code, what + ": " + describe(ec)};
}

}  // namespace

Client::Client(asio::io_context& io, Endpoint endpoint, const TlsSource& tls, std::string user_agent,
               std::chrono::milliseconds connect_timeout)
    : io_(io),
      endpoint_(std::move(endpoint)),
      tls_(tls),
      user_agent_(std::move(user_agent)),
      connect_timeout_(connect_timeout),
      resolver_(io),
      resolve_guard_(io) {}

void Client::drop() {
  if (stream_) {
    error_code ignored;
    beast::get_lowest_layer(*stream_).socket().close(ignored);
  }
  stream_.reset();
  ctx_.reset();
}

void Client::close() {
  closed_ = true;
  resolver_.cancel();
  resolve_guard_.cancel();
  if (stream_) {
    // Only the socket: a coroutine suspended on the stream still holds it and drops it itself.
    error_code ignored;
    beast::get_lowest_layer(*stream_).socket().close(ignored);
  }
}

asio::awaitable<error::Result<void>> Client::connect(std::chrono::steady_clock::time_point deadline) {
  drop();
  auto [ctx, generation] = tls_.get();
  error_code ec;
  // The resolver has no deadline of its own: a timer cancels it.
  resolve_guard_.expires_after(connect_timeout_);
  resolve_guard_.async_wait([this](const error_code& e) {
    if (!e) resolver_.cancel();
  });
  const auto found =
      co_await resolver_.async_resolve(endpoint_.host, endpoint_.port, redirect_error(use_awaitable, ec));
  resolve_guard_.cancel();
  if (ec) co_return std::unexpected(net_error(ec, fmt::format("resolving {}", endpoint_.host)));

  stream_.emplace(io_, *ctx);
  ctx_ = std::move(ctx);
  generation_ = generation;
  SSL* ssl = stream_->native_handle();
  if (endpoint_.ip_literal) {
    // RFC 6066: no SNI for an address; the certificate must carry it as an IP SAN.
    if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), endpoint_.host.c_str()) != 1) {
      co_return error::fail(error::Errc::internal,
                            fmt::format("TLS: cannot verify against address {}", endpoint_.host));
    }
  } else if (SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name, endpoint_.host.data()) !=
                 1 ||
             SSL_set1_host(ssl, endpoint_.host.c_str()) != 1) {
    // SNI (SSL_ctrl is what the SSL_set_tlsext_host_name macro expands to, less its C cast) and
    // the host name the certificate must carry.
    co_return error::fail(error::Errc::internal,
                          fmt::format("TLS: cannot set the host name {}", endpoint_.host));
  }

  auto& tcp = beast::get_lowest_layer(*stream_);
  tcp.expires_at(std::min(deadline, std::chrono::steady_clock::now() + connect_timeout_));
  co_await tcp.async_connect(found, redirect_error(use_awaitable, ec));
  if (ec)
    co_return std::unexpected(
        net_error(ec, fmt::format("connecting to {}:{}", endpoint_.host, endpoint_.port)));
  tcp.expires_at(deadline);
  co_await stream_->async_handshake(asio::ssl::stream_base::client, redirect_error(use_awaitable, ec));
  if (ec) {
    const long verify = SSL_get_verify_result(stream_->native_handle());
    auto e = net_error(ec, fmt::format("TLS handshake with {}:{}", endpoint_.host, endpoint_.port));
    if (verify != X509_V_OK) {
      e.code = error::Errc::permission;  // the peer's certificate is refused
      e.detail += fmt::format(" ({})", X509_verify_cert_error_string(verify));
    }
    co_return std::unexpected(std::move(e));
  }
  co_return error::Result<void>{};
}

asio::awaitable<error::Result<Answer>> Client::post(std::string path, std::string body,
                                                    std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bhttp::request<bhttp::string_body> req{bhttp::verb::post, endpoint_.base_path + path, 11};
  req.set(bhttp::field::host, endpoint_.host_header);
  req.set(bhttp::field::user_agent, user_agent_);
  req.set(bhttp::field::content_type, "application/json");
  req.set(bhttp::field::accept, "application/json");
  req.keep_alive(true);
  req.body() = std::move(body);
  req.prepare_payload();

  // A second round only for a reused connection the server had closed (see client.hpp).
  for (int round = 0; round < 2; ++round) {
    if (closed_) co_return error::fail(error::Errc::unavailable, "closed");
    const bool reused = stream_.has_value() && generation_ == tls_.get().second;
    if (!reused) {
      auto c = co_await connect(deadline);
      if (!c) {
        drop();
        co_return std::unexpected(c.error());
      }
    }
    error_code ec;
    beast::get_lowest_layer(*stream_).expires_at(deadline);
    co_await bhttp::async_write(*stream_, req, redirect_error(use_awaitable, ec));
    if (ec) {
      drop();
      if (reused && ec != beast::error::timeout && ec != asio::error::operation_aborted) continue;
      co_return std::unexpected(net_error(ec, "sending"));
    }
    beast::flat_buffer buffer;
    bhttp::response_parser<bhttp::string_body> parser;
    parser.header_limit(8 * 1024);
    parser.body_limit(Limits::kAnswerBytes);
    co_await bhttp::async_read(*stream_, buffer, parser, redirect_error(use_awaitable, ec));
    if (ec) {
      const bool nothing = !parser.got_some();
      drop();
      if (reused && nothing && ec != beast::error::timeout && ec != asio::error::operation_aborted) continue;
      co_return std::unexpected(net_error(ec, "reading the answer"));
    }
    auto& res = parser.get();
    Answer a;
    a.status = res.result_int();
    if (auto it = res.find(bhttp::field::retry_after); it != res.end())
      a.retry_after = std::string(it->value());
    a.body = std::move(res.body());
    if (!res.keep_alive()) drop();
    co_return a;
  }
  co_return error::fail(error::Errc::unavailable, "the connection was closed twice before an answer");
}

}  // namespace gpunode::report::detail
