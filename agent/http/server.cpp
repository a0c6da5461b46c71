// The HTTP server: listeners, one Session per connection (on its own strand), graceful shutdown.
// Shape after Beast's example/http/server/async-ssl and example/advanced/server-flex-awaitable:
// a timeout before every async operation, a body and a header limit, one fail() that ignores
// ssl::error::stream_truncated. The Session is templated on its stream: TLS over TCP, or plain
// (the admin socket and metrics.listen's TCP, both as a generic stream socket: one instantiation
// of the Session's code for the two, which is most of this file's compile time).
#include "gpunode/http/server.hpp"

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <type_traits>
#include <unordered_map>

namespace gpunode::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace ssl = boost::asio::ssl;
using tcp = net::ip::tcp;
using unix_proto = net::local::stream_protocol;
using LogFn = std::function<void(std::string_view)>;

namespace detail {

class SessionBase {
 public:
  virtual ~SessionBase() = default;
  virtual void drain() = 0;        // any thread: finish the request in flight, then close
  virtual void force_close() = 0;  // any thread: close now
};

struct UnixListener {
  std::unique_ptr<unix_proto::acceptor> acceptor;
  std::string path;
  PeerFilter filter;
  dev_t dev = 0;
  ino_t ino = 0;
  bool unlinked = false;
};

struct ServerState : std::enable_shared_from_this<ServerState> {
  ServerState(net::io_context& io_ctx, Limits l, Handler h, LogFn lg, Observer o)
      : io(io_ctx), limits(l), handler(std::move(h)), log_fn(std::move(lg)), observer(std::move(o)) {}

  net::io_context& io;
  const Limits limits;
  const Handler handler;
  const LogFn log_fn;
  const Observer observer;

  // Guards everything below, and every call on an acceptor (initiating an accept, closing it).
  mutable std::mutex mu;
  std::shared_ptr<ssl::context> tls;
  std::vector<std::unique_ptr<tcp::acceptor>> tcp_acceptors;  // HTTPS and plain HTTP alike
  std::vector<std::unique_ptr<UnixListener>> unix_listeners;
  bool accepting = true;
  std::uint16_t port = 0;
  std::uint64_t next_id = 0;
  // Open connections by budget (CONTRACT §10): TLS in total and by client address, plain TCP, the
  // admin socket. Taken at accept (admit), given back when the session goes (release).
  std::size_t open_tls = 0, open_plain = 0, open_unix = 0;
  std::unordered_map<std::string, std::size_t> tls_by_address;
  // Refusals since the last line about them; a line at most once a minute.
  std::size_t refused = 0;
  std::chrono::steady_clock::time_point refusals_logged{};
  bool ever_refused = false;
  std::unordered_map<std::uint64_t, std::weak_ptr<SessionBase>> sessions;
  bool draining = false;
  std::vector<std::function<void()>> done;
  std::unique_ptr<net::steady_timer> drain_timer;

  void observe(const Answered& a) const {
    if (!observer) return;
    try {
      observer(a);
    } catch (...) {  // an observer that throws must not take a connection down
    }
  }

  void log(std::string_view message) const {
    if (!log_fn) return;
    try {
      log_fn(message);
    } catch (...) {  // a logger that throws must not take a connection down
    }
  }

  // Registers a session; says whether a shutdown is already under way.
  std::pair<std::uint64_t, bool> add(std::weak_ptr<SessionBase> s) {
    std::lock_guard lock(mu);
    auto id = ++next_id;
    sessions.emplace(id, std::move(s));
    return {id, draining};
  }

  void remove(std::uint64_t id) {
    std::vector<std::function<void()>> fire;
    {
      std::lock_guard lock(mu);
      sessions.erase(id);
      if (draining && sessions.empty() && !done.empty()) {
        fire.swap(done);
        if (drain_timer) drain_timer->cancel();
      }
    }
    for (auto& f : fire) net::post(io, std::move(f));
  }

  // The live sessions. Call without holding mu; drop the result without holding it too.
  std::vector<std::shared_ptr<SessionBase>> live() {
    std::vector<std::shared_ptr<SessionBase>> out;
    std::lock_guard lock(mu);
    for (auto& [id, w] : sessions) {
      if (auto s = w.lock()) out.push_back(std::move(s));
    }
    return out;
  }

