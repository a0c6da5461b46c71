// One connection's HTTP/1.1 state machine, Session<Stream>: TLS or plain, read, limits, dispatch, answer.
// Shape after Beast's example/http/server/async-ssl and example/advanced/server-flex-awaitable:
// a timeout before every async operation, a body and a header limit, one fail() that ignores
// ssl::error::stream_truncated. The Session is templated on its stream: TLS over TCP, or plain
// (the admin socket and metrics.listen's TCP, both as a generic stream socket: one instantiation
// of the Session's code for the two, which is most of this file's compile time).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <limits>
#include <optional>
#include <type_traits>

#include "message.hpp"
#include "server_state.hpp"

namespace gpunode::http::detail {
namespace {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;
using PlainStream =
    beast::basic_stream<net::generic::stream_protocol, net::any_io_executor, beast::unlimited_rate_policy>;

constexpr std::size_t kReadChunk = 4096;
constexpr std::size_t kMaxLingerBytes = 1024 * 1024;

// Errors that end a connection in the ordinary way: nothing worth a log line.
bool quiet_error(const beast::error_code& ec) {
  return ec == ssl::error::stream_truncated || ec == net::error::operation_aborted || ec == net::error::eof ||
         ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
         ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == net::error::bad_descriptor;
}

template <class Stream>
class Session final : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;
  enum class Phase { start, handshake, idle, reading, handling, writing, closing };

 public:
  // Only for a connection ServerState::admit() took: the session gives the place back when it goes.
  template <class... Args>
  Session(std::shared_ptr<ServerState> st, Peer peer, std::string budget_address, PeerFilter filter,
          std::shared_ptr<ssl::context> ctx, Args&&... stream_args)
      : st_(std::move(st)),
        peer_(std::move(peer)),
        budget_address_(std::move(budget_address)),
        filter_(std::move(filter)),
        access_checked_(st_->access_generation.load(std::memory_order_acquire)),
        ctx_(std::move(ctx)),
        stream_(std::forward<Args>(stream_args)...),
        ex_(stream_.get_executor()),
        answer_wait_(ex_) {}

  ~Session() override {
    if (registered_) st_->remove(id_);
    st_->release(peer_.kind, budget_address_);  // the place admit() gave it at accept
  }

  void start() {
    auto [id, draining] = st_->add(this->weak_from_this());
    id_ = id;
    registered_ = true;
    net::dispatch(ex_, [self = this->shared_from_this(), draining = draining] {
      if (draining) self->draining_ = true;
      if constexpr (kTls) {
        self->do_handshake();
      } else {
        self->wait_request();
      }
    });
  }

  void drain() override {
    net::post(ex_, [self = this->shared_from_this()] {
      self->draining_ = true;
      // An idle keep-alive connection ends now (wait_request closes it). One that has not sent its
      // first request yet is no idle one: its client is about to ask, and is answered (CONTRACT §11
      // Stopping), within the drain.
      if (self->phase_ == Phase::idle && self->answered_ > 0) self->lowest().cancel();
    });
  }

  void force_close() override {
    net::post(ex_, [self = this->shared_from_this()] { self->close_now(); });
  }

  void recheck() override {
    net::post(ex_, [self = this->shared_from_this()] {
      // A TLS client is judged once its handshake is done: at its first request.
      if (self->closed_ || self->phase_ == Phase::start || self->phase_ == Phase::handshake) return;
      self->still_admitted();
    });
  }

 private:
  const Limits& limits() const { return st_->limits; }
  auto& lowest() { return beast::get_lowest_layer(stream_); }

  void fail(const beast::error_code& ec, std::string_view what) {
    if (quiet_error(ec)) return;
    st_->log(fmt::format("http: {} {}: {}", peer_.address, what, ec.message()));
  }

  void close_now() {
    closed_ = true;
    phase_ = Phase::closing;
    answer_wait_.cancel();
    lowest().close();
  }

