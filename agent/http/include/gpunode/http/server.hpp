// gpunode's HTTP server layer: HTTPS on a TCP port and plain HTTP on the local admin socket,
// both HTTP/1.1 with keep-alive. It knows nothing about the API: every request goes to one
// Handler, which answers through a Reply callback (from any thread, exactly once).
//
// What the layer does itself (CONTRACT §4, §7; STYLE "The server"):
// - body > Limits::body       -> 413 problem `body-too-large`, then close (a Content-Length over
//   the limit is refused before the body is read; a chunked body when it passes the limit). On the
//   admin socket, a POST to Limits::large_body_path may carry up to Limits::large_body.
// - header > Limits::header   -> 431 problem `headers-too-large`, then close (request line and
//   fields together)
// - malformed request        -> 400 problem `invalid-request`, then close
//   (after these three answers the server half-closes where it can and reads and drops what the
//   client still sends, up to read_timeout capped at 5 s, so the client gets to read the answer)
// - handler throws           -> 500 problem `internal`
// - handler lets its Reply go -> 500 problem `internal` and a log line naming the request (its id,
//   method and path): when the last copy of a Reply goes without having answered (dropped at once,
//   on another thread, with a queue or an io_context it waited in), the request is answered on its
//   connection's executor, once (bmcweb's AsyncResp). So every request is answered or its
//   connection closed; none waits for an answer that no one holds.
// - no deadline on a request being handled: the handler owns each request's deadline (a long
//   poll's wait, a termination's grace; CONTRACT §7 "Deadlines") and answers every request
//   exactly once. The connection waits for that answer as long as a copy of its Reply lives
//   (read_timeout does not run meanwhile); a close or a shutdown's drain drops the answer.
// - every response: X-Request-Id (the client's if sane, else generated), Content-Type (the
//   handler's, default application/json), Content-Length; no Server header. 204 and 304 carry no
//   body, no Content-Type and no Content-Length.
// - `Connection: close` from the client or from the handler closes after the response; a
//   Connection or Content-Length or Transfer-Encoding header set by the handler is not copied.
// - `Expect: 100-continue`: once the headers are read and within limits, the server answers
//   `100 Continue` and reads the body (an oversized Content-Length gets 413 instead).
// - timeouts: handshake_timeout for the TLS handshake, idle_timeout while waiting for the first
//   byte of a request, header_timeout for its request line and fields, read_timeout for its body,
//   write_timeout for each write and for the TLS shutdown. A connection that runs past one is
//   closed without an answer. These guard the socket only, never a handler.
// - budgets: Limits' connection caps, checked at accept, before any byte is read.
// - the admin socket (CONTRACT §7): created mode 0660 (whatever the umask), owned by the process
//   and by the admin group when one is given; its directory created 0750 (and given to that group)
//   if missing. SO_PEERCRED and SO_PEERGROUPS are read right after accept, so the PeerFilter
//   decides from the socket alone (no NSS lookup on an I/O thread); a peer it refuses is closed
//   at once without an HTTP answer and logged.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpunode/error/error.hpp"
#include "gpunode/json/problem.hpp"
#include "gpunode/json/request.hpp"