  void stop_accepting() {
    std::lock_guard lock(mu);
    accepting = false;
    beast::error_code ec;
    for (auto& a : tcp_acceptors) a->close(ec);
    for (auto& l : unix_listeners) {
      l->acceptor->close(ec);
      struct stat st {};
      if (!l->unlinked && ::lstat(l->path.c_str(), &st) == 0 && st.st_dev == l->dev && st.st_ino == l->ino) {
        ::unlink(l->path.c_str());
      }
      l->unlinked = true;
    }
  }

  // Whether a new connection of `kind` from `address` fits the budgets; takes its place if it does.
  // `address` is the client's IP for TLS (empty otherwise).
  bool admit(Peer::Kind kind, const std::string& address) {
    std::string line;
    {
      std::lock_guard lock(mu);
      std::string why;
      switch (kind) {
        case Peer::Kind::tcp: {
          auto& mine = tls_by_address[address];
          if (limits.max_connections != 0 && open_tls >= limits.max_connections) {
            why = fmt::format("the {} HTTPS connections of api.max_connections are open",
                              limits.max_connections);
          } else if (limits.max_connections_per_client != 0 && mine >= limits.max_connections_per_client) {
            why = fmt::format("{} has the {} connections of api.max_connections_per_client open", address,
                              limits.max_connections_per_client);
          } else {
            ++open_tls;
            ++mine;
            return true;
          }
          if (mine == 0) tls_by_address.erase(address);
          break;
        }
        case Peer::Kind::plain_tcp:
          if (limits.max_plain_connections == 0 || open_plain < limits.max_plain_connections) {
            ++open_plain;
            return true;
          }
          why = fmt::format("the {} connections of the metrics listener are open",
                            limits.max_plain_connections);
          break;
        case Peer::Kind::unix_socket:
          if (limits.max_unix_connections == 0 || open_unix < limits.max_unix_connections) {
            ++open_unix;
            return true;
          }
          why = fmt::format("the {} connections of admin.max_connections are open",
                            limits.max_unix_connections);
          break;
      }
      ++refused;
      const auto now = std::chrono::steady_clock::now();
      if (!ever_refused || now - refusals_logged >= std::chrono::minutes(1)) {
        line = fmt::format(
            "connections refused: {} since the last such line ({}); the next line comes a minute from now at "
            "the soonest",
            refused, why);
        refused = 0;
        refusals_logged = now;
        ever_refused = true;
      }
    }
    if (!line.empty()) log(line);
    return false;
  }

  void release(Peer::Kind kind, const std::string& address) {
    std::lock_guard lock(mu);
    switch (kind) {
      case Peer::Kind::tcp: {
        --open_tls;
        auto it = tls_by_address.find(address);
        if (it != tls_by_address.end() && --it->second == 0) tls_by_address.erase(it);
        break;
      }
      case Peer::Kind::plain_tcp:
        --open_plain;
        break;
      case Peer::Kind::unix_socket:
        --open_unix;
        break;
    }
  }

  void retry_later(std::function<void()> f) {
    auto t = std::make_shared<net::steady_timer>(io, std::chrono::milliseconds(100));
    t->async_wait([t, f = std::move(f)](beast::error_code ec) {
      if (!ec) f();
    });
  }

  void accept_tcp(tcp::acceptor* a, bool plain);
  void on_tcp_accept(tcp::acceptor* a, bool plain, beast::error_code ec, tcp::socket socket);
  void accept_unix(UnixListener* l);
  void on_unix_accept(UnixListener* l, beast::error_code ec, unix_proto::socket socket);
};

}  // namespace detail