  // Whether the peer may still be served; when access was rechecked since this connection last
  // looked (Server::recheck_access), its peer is judged again, and one no longer admitted is closed
  // (logged) before anything more is read or answered.
  bool still_admitted() {
    const auto now = st_->access_generation.load(std::memory_order_acquire);
    if (closed_) return false;
    if (now == access_checked_) return true;
    access_checked_ = now;
    const auto ok = admitted();
    if (ok) return true;
    st_->log(fmt::format("http: {}: {}: connection closed", peer_.address, ok.error().detail));
    close_now();
    return false;
  }

  error::Result<void> admitted() {
    if constexpr (kTls) {
      auto current = st_->current_tls();
      if (!current) return {};
      return client_certificate_accepted(stream_.native_handle(), current->native_handle());
    } else {
      bool ok = true;
      try {
        ok = !filter_ || filter_(peer_);
      } catch (...) {
        ok = false;
      }
      if (ok) return {};
      return error::fail(
          error::Errc::permission,
          fmt::format("peer uid={} no longer admitted after a reload of the admin socket's uids and group",
                      peer_.uid ? static_cast<long long>(*peer_.uid) : -1LL));
    }
  }

  void do_handshake() {
    phase_ = Phase::handshake;
    lowest().expires_after(limits().handshake_timeout);
    stream_.async_handshake(ssl::stream_base::server,
                            [self = this->shared_from_this()](beast::error_code ec) {
                              if (ec) {
                                self->fail(ec, "TLS handshake");
                                return self->close_now();
                              }
                              self->wait_request();
                            });
  }

  // Between requests: wait (idle_timeout) for the first byte of the next one.
  void wait_request() {
    if (closed_) return;
    if (draining_ && answered_ > 0) return do_close();
    if (buffer_.size() > 0) return read_header();
    buffer_.shrink_to_fit();  // an idle connection does not keep a large body's buffer
    phase_ = Phase::idle;
    lowest().expires_after(limits().idle_timeout);
    stream_.async_read_some(
        buffer_.prepare(kReadChunk), [self = this->shared_from_this()](beast::error_code ec, std::size_t n) {
          if (ec) {
            if (ec == net::error::operation_aborted && self->draining_ && !self->closed_) {
              return self->do_close();
            }
            self->fail(ec, "idle read");
            return self->close_now();
          }
          self->buffer_.commit(n);
          self->read_header();
        });
  }