namespace gpunode::http {

// The request as plain data, one type for the server and the API (service::ApiRequest is this
// Request plus the service's own fields): gpunode/json/request.hpp says why it lives there.
using Peer = gpunode::json::Peer;
using Request = gpunode::json::Request;

using Response = gpunode::json::Response;  // the API's answer type (service::ApiResponse) too

// Any thread, exactly once (later calls ignored). Called on the thread that runs the connection
// (the handler answering at once, or any handler under Limits::one_thread), it queues the answer
// for writing before it returns, the observer and the log called within it: call it holding no
// lock they take. From any other thread it is queued to the connection's executor. Its copies
// share one answer: when the last goes unanswered, the server answers 500 (queued, never inline,
// so it may go anywhere, under any lock). It may outlive the connection and the io_context: then
// calling it, or letting it go, does nothing.
using Reply = std::function<void(Response)>;
using Handler = std::function<void(Request, Reply)>;  // called on an I/O thread; must not block

// One answer as it is queued for writing: the handler's, or one the server gives itself (400, 413,
// 431; then `method` and `path` are empty, the request line not being known). `took` runs from the
// request read whole to the answer queued. For metrics (gpunode_http_requests_total).
struct Answered {
  std::string_view method;
  std::string_view path;
  unsigned status = 0;
  std::chrono::nanoseconds took{0};
  Peer::Kind via = Peer::Kind::tcp;
};
// Called on an I/O thread for every answer; must not block (and a throw is ignored).
using Observer = std::function<void(const Answered&)>;

using gpunode::json::internal_error;      // the one 500
using gpunode::json::method_not_allowed;  // the one 405
using gpunode::json::not_found;           // the one 404
using gpunode::json::problem;             // application/problem+json, titled by the status's reason phrase

// True for an X-Request-Id the server echoes: 1..128 printable ASCII characters (0x20..0x7e).
bool sane_request_id(std::string_view id);
// A fresh random request id (a UUID v4 in its text form).
std::string generate_request_id();

struct Limits {
  std::size_t body = 64 * 1024;
  // One path that takes larger bodies, on the admin socket only (CONTRACT §9: the hook's domain
  // admission takes domain XML up to 16 MiB). Every other request keeps `body`.
  std::string large_body_path;
  std::size_t large_body = 16 * 1024 * 1024;
  std::size_t header = 8 * 1024;
  std::chrono::seconds handshake_timeout{10};  // a TLS handshake (CONTRACT §10)
  std::chrono::seconds header_timeout{10};     // a request's line and fields, from its first byte
  std::chrono::seconds read_timeout{30};       // the rest of a request (its body)
  std::chrono::seconds write_timeout{30};
  std::chrono::seconds idle_timeout{60};
  // Connection budgets (CONTRACT §10), 0 for none: a connection past one is closed at once, and
  // the refusals are logged at most once a minute with a count. TLS connections in total and by
  // the client's IP address (handshakes in progress count); plain-TCP (metrics.listen) and
  // admin-socket connections each in total.
  std::size_t max_connections = 0;
  std::size_t max_connections_per_client = 0;
  std::size_t max_plain_connections = 0;
  std::size_t max_unix_connections = 0;
  // No handler timeout: each request's deadline is its handler's (see the top of this file).
  // The io_context is run by one thread only (the daemon's I/O threads are one each): a
  // connection's handlers are serial already, so it runs on the io_context's executor, not a
  // strand of its own. False (the default) for a server whose io_context several threads run.
  bool one_thread = false;
};

struct TlsFiles {
  std::string cert;       // PEM chain, leaf first
  std::string key;        // PEM private key
  std::string client_ca;  // empty: no mTLS; else client certificates must chain to it
};

// A server context per CONTRACT §7: TLS 1.2 and 1.3 only; TLS 1.2 suites ECDHE with AES-GCM or
// ChaCha20-Poly1305 only; no renegotiation, no compression, server cipher preference; with
// client_ca, verify_peer|fail_if_no_peer_cert against it. An error's detail names the file and the
// reason; its code is the errno's for a file that cannot be opened (a missing one: not_found), else
// invalid (a file OpenSSL will not take, a key of another certificate).
error::Result<std::shared_ptr<boost::asio::ssl::context>> make_tls_context(const TlsFiles& files);

// Admin socket: false refuses the peer (closed at once, no HTTP answer, logged). Called on an I/O
// thread right after accept: it must not block, so no NSS lookups (getgrnam, getgrouplist): the
// peer's groups are in Peer::gid and Peer::groups; resolve group names before listening.
using PeerFilter = std::function<bool(const Peer&)>;

namespace detail {
struct ServerState;
}

// The io_context may be run by any number of threads; each connection runs on its own strand
// (unless Limits::one_thread says one thread runs it).
// Every member function may be called from any thread. `log` may be called from any I/O thread.
class Server {
 public:
  Server(boost::asio::io_context& io, Limits limits, Handler handler,
         std::function<void(std::string_view)> log, Observer observer = {});
  ~Server();  // stops accepting and closes every connection
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // HTTPS on `host` (an IPv4 or IPv6 address, a host name resolved now, or empty / "*" for every
  // IPv4 address) and `port` (0 picks one, see tls_port()). The daemon parses `api.listen` with
  // config::parse_listen.
  error::Result<void> listen_tls(const std::string& host, std::uint16_t port,
                                 std::shared_ptr<boost::asio::ssl::context> tls);
  // Plain HTTP (no TLS, no peer check) on `host` and `port`, as listen_tls binds them; its peers
  // are Peer::Kind::plain_tcp. For metrics.listen: bind it to loopback.
  error::Result<void> listen_plain(const std::string& host, std::uint16_t port);
  // The admin socket (CONTRACT §7: `mode` 0660). Creates the socket's directory mode 0750 if
  // missing (only the last level; chowned to `group` when given), unlinks a stale socket first
  // (only if it is a socket and nobody answers on it), binds, gives the socket to `group` when
  // given (its owner stays this process's uid), chmods it to `mode`, listens. Errors name the
  // socket, the step and the reason (and the group id for a failed chown).
  error::Result<void> listen_unix(const std::string& path, unsigned mode, std::optional<gid_t> group,
                                  PeerFilter filter);
  // Socket activation (CONTRACT §11): HTTPS on `fd`, a listening TCP socket systemd passed, and the
  // admin socket on `fd`, a listening unix socket. The server owns `fd` from the call on (closed on
  // an error too). Closing it when the server stops accepting leaves the socket open in systemd,
  // whose queue keeps new connections for the next agent; an adopted admin socket is never unlinked.
  error::Result<void> adopt_tls(int fd, std::shared_ptr<boost::asio::ssl::context> tls);
  error::Result<void> adopt_unix(int fd, PeerFilter filter);
  // SIGHUP reload: connections accepted from now on use this context; open ones keep theirs (until
  // recheck_access, which judges their client certificates by it).
  void set_tls_context(std::shared_ptr<boost::asio::ssl::context> tls);
  // A reload that may have narrowed access (CONTRACT §10): every open connection's peer is checked
  // again, and closed, with a log line, when it is no longer admitted, before anything more is
  // answered on it (a request in flight gets no answer): an admin-socket peer by its listener's
  // PeerFilter (which reads the new admin.allowed_uids and allowed_group), a TLS client by the
  // certificate it presented, against the client CA of the current context (set_tls_context first);
  // a context that requires none admits every TLS client. A handshake in progress is judged when
  // its first request comes.
  void recheck_access();
  std::uint16_t tls_port() const;  // the port the first listen_tls bound (0 if none)

  // Phase 1 of a graceful shutdown: close the listeners (and unlink the admin socket we made).
  // Open connections keep being served.
  void stop_accepting();
  // Stop accepting; close idle connections; let requests in flight finish (their responses carry
  // Connection: close) for up to `drain`, then close every connection. `done` runs (on an I/O
  // thread) once no connection is left.
  void shutdown(std::chrono::milliseconds drain, std::function<void()> done);
  std::size_t open_connections() const;

 private:
  std::shared_ptr<detail::ServerState> state_;
};

}  // namespace gpunode::http