namespace {

using detail::ServerState;
using detail::SessionBase;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;
using PlainStream =
    beast::basic_stream<net::generic::stream_protocol, net::any_io_executor, beast::unlimited_rate_policy>;

constexpr std::size_t kReadChunk = 4096;
constexpr std::size_t kMaxLingerBytes = 1024 * 1024;

bool is_token_char(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view{"!#$%&'*+-.^_`|~"}.find(c) != std::string_view::npos;
}

bool valid_header(std::string_view name, std::string_view value) {
  if (name.empty() || !std::all_of(name.begin(), name.end(), is_token_char)) return false;
  return value.find_first_of(std::string_view{"\r\n\0", 3}) == std::string_view::npos;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string endpoint_text(const tcp::endpoint& ep) {
  if (ep.address().is_v6()) return fmt::format("[{}]:{}", ep.address().to_string(), ep.port());
  return fmt::format("{}:{}", ep.address().to_string(), ep.port());
}

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
  Session(std::shared_ptr<ServerState> st, Peer peer, std::string budget_address,
          std::shared_ptr<ssl::context> ctx, Args&&... stream_args)
      : st_(std::move(st)),
        peer_(std::move(peer)),
        budget_address_(std::move(budget_address)),
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
      if (self->phase_ == Phase::idle) self->lowest().cancel();  // the idle read ends; wait_request closes
    });
  }

  void force_close() override {
    net::post(ex_, [self = this->shared_from_this()] { self->close_now(); });
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
    if (draining_) return do_close();
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
    lowest().expires_after(limits().read_timeout);
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
                        if (ec) return self->on_read_error(ec);
                        self->on_request();
                      });
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
    return problem(
        413, "body-too-large", "Request body too large",
        fmt::format("the request body exceeds {} bytes", large ? limits().large_body : limits().body));
  }

  void on_read_error(const beast::error_code& ec) {
    if (ec == bhttp::error::body_limit) {
      // Beast checks Content-Length against the limit once every field is parsed.
      return reject(too_large(), true);
    }
    if (ec == bhttp::error::header_limit) {
      return reject(problem(431, "headers-too-large", "Request headers too large",
                            fmt::format("the request headers exceed {} bytes", limits().header)));
    }
    if (&ec.category() == &bhttp::make_error_code(bhttp::error::bad_method).category() &&
        ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
      return reject(problem(400, "invalid-request", "Malformed HTTP request",
                            fmt::format("the request is not valid HTTP/1.1: {}", ec.message())));
    }
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
    started_ = std::chrono::steady_clock::now();
    phase_ = Phase::handling;
    auto msg = parser_->release();
    parser_.reset();
    version_ = msg.version();
    keep_alive_ = msg.keep_alive();

    Request req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    if (auto q = req.target.find('?'); q != std::string::npos) {
      req.path = req.target.substr(0, q);
      req.query = req.target.substr(q + 1);
    } else {
      req.path = req.target;
    }
    for (const auto& field : msg) {
      req.headers.emplace_back(lower(field.name_string()), std::string(field.value()));
    }
    req.body = std::move(msg.body());
    req.peer = peer_;
    auto id = req.header("x-request-id");
    req.request_id = id && sane_request_id(*id) ? std::string(*id) : generate_request_id();
    request_id_ = req.request_id;

    // While the handler works nothing is pending on the socket (so no socket timeout runs) and
    // the Reply holds the session only weakly: this wait, with no deadline, is what keeps the
    // session alive until the answer (send) or a close (close_now) cancels it. It is not a
    // timeout: the handler owns the request's deadline. A pending wait, unlike a reference held
    // by the session itself, goes with the io_context, so a Reply that outlives it finds no one.
    answer_wait_.expires_at(net::steady_timer::time_point::max());
    answer_wait_.async_wait([self = this->shared_from_this()](beast::error_code) {});
    auto token = std::make_shared<std::atomic<bool>>(false);
    // Holds only a weak pointer (never the executor): a handler may keep a Reply past the
    // connection, even past the io_context.
    Reply reply = [weak = this->weak_from_this(), token](Response r) {
      if (token->exchange(true)) return;
      if (auto s = weak.lock()) {
        auto ex = s->ex_;
        net::post(ex, [s = std::move(s), r = std::move(r)]() mutable { s->send(std::move(r)); });
      }
    };
    method_ = req.method;
    path_ = req.path;
    try {
      st_->handler(std::move(req), reply);
    } catch (const std::exception& e) {
      st_->log(fmt::format("http: handler threw on {} {}: {}", method_, path_, e.what()));
      reply(problem(500, "internal", "Internal error", "the request could not be handled"));
    } catch (...) {
      st_->log(fmt::format("http: handler threw on {} {}", method_, path_));
      reply(problem(500, "internal", "Internal error", "the request could not be handled"));
    }
  }

  void send(Response r) {
    if (closed_) return;
    answer_wait_.cancel();
    unsigned status = r.status;
    if (status < 200 || status > 599) {
      st_->log(fmt::format("http: handler answered status {} on {} {}; sending 500", status, method_, path_));
      r = problem(500, "internal", "Internal error", "the request could not be handled");
      status = 500;
    }
    st_->observe(Answered{method_, path_, status, std::chrono::steady_clock::now() - started_, peer_.kind});
    bool close = !keep_alive_ || draining_ || linger_;
    auto& res = res_.emplace(bhttp::status::ok, version_);
    res.result(status);
    bool has_type = false;
    for (const auto& [name, value] : r.headers) {
      if (!valid_header(name, value)) continue;
      auto n = lower(name);
      if (n == "content-length" || n == "transfer-encoding" || n == "x-request-id") continue;
      if (n == "connection") {
        if (beast::iequals(value, "close")) close = true;
        continue;
      }
      if (n == "content-type") has_type = true;
      res.insert(name, value);
    }
    res.set("X-Request-Id", request_id_);
    if (status == 204 || status == 304) {
      res.erase(bhttp::field::content_type);
    } else {
      if (!has_type) res.set(bhttp::field::content_type, "application/json");
      res.body() = std::move(r.body);
    }
    res.keep_alive(!close);
    res.prepare_payload();
    close_after_ = close;

    phase_ = Phase::writing;
    lowest().expires_after(limits().write_timeout);
    bhttp::async_write(stream_, res, [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
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
  std::string budget_address_;  // the client IP its TLS budget place is counted under (empty otherwise)
  std::shared_ptr<ssl::context> ctx_;  // keeps the context this connection started with
  Stream stream_;
  const net::any_io_executor ex_;  // the connection's strand
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
  bool close_after_ = false;
  bool draining_ = false;
  bool linger_ = false;
  bool closed_ = false;
};

// The endpoint to bind for `host` (empty or "*": every IPv4 address; an IPv4 or IPv6 address; or a
// host name, resolved here, at start, never on a request's path).
std::expected<tcp::endpoint, std::string> endpoint_of(net::io_context& io, const std::string& host,
                                                      std::uint16_t port) {
  if (host.empty() || host == "*") return tcp::endpoint(net::ip::address_v4::any(), port);
  beast::error_code ec;
  auto addr = net::ip::make_address(host, ec);
  if (!ec) return tcp::endpoint(addr, port);
  tcp::resolver resolver(io);
  auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || results.empty()) {
    return std::unexpected(
        fmt::format("cannot resolve {}: {}", host, ec ? ec.message() : std::string("no address")));
  }
  return results.begin()->endpoint();
}

// Whether something answers on the unix socket at `path` (a live server: do not steal it).
bool unix_socket_alive(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::memcpy(sa.sun_path, path.c_str(), path.size() + 1);
  bool alive = ::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0;
  ::close(fd);
  return alive;
}

// The admin socket's directory (CONTRACT §7): made mode 0750 if missing, and given to the admin
// group so that its members can reach the socket. Only the last level is made: a missing parent
// (a mistyped admin.socket) is an error. One that exists is left as it is.
std::expected<void, std::string> make_socket_dir(const std::string& path, std::optional<gid_t> group) {
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) return {};
  if (::mkdir(dir.c_str(), 0700) != 0) {  // 0700 until it has its group, then 0750
    if (errno == EEXIST) return {};
    return std::unexpected(fmt::format("admin socket {}: cannot create its directory {}: {}", path,
                                       dir.string(), std::strerror(errno)));
  }
  if (group && ::chown(dir.c_str(), static_cast<uid_t>(-1), *group) != 0) {
    return std::unexpected(fmt::format("admin socket {}: cannot give its directory {} to group {}: {}", path,
                                       dir.string(), *group, std::strerror(errno)));
  }
  if (::chmod(dir.c_str(), 0750) != 0) {
    return std::unexpected(fmt::format("admin socket {}: cannot chmod its directory {}: {}", path,
                                       dir.string(), std::strerror(errno)));
  }
  return {};
}

