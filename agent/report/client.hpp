// Internal to gpunode::report: one keep-alive HTTPS connection to the central API, as C++20
// coroutines on the reporter's io_context (one thread: nothing here is locked but TlsSource).
//
// Every step has a deadline: resolving and connecting `connect_timeout`, then the handshake, the
// write and the read share the request's own deadline. A connection is reused while the server
// keeps it alive and the TLS context has not been replaced (SIGHUP); a request that finds a reused
// connection closed before any byte of an answer came back is sent once more on a fresh one (the
// server dropped an idle connection; nothing was answered, and events are deduplicated by seq).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <chrono>
#include <cstdint>
#include <expected>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "gpunode/error/error.hpp"

namespace gpunode::report::detail {

// Where central.url points, parsed with Boost.URL.
struct Endpoint {
  std::string host;         // a DNS name or an IP address (IPv6 without brackets)
  std::string port;         // "443" unless the URL says
  std::string host_header;  // as the URL has it: "central.example", "[::1]:8443"
  std::string base_path;    // the URL's path without a trailing '/': "" or "/api"
  bool ip_literal = false;  // no SNI then; the certificate must name the address
};
error::Result<Endpoint> parse_endpoint(std::string_view url);

// The current client TLS context (replaced on SIGHUP), with a generation number so that a
// connection made with an older one is not reused. Any thread.
class TlsSource {
 public:
  explicit TlsSource(std::shared_ptr<boost::asio::ssl::context> ctx) : ctx_(std::move(ctx)) {}
  void set(std::shared_ptr<boost::asio::ssl::context> ctx) {
    std::lock_guard lock(mu_);
    ctx_ = std::move(ctx);
    ++generation_;
  }
  std::pair<std::shared_ptr<boost::asio::ssl::context>, std::uint64_t> get() const {
    std::lock_guard lock(mu_);
    return {ctx_, generation_};
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<boost::asio::ssl::context> ctx_;  // guarded by mu_
  std::uint64_t generation_ = 0;                    // guarded by mu_
};

struct Answer {
  unsigned status = 0;
  std::string body;
  std::optional<std::string> retry_after;  // the Retry-After header, as sent
};

class Client {
 public:
  Client(boost::asio::io_context& io, Endpoint endpoint, const TlsSource& tls, std::string user_agent,
         std::chrono::milliseconds connect_timeout);
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // POSTs `body` (application/json) to base_path + `path`. An error is a transport failure
  // (resolve, connect, TLS, write, read, a timeout, an answer over the size limit) and says which.
  boost::asio::awaitable<error::Result<Answer>> post(std::string path, std::string body,
                                                     std::chrono::milliseconds timeout);
  // Closes the connection for good: a request in flight ends with an error, and so does every
  // later one (the reporter is stopping). On the io_context's thread.
  void close();

 private:
  using Stream = boost::beast::ssl_stream<boost::beast::tcp_stream>;
  boost::asio::awaitable<error::Result<void>> connect(std::chrono::steady_clock::time_point deadline);
  void drop();

  boost::asio::io_context& io_;
  Endpoint endpoint_;
  const TlsSource& tls_;
  std::string user_agent_;
  std::chrono::milliseconds connect_timeout_;
  boost::asio::ip::tcp::resolver resolver_;
  boost::asio::steady_timer resolve_guard_;
  std::shared_ptr<boost::asio::ssl::context> ctx_;  // the stream's context (kept while it lives)
  std::uint64_t generation_ = 0;                    // of ctx_
  std::optional<Stream> stream_;
  bool closed_ = false;  // close() was called: no more connections
};

}  // namespace gpunode::report::detail