  // One whole request within read_timeout.
  void read_header() {
    phase_ = Phase::reading;
    parser_.emplace();
    // The admin socket's one large-body path is known only once the request line is read: its
    // peers (already admitted) may send up to large_body, and on_header holds every other path to
    // `body` (chunked bodies when they are read whole: on_request).
    parser_->body_limit(admits_large_body() ? std::max(limits().body, limits().large_body) : limits().body);
    parser_->header_limit(static_cast<std::uint32_t>(
        std::min<std::size_t>(limits().header, std::numeric_limits<std::uint32_t>::max())));
    if (const auto fed = feed(Until::header); fed != Fed::more) {
      if (fed == Fed::done) on_header();
      return;
    }
    lowest().expires_after(limits().header_timeout);
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
                               if (ec) return self->on_read_error(ec);
                               self->on_header();
                             });
  }

  void on_header() {
    const auto& msg = parser_->get();
    if (admits_large_body() && !is_large_body_request(msg.target()) && msg.payload_size() &&
        *msg.payload_size() > limits().body) {
      return reject(too_large(), true);
    }
    if (!parser_->is_done() && beast::iequals(msg[bhttp::field::expect], "100-continue")) {
      continue_.emplace(bhttp::status::continue_, msg.version());
      lowest().expires_after(limits().write_timeout);
      bhttp::async_write(stream_, *continue_,
                         [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
                           self->continue_.reset();
                           if (ec) {
                             self->fail(ec, "write 100 Continue");
                             return self->close_now();
                           }
                           self->lowest().expires_after(self->limits().read_timeout);
                           self->read_body();
                         });
      return;
    }
    read_body();
  }

  void read_body() {
    if (const auto fed = feed(Until::message); fed != Fed::more) {
      if (fed == Fed::done) on_request();
      return;
    }
    lowest().expires_after(limits().read_timeout);
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
                        if (ec) return self->on_read_error(ec);
                        self->on_request();
                      });
  }

  // What is already buffered, given to the parser: most requests arrive whole in the first read,
  // and are parsed here with no further read, hop or timer (Beast's async_read would post its
  // completion even with nothing to read). The async reads above take over when more must come.
  enum class Until { header, message };
  enum class Fed { more, done, failed };  // failed: on_read_error has answered or closed
  Fed feed(Until until) {
    const auto reached = [&] {
      return until == Until::header ? parser_->is_header_done() : parser_->is_done();
    };
    while (!reached() && buffer_.size() > 0) {
      beast::error_code ec;
      const auto n = parser_->put(buffer_.data(), ec);
      buffer_.consume(n);
      if (ec == bhttp::error::need_more) break;
      if (ec) {
        on_read_error(ec);
        return Fed::failed;
      }
      if (n == 0) break;
    }
    return reached() ? Fed::done : Fed::more;
  }

  bool admits_large_body() const {
    return peer_.kind == Peer::Kind::unix_socket && !limits().large_body_path.empty();
  }
  bool is_large_body_request(std::string_view target) const {
    const auto path = target.substr(0, target.find('?'));
    return path == limits().large_body_path;
  }
  // 413 naming the limit of the request's path (the parser's own limit is the larger one).
  Response too_large() {
    // The request line is parsed before any field, so its target is known here.
    const bool large = parser_ && admits_large_body() && is_large_body_request(parser_->get().target());
    return body_too_large(large ? limits().large_body : limits().body);
  }

  void on_read_error(const beast::error_code& ec) {
    if (ec == bhttp::error::body_limit) {
      // Beast checks Content-Length against the limit once every field is parsed.
      return reject(too_large(), true);
    }
    if (ec == bhttp::error::header_limit) return reject(headers_too_large(limits().header));
    if (is_malformed(ec)) return reject(malformed_request(ec));
    fail(ec, "read");
    close_now();
  }

  // An answer the server gives itself to a request it could not read: then it closes.
  void reject(Response r, bool fields_parsed = false) {
    started_ = std::chrono::steady_clock::now();
    method_.clear();
    path_.clear();
    linger_ = true;
    keep_alive_ = false;
    version_ = 11;
    request_id_.clear();
    if (parser_ && (fields_parsed || parser_->is_header_done())) {
      auto id = parser_->get()["X-Request-Id"];
      if (sane_request_id(id)) request_id_ = std::string(id);
    }
    if (request_id_.empty()) request_id_ = generate_request_id();
    parser_.reset();
    send(std::move(r));
  }

  void on_request() {
    if (admits_large_body() && !is_large_body_request(parser_->get().target()) &&
        parser_->get().body().size() > limits().body) {
      return reject(too_large(), true);  // a chunked body over `body` on another path
    }
    if (!still_admitted()) return;
    started_ = std::chrono::steady_clock::now();
    phase_ = Phase::handling;
    auto msg = parser_->release();
    parser_.reset();
    version_ = msg.version();
    keep_alive_ = msg.keep_alive();
    Request req = make_request(std::move(msg), peer_);
    request_id_ = req.request_id;
    method_ = req.method;
    path_ = req.path;
    ++requests_;
    await_answer();
    call_handler(std::move(req), make_reply());
  }

  // While the handler works nothing is pending on the socket (so no socket timeout runs) and
  // the Reply holds the session only weakly: this wait, with no deadline, is what keeps the
  // session alive until the answer (send) or a close (close_now) cancels it. It is not a
  // timeout: the handler owns the request's deadline, and a Reply that goes unanswered answers
  // (Pending). A pending wait, unlike a reference held by the session itself, goes with the
  // io_context, so a Reply that outlives it finds no one.
  void await_answer() {
    answer_wait_.expires_at(net::steady_timer::time_point::max());
    answer_wait_.async_wait([self = this->shared_from_this()](beast::error_code) {});
  }

  // One request's answer, shared by every copy of its Reply (bmcweb's AsyncResp): the first call
  // answers, later ones are ignored; when the last copy goes without having answered, wherever
  // and on whatever thread, the request is answered 500 `internal` and the route logged, on the
  // connection's executor. Holds the session only weakly, never its executor: a Reply may outlive
  // the connection, even the io_context (then there is no one to answer, and nothing is done).
  struct Pending {
    std::weak_ptr<Session> session;
    std::uint64_t request;  // the session's requests_ when it came: its answer is for that one only
    std::atomic<bool> given{false};
    Pending(std::weak_ptr<Session> s, std::uint64_t r) : session(std::move(s)), request(r) {}
    Pending(const Pending&) = delete;
    Pending& operator=(const Pending&) = delete;
    ~Pending() {
      // No copy of the Reply is left, so no call can race this: the last reference's release
      // orders every earlier call before it.
      if (given.load(std::memory_order_relaxed)) return;
      try {
        if (auto s = session.lock()) unanswered(std::move(s), request);
      } catch (...) {  // no memory to queue it: the connection is left to its close or drain
      }
    }
  };

  Reply make_reply() {
    auto pending = std::make_shared<Pending>(this->weak_from_this(), requests_);
    return [pending = std::move(pending)](Response r) {
      if (pending->given.exchange(true)) return;
      if (auto s = pending->session.lock()) {
        // Inline when the handler answers on the connection's own strand (a read the snapshot
        // answers); queued there from any other thread.
        auto ex = s->ex_;
        net::dispatch(ex, [s = std::move(s), r = std::move(r)]() mutable { s->send(std::move(r)); });
      }
    };
  }

  // A request whose Reply went unanswered: 500, and a line naming it. Always queued, never run
  // inline: the last copy may go wherever its holder is (under its lock, inside the handler).
  // Nothing is sent when the connection has closed meanwhile (a close, the end of a drain).
  static void unanswered(std::shared_ptr<Session> s, std::uint64_t request) {
    auto ex = s->ex_;
    net::post(ex, [self = std::move(s), request] {
      if (self->closed_ || self->phase_ != Phase::handling || self->requests_ != request) return;
      self->st_->log(
          fmt::format("http: REQUEST={} {} {}: the handler let its Reply go unanswered; answered 500",
                      self->request_id_, self->method_, self->path_));
      self->send(internal_error());
    });
  }

  // The exception boundary: a handler that throws is answered 500.
  void call_handler(Request req, const Reply& reply) {
    try {
      st_->handler(std::move(req), reply);
    } catch (const std::exception& e) {
      st_->log(fmt::format("http: handler threw on {} {}: {}", method_, path_, e.what()));
      reply(internal_error());
    } catch (...) {
      st_->log(fmt::format("http: handler threw on {} {}", method_, path_));
      reply(internal_error());
    }
  }

  void send(Response r) {
    if (!still_admitted()) return;
    answer_wait_.cancel();
    unsigned status = r.status;
    if (status < 200 || status > 599) {
      st_->log(fmt::format("http: handler answered status {} on {} {}; sending 500", status, method_, path_));
      r = internal_error();
      status = 500;
    }
    st_->observe(Answered{method_, path_, status, std::chrono::steady_clock::now() - started_, peer_.kind});
    auto& res = res_.emplace(bhttp::status::ok, version_);
    const bool handler_closes = fill_response(res, status, std::move(r), request_id_);
    const bool close = !keep_alive_ || draining_ || linger_ || handler_closes;
    res.keep_alive(!close);
    res.prepare_payload();
    close_after_ = close;
    ++answered_;
    write_response();
  }

  void write_response() {
    phase_ = Phase::writing;
    lowest().expires_after(limits().write_timeout);
    bhttp::async_write(stream_, *res_, [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
      self->res_.reset();
      if (ec) {
        self->fail(ec, "write");
        return self->close_now();
      }
      if (self->closed_) return;
      if (self->linger_) return self->do_linger();
      if (self->close_after_) return self->do_close();
      self->wait_request();
    });
  }

  // A graceful close: TLS close_notify (within write_timeout), or a half-close on the socket.
  void do_close() {
    phase_ = Phase::closing;
    if constexpr (kTls) {
      lowest().expires_after(limits().write_timeout);
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code ec) {
        if (ec) self->fail(ec, "TLS shutdown");
        self->close_now();
      });
    } else {
      beast::error_code ec;
      lowest().socket().shutdown(net::socket_base::shutdown_send, ec);
      close_now();
    }
  }

  // After an error answer the client may still be sending (say the rest of a body too large):
  // read and drop it (for up to read_timeout, at most 5 s, and 1 MiB) so that closing does not
  // reset the connection before the client has read the answer.
  void do_linger() {
    phase_ = Phase::closing;
    if constexpr (!kTls) {
      beast::error_code ec;
      lowest().socket().shutdown(net::socket_base::shutdown_send, ec);
    }
    lowest().expires_after(std::min<std::chrono::seconds>(limits().read_timeout, std::chrono::seconds(5)));
    linger_read();
  }

  void linger_read() {
    stream_.async_read_some(net::buffer(scratch_),
                            [self = this->shared_from_this()](beast::error_code ec, std::size_t n) {
                              self->lingered_ += n;
                              if (ec || self->closed_ || self->lingered_ > kMaxLingerBytes)
                                return self->close_now();
                              self->linger_read();
                            });
  }

  std::shared_ptr<ServerState> st_;
  Peer peer_;
  std::string budget_address_;    // the client IP its TLS budget place is counted under (empty otherwise)
  PeerFilter filter_;             // the admin socket's, asked again by still_admitted (plain sessions)
  std::uint64_t access_checked_;  // the access generation the peer was last judged at
  std::shared_ptr<ssl::context> ctx_;  // keeps the context this connection started with
  Stream stream_;
  const net::any_io_executor ex_;  // its strand, or the io_context's executor (Limits::one_thread)
  net::steady_timer answer_wait_;  // no deadline: holds the session while its handler works
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::optional<bhttp::response<bhttp::empty_body>> continue_;
  std::optional<bhttp::response<bhttp::string_body>> res_;
  std::array<char, kReadChunk> scratch_{};
  std::size_t lingered_ = 0;
  std::string request_id_;
  std::string method_;
  std::string path_;
  std::chrono::steady_clock::time_point started_{};  // the request read whole (or refused)
  unsigned version_ = 11;
  std::uint64_t id_ = 0;
  Phase phase_ = Phase::start;
  bool registered_ = false;
  bool keep_alive_ = true;
  std::uint64_t answered_ = 0;  // answers written on this connection
  std::uint64_t requests_ = 0;  // requests handed to the handler on this connection
  bool close_after_ = false;
  bool draining_ = false;
  bool linger_ = false;
  bool closed_ = false;
};

}  // namespace

void start_plain_session(std::shared_ptr<ServerState> st, Peer peer, std::string budget_address,
                         net::generic::stream_protocol::socket socket, PeerFilter filter) {
  std::make_shared<Session<PlainStream>>(std::move(st), std::move(peer), std::move(budget_address),
                                         std::move(filter), nullptr, std::move(socket))
      ->start();
}

void start_tls_session(std::shared_ptr<ServerState> st, Peer peer, std::string budget_address,
                       std::shared_ptr<ssl::context> ctx, tcp::socket socket) {
  auto& context = *ctx;
  std::make_shared<Session<TlsStream>>(std::move(st), std::move(peer), std::move(budget_address),
                                       PeerFilter{}, std::move(ctx), std::move(socket), context)
      ->start();
}

}  // namespace gpunode::http::detail