// The peer's supplementary groups from the socket (SO_PEERGROUPS, Linux 4.13): its credentials
// when it connected, with no NSS lookup. ERANGE says the buffer was short and sets `len` to the
// size needed; the groups cannot change on a connected socket, so one retry at that size is enough
// (a few more are allowed all the same).
std::expected<std::vector<gid_t>, std::string> peer_groups(int fd) {
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      return groups;
    }
    if (errno != ERANGE) return std::unexpected(std::string(std::strerror(errno)));
    groups.resize(std::max<std::size_t>(len / sizeof(gid_t), groups.size() * 2));
  }
  return std::unexpected(std::string("the group list kept growing"));
}

}  // namespace

namespace detail {

void ServerState::accept_tcp(tcp::acceptor* a, bool plain) {
  std::lock_guard lock(mu);
  if (!accepting) return;
  a->async_accept(net::make_strand(io),
                  [self = shared_from_this(), a, plain](beast::error_code ec, tcp::socket socket) {
                    self->on_tcp_accept(a, plain, ec, std::move(socket));
                  });
}

void ServerState::on_tcp_accept(tcp::acceptor* a, bool plain, beast::error_code ec, tcp::socket socket) {
  if (ec) {
    if (ec == net::error::operation_aborted) return;
    {
      std::lock_guard lock(mu);
      if (!accepting) return;
    }
    log(fmt::format("http: accept failed: {}", ec.message()));
    retry_later([self = shared_from_this(), a, plain] { self->accept_tcp(a, plain); });
    return;
  }
  std::shared_ptr<ssl::context> ctx;
  if (!plain) {
    std::lock_guard lock(mu);
    ctx = tls;
  }
  Peer peer;
  peer.kind = plain ? Peer::Kind::plain_tcp : Peer::Kind::tcp;
  beast::error_code rec;
  socket.set_option(tcp::no_delay(true), rec);  // responses are whole; never wait for Nagle
  auto remote = socket.remote_endpoint(rec);
  peer.address = rec ? std::string("?") : endpoint_text(remote);
  std::string client = plain || rec ? std::string() : remote.address().to_string();
  if (!admit(peer.kind, client)) {
    beast::error_code cec;
    socket.close(cec);  // at once: not a byte read, no TLS
  } else if (plain) {
    std::make_shared<Session<PlainStream>>(shared_from_this(), std::move(peer), std::move(client), nullptr,
                                           net::generic::stream_protocol::socket(std::move(socket)))
        ->start();
  } else {
    auto& context = *ctx;
    std::make_shared<Session<TlsStream>>(shared_from_this(), std::move(peer), std::move(client),
                                         std::move(ctx), std::move(socket), context)
        ->start();
  }
  accept_tcp(a, plain);
}

void ServerState::accept_unix(UnixListener* l) {
  std::lock_guard lock(mu);
  if (!accepting) return;
  l->acceptor->async_accept(net::make_strand(io),
                            [self = shared_from_this(), l](beast::error_code ec, unix_proto::socket socket) {
                              self->on_unix_accept(l, ec, std::move(socket));
                            });
}

void ServerState::on_unix_accept(UnixListener* l, beast::error_code ec, unix_proto::socket socket) {
  if (ec) {
    if (ec == net::error::operation_aborted) return;
    {
      std::lock_guard lock(mu);
      if (!accepting) return;
    }
    log(fmt::format("admin socket {}: accept failed: {}", l->path, ec.message()));
    retry_later([self = shared_from_this(), l] { self->accept_unix(l); });
    return;
  }
  Peer peer;
  peer.kind = Peer::Kind::unix_socket;
  peer.address = l->path;
  ucred cred{};
  socklen_t len = sizeof cred;
  bool ok = false;
  if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && len == sizeof cred) {
    peer.uid = cred.uid;
    peer.gid = cred.gid;
    peer.pid = cred.pid;
    if (auto groups = peer_groups(socket.native_handle())) {
      peer.groups = std::move(*groups);
    } else {
      log(fmt::format("admin socket {}: cannot read the supplementary groups of peer uid={} pid={}: {}",
                      l->path, cred.uid, cred.pid, groups.error()));
    }
    try {
      ok = !l->filter || l->filter(peer);
    } catch (...) {
      ok = false;
    }
    if (!ok) {
      log(fmt::format("admin socket {}: refused peer uid={} gid={} pid={}", l->path, cred.uid, cred.gid,
                      cred.pid));
    }
  } else {
    log(fmt::format("admin socket {}: refused a peer: cannot read SO_PEERCRED: {}", l->path,
                    std::strerror(errno)));
  }
  if (ok && admit(Peer::Kind::unix_socket, {})) {
    std::make_shared<Session<PlainStream>>(shared_from_this(), std::move(peer), std::string(), nullptr,
                                           net::generic::stream_protocol::socket(std::move(socket)))
        ->start();
  } else {
    beast::error_code cec;
    socket.close(cec);
  }
  accept_unix(l);
}

}  // namespace detail

Server::Server(net::io_context& io, Limits limits, Handler handler, std::function<void(std::string_view)> log,
               Observer observer)
    : state_(std::make_shared<detail::ServerState>(io, limits, std::move(handler), std::move(log),
                                                   std::move(observer))) {}

Server::~Server() {
  state_->stop_accepting();
  auto live = state_->live();
  for (auto& s : live) s->force_close();
}

namespace {

// Binds and listens on host:port for listen_tls and listen_plain; errors name the address and the step.
std::expected<std::unique_ptr<tcp::acceptor>, std::string> bind_tcp(net::io_context& io,
                                                                    const std::string& listen,
                                                                    const std::string& host,
                                                                    std::uint16_t port) {
  auto ep = endpoint_of(io, host, port);
  if (!ep) return std::unexpected(fmt::format("cannot listen on {}: {}", listen, ep.error()));
  auto a = std::make_unique<tcp::acceptor>(io);
  beast::error_code ec;
  auto failed = [&](std::string_view step) {
    return std::unexpected(fmt::format("cannot listen on {}: {}: {}", listen, step, ec.message()));
  };
  if (a->open(ep->protocol(), ec); ec) return failed("open");
  if (a->set_option(net::socket_base::reuse_address(true), ec); ec) return failed("SO_REUSEADDR");
  if (a->bind(*ep, ec); ec) return failed("bind");
  if (a->listen(net::socket_base::max_listen_connections, ec); ec) return failed("listen");
  return a;
}

std::string listen_text(const std::string& host, std::uint16_t port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

}  // namespace

std::expected<void, std::string> Server::listen_tls(const std::string& host, std::uint16_t port,
                                                    std::shared_ptr<ssl::context> tls) {
  const std::string listen = listen_text(host, port);
  if (!tls) return std::unexpected(fmt::format("listen {}: no TLS context", listen));
  auto a = bind_tcp(state_->io, listen, host, port);
  if (!a) return std::unexpected(a.error());
  beast::error_code ec;
  auto bound = (*a)->local_endpoint(ec);
  tcp::acceptor* raw = a->get();
  {
    std::lock_guard lock(state_->mu);
    if (!state_->accepting)
      return std::unexpected(fmt::format("listen {}: the server is shutting down", listen));
    state_->tls = std::move(tls);
    if (state_->port == 0 && !ec) state_->port = bound.port();
    state_->tcp_acceptors.push_back(std::move(*a));
  }
  state_->accept_tcp(raw, false);
  return {};
}

std::expected<void, std::string> Server::listen_plain(const std::string& host, std::uint16_t port) {
  const std::string listen = listen_text(host, port);
  auto a = bind_tcp(state_->io, listen, host, port);
  if (!a) return std::unexpected(a.error());
  tcp::acceptor* raw = a->get();
  {
    std::lock_guard lock(state_->mu);
    if (!state_->accepting)
      return std::unexpected(fmt::format("listen {}: the server is shutting down", listen));
    state_->tcp_acceptors.push_back(std::move(*a));
  }
  state_->accept_tcp(raw, true);
  return {};
}

std::expected<void, std::string> Server::listen_unix(const std::string& path, unsigned mode,
                                                     std::optional<gid_t> group, PeerFilter filter) {
  if (path.empty() || path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return std::unexpected(fmt::format("admin socket {}: path empty or too long", path));
  }
  if (auto made = make_socket_dir(path, group); !made) return std::unexpected(made.error());
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return std::unexpected(fmt::format("admin socket {}: exists and is not a socket", path));
    if (unix_socket_alive(path)) {
      return std::unexpected(fmt::format("admin socket {}: another process is listening on it", path));
    }
    if (::unlink(path.c_str()) != 0) {
      return std::unexpected(
          fmt::format("admin socket {}: cannot remove the stale socket: {}", path, std::strerror(errno)));
    }
  } else if (errno != ENOENT) {
    return std::unexpected(fmt::format("admin socket {}: {}", path, std::strerror(errno)));
  }
  auto l = std::make_unique<detail::UnixListener>();
  l->acceptor = std::make_unique<unix_proto::acceptor>(state_->io);
  l->path = path;
  l->filter = std::move(filter);
  beast::error_code ec;
  auto failed = [&](std::string_view step, std::string why) {
    return std::unexpected(fmt::format("admin socket {}: {}: {}", path, step, why));
  };
  if (l->acceptor->open(unix_proto(), ec); ec) return failed("socket", ec.message());
  if (l->acceptor->bind(unix_proto::endpoint(path), ec); ec) return failed("bind", ec.message());
  // Nobody can connect before listen(), so the socket is the group's and has its mode first.
  // (fchown on the socket's descriptor would change the socket, not the file that names it.)
  if (group && ::chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0) {
    auto why = std::string(std::strerror(errno));
    ::unlink(path.c_str());
    return failed(fmt::format("cannot give it to group {}", *group), why);
  }
  // chmod after bind: the mode does not depend on the umask.
  if (::chmod(path.c_str(), static_cast<mode_t>(mode)) != 0 || ::lstat(path.c_str(), &st) != 0) {
    auto why = std::string(std::strerror(errno));
    ::unlink(path.c_str());
    return failed("chmod", why);
  }
  l->dev = st.st_dev;
  l->ino = st.st_ino;
  if (l->acceptor->listen(net::socket_base::max_listen_connections, ec); ec) {
    ::unlink(path.c_str());
    return failed("listen", ec.message());
  }
  detail::UnixListener* raw = l.get();
  {
    std::lock_guard lock(state_->mu);
    if (!state_->accepting) {
      ::unlink(path.c_str());
      return std::unexpected(fmt::format("admin socket {}: the server is shutting down", path));
    }
    state_->unix_listeners.push_back(std::move(l));
  }
  state_->accept_unix(raw);
  return {};
}

void Server::set_tls_context(std::shared_ptr<ssl::context> tls) {
  if (!tls) return;
  std::lock_guard lock(state_->mu);
  state_->tls = std::move(tls);
}

std::uint16_t Server::tls_port() const {
  std::lock_guard lock(state_->mu);
  return state_->port;
}

void Server::stop_accepting() {
  state_->stop_accepting();
}

void Server::shutdown(std::chrono::milliseconds drain, std::function<void()> done) {
  state_->stop_accepting();
  std::vector<std::function<void()>> fire;
  std::vector<std::shared_ptr<detail::SessionBase>> live;  // released after the lock
  {
    std::lock_guard lock(state_->mu);
    state_->draining = true;
    for (auto& [id, w] : state_->sessions) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
    if (done) state_->done.push_back(std::move(done));
    if (state_->sessions.empty()) {
      fire.swap(state_->done);
    } else {
      state_->drain_timer = std::make_unique<net::steady_timer>(state_->io, drain);
      state_->drain_timer->async_wait([st = state_](beast::error_code ec) {
        if (ec) return;
        auto remaining = st->live();
        if (!remaining.empty())
          st->log(fmt::format("http: closing {} connection(s) still open after the drain", remaining.size()));
        for (auto& s : remaining) s->force_close();
      });
    }
  }
  for (auto& f : fire) net::post(state_->io, std::move(f));
  for (auto& s : live) s->drain();
}

std::size_t Server::open_connections() const {
  std::lock_guard lock(state_->mu);
  return state_->sessions.size();
}

}  // namespace gpunode::http
