// api_bench: the client half of the API benchmark (tests/bench/api_bench.py drives it).
//
//   api_bench get    --port P --ca FILE --path PATH [--token-file F] [--warmup N] [--requests N]
//                    [--conns N] [--per-conn N] [--save-body FILE]
//   api_bench post   --port P --ca FILE --path PATH --token-file F --unit ID [--warmup N] [--requests N]
//                    [--kind later|now] [--offset HOURS]
//   api_bench commit --dir DIR [--warmup N] [--transactions N] [--pace-us P]
//   api_bench pairs  --port P --ca FILE --token-file F --path-a A --path-b B [--pairs N] [--warmup N]
//                    [--status S]
//
// get     GET PATH over TLS to 127.0.0.1:P with keep-alive: latency of `requests` sequential
//         requests on one connection after `warmup`, then throughput of `conns` connections
//         doing `per-conn` requests each at once (one thread per connection, all connected and
//         warmed up before the clock starts). Every answer must be 200.
// post    POST PATH (a reservation create) `requests` times on one keep-alive connection after
//         `warmup`. `later` (the default): the same unit, consecutive one-hour terms starting a
//         year (and `offset` hours) from now, so none overlaps. `now`: a term that starts now (the
//         create checks the unit's occupancy), then POST .../end of it (timed too), so the unit is
//         free for the next. Every answer must be 201 (200 for an end). `create_every`: the
//         time from one create's start to the next's (the pace the agent commits at).
// commit  the reference for post: a bare SQLite database in DIR (journal_mode=WAL,
//         synchronous=FULL, as the agent's), `transactions` transactions inserting one row of
//         kRowBytes each, then as many inserting three (the agent's reservation + audit + outbox),
//         back to back; with `pace-us`, as many three-row ones again, one every P µs (asleep in
//         between): a commit costs more the longer the disk has been idle before it.
// pairs   A and B asked alternately on one keep-alive connection, `pairs` times after `warmup` pairs,
//         which of the two goes first in a pair drawn at random: each one's latencies, the median
//         of the paired differences (A - B) and how often A was the slower. Every answer must be
//         `status` (default 404): CONTRACT §10 "Hiding includes time" (hiding_bench.py).
//
// Each prints one JSON object on stdout (latencies in microseconds); the driver makes the table.
// The client pins TLS 1.3 with TLS_AES_128_GCM_SHA256 so every server is measured with the same
// suite, and sets TCP_NODELAY on its side. Not a test: never run by ctest.
#include <fmt/format.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace ssl = boost::asio::ssl;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "api_bench: %s\n", what.c_str());
  std::exit(1);
}

double micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

struct Summary {
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
  std::size_t n = 0;
};

Summary summarize(std::vector<double> us) {
  Summary s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  auto at = [&](double q) {
    return us[static_cast<std::size_t>(q * static_cast<double>(us.size() - 1) + 0.5)];
  };
  s.p50 = at(0.50);
  s.p90 = at(0.90);
  s.p99 = at(0.99);
  s.max = us.back();
  double sum = 0;
  for (double v : us) sum += v;
  s.mean = sum / static_cast<double>(us.size());
  s.n = us.size();
  return s;
}

std::string json_of(const Summary& s) {
  return fmt::format(
      R"({{"n": {}, "p50_us": {:.1f}, "p90_us": {:.1f}, "p99_us": {:.1f}, "max_us": {:.1f}, "mean_us": {:.1f}}})",
      s.n, s.p50, s.p90, s.p99, s.max, s.mean);
}

// --option value pairs after the mode.
struct Args {
  std::map<std::string, std::string> kv;
  std::string str(const std::string& k) const {
    auto it = kv.find(k);
    if (it == kv.end()) die("missing --" + k);
    return it->second;
  }
  std::string str(const std::string& k, const std::string& dflt) const {
    auto it = kv.find(k);
    return it == kv.end() ? dflt : it->second;
  }
  int num(const std::string& k, int dflt) const {
    auto it = kv.find(k);
    if (it == kv.end()) return dflt;
    try {
      return std::stoi(it->second);
    } catch (const std::exception&) {
      die(fmt::format("--{}: not a number: {}", k, it->second));
    }
  }
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) die("cannot read " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// ---- the HTTPS client -----------------------------------------------------------------------

ssl::context make_tls(const std::string& ca) {
  ssl::context ctx(ssl::context::tls_client);
  ctx.set_verify_mode(ssl::verify_peer);
  ctx.load_verify_file(ca);
  SSL_CTX* h = ctx.native_handle();
  if (SSL_CTX_set_min_proto_version(h, TLS1_3_VERSION) != 1 ||
      SSL_CTX_set_ciphersuites(h, "TLS_AES_128_GCM_SHA256") != 1) {
    die("cannot pin TLS 1.3 / TLS_AES_128_GCM_SHA256");
  }
  return ctx;
}

class Conn {
 public:
  Conn(ssl::context& ctx, unsigned short port) : stream_(io_, ctx) {
    tcp::endpoint ep(net::ip::make_address("127.0.0.1"), port);
    beast::get_lowest_layer(stream_).connect(ep);
    beast::get_lowest_layer(stream_).socket().set_option(tcp::no_delay(true));
    // The certificates are for IP:127.0.0.1 (and DNS:localhost): check the IP.
    X509_VERIFY_PARAM* param = SSL_get0_param(stream_.native_handle());
    if (X509_VERIFY_PARAM_set1_ip_asc(param, "127.0.0.1") != 1) die("cannot set the expected peer IP");
    stream_.handshake(ssl::stream_base::client);
  }

  std::string cipher() const {
    SSL* s = const_cast<beast::ssl_stream<beast::tcp_stream>&>(stream_).native_handle();
    return fmt::format("{} {}", SSL_get_version(s), SSL_get_cipher_name(s));
  }

  // One request/response on the open connection; returns the status, fills body.
  unsigned roundtrip(bhttp::request<bhttp::string_body>& req, std::string& body) {
    bhttp::write(stream_, req);
    bhttp::response<bhttp::string_body> res;
    bhttp::read(stream_, buf_, res);
    if (!res.keep_alive()) die("the server closed the connection (no keep-alive)");
    body = std::move(res.body());
    return res.result_int();
  }

 private:
  net::io_context io_;
  beast::ssl_stream<beast::tcp_stream> stream_;
  beast::flat_buffer buf_;
};

bhttp::request<bhttp::string_body> make_request(bhttp::verb verb, const std::string& path,
                                                const std::string& token) {
  bhttp::request<bhttp::string_body> req{verb, path, 11};
  req.set(bhttp::field::host, "127.0.0.1");
  req.set(bhttp::field::user_agent, "gpunode-api-bench");
  req.keep_alive(true);
  if (!token.empty()) req.set(bhttp::field::authorization, "Bearer " + token);
  return req;
}

void expect(unsigned got, unsigned want, const std::string& what, const std::string& body) {
  if (got != want) die(fmt::format("{}: status {} (want {}): {}", what, got, want, body.substr(0, 400)));
}

// The options of `get`.
struct GetOptions {
  unsigned short port = 0;
  std::string path, token;
  int warmup = 0, requests = 0, conns = 0, per_conn = 0;
  unsigned want = 0;
  std::optional<std::string> save_body;
};

GetOptions get_options(const Args& a) {
  GetOptions g;
  g.port = static_cast<unsigned short>(a.num("port", 0));
  g.path = a.str("path");
  g.token = a.kv.contains("token-file") ? read_file(a.str("token-file")) : "";
  g.warmup = a.num("warmup", 200);
  g.requests = a.num("requests", 2000);
  g.conns = a.num("conns", 4);
  g.per_conn = a.num("per-conn", 2000);
  g.want = static_cast<unsigned>(a.num("status", 200));  // e.g. 304 for a long poll with wait=0s
  if (a.kv.contains("save-body")) g.save_body = a.str("save-body");
  return g;
}

// 1. latency, one connection
struct OneConn {
  std::string cipher;
  std::size_t body_bytes = 0;
  Summary lat;
};

OneConn get_one_conn(const GetOptions& g, ssl::context& ctx) {
  OneConn r;
  std::string body;
  std::vector<double> lat;
  Conn c(ctx, g.port);
  r.cipher = c.cipher();
  auto req = make_request(bhttp::verb::get, g.path, g.token);
  req.prepare_payload();
  for (int i = 0; i < g.warmup; ++i) expect(c.roundtrip(req, body), g.want, "GET " + g.path, body);
  r.body_bytes = body.size();
  if (g.save_body) {  // what nginx serves beside it: the same bytes
    std::ofstream out(*g.save_body, std::ios::binary);
    out << body;
    if (!out) die("cannot write " + *g.save_body);
  }
  lat.reserve(static_cast<std::size_t>(g.requests));
  for (int i = 0; i < g.requests; ++i) {
    auto t0 = Clock::now();
    unsigned st = c.roundtrip(req, body);
    lat.push_back(micros(Clock::now() - t0));
    expect(st, g.want, "GET " + g.path, body);
  }
  r.lat = summarize(lat);
  return r;
}

// 2. throughput, `conns` connections at once
struct Loaded {
  Summary lat;
  std::size_t requests_total = 0;
  double seconds = 0;
};

Loaded get_loaded(const GetOptions& g, ssl::context& ctx) {
  const int conns = g.conns, per_conn = g.per_conn;
  const unsigned want = g.want;
  const std::string& path = g.path;
  std::vector<std::vector<double>> per(static_cast<std::size_t>(conns));
  std::vector<Clock::time_point> ends(static_cast<std::size_t>(conns));
  Clock::time_point start;
  std::barrier sync(conns, [&]() noexcept { start = Clock::now(); });
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < conns; ++t) {
    threads.emplace_back([&, t] {
      auto& mine = per[static_cast<std::size_t>(t)];
      mine.reserve(static_cast<std::size_t>(per_conn));
      std::optional<Conn> c;
      std::string b;
      auto req = make_request(bhttp::verb::get, path, g.token);
      req.prepare_payload();
      try {
        c.emplace(ctx, g.port);
        for (int i = 0; i < 20; ++i) expect(c->roundtrip(req, b), want, "GET " + path, b);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "api_bench: connection %d: %s\n", t, e.what());
        failed = 1;
      }
      sync.arrive_and_wait();
      if (failed) return;
      try {
        for (int i = 0; i < per_conn; ++i) {
          auto t0 = Clock::now();
          unsigned st = c->roundtrip(req, b);
          mine.push_back(micros(Clock::now() - t0));
          expect(st, want, "GET " + path, b);
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "api_bench: connection %d: %s\n", t, e.what());
        failed = 1;
      }
      ends[static_cast<std::size_t>(t)] = Clock::now();
    });
  }
  for (auto& th : threads) th.join();
  if (failed) die("a concurrent connection failed");
  const auto end = *std::max_element(ends.begin(), ends.end());
  std::vector<double> all;
  for (auto& v : per) all.insert(all.end(), v.begin(), v.end());
  return {summarize(all), all.size(), std::chrono::duration<double>(end - start).count()};
}

int run_get(const Args& a) {
  const GetOptions g = get_options(a);
  auto ctx = make_tls(a.str("ca"));
  const OneConn one = get_one_conn(g, ctx);
  const Loaded loaded = get_loaded(g, ctx);
  const double rps = static_cast<double>(loaded.requests_total) / loaded.seconds;

  fmt::print(
      R"({{"mode": "get", "path": "{}", "tls": "{}", "body_bytes": {}, "one_conn": {}, "conns": {}, "per_conn": {}, "requests_total": {}, "seconds": {:.3f}, "rps": {:.0f}, "loaded": {}}})"
      "\n",
      g.path, one.cipher, one.body_bytes, json_of(one.lat), g.conns, g.per_conn, loaded.requests_total,
      loaded.seconds, rps, json_of(loaded.lat));
  return 0;
}

// RFC 3339 UTC, whole seconds.
std::string rfc3339(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char out[32];
  std::strftime(out, sizeof out, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return out;
}

int run_post(const Args& a) {
  const auto port = static_cast<unsigned short>(a.num("port", 0));
  const std::string path = a.str("path");
  const std::string token = read_file(a.str("token-file"));
  const std::string unit = a.str("unit");
  const int warmup = a.num("warmup", 10), requests = a.num("requests", 300);
  const bool now = a.str("kind", "later") == "now";
  auto ctx = make_tls(a.str("ca"));
  // Terms: one hour each, back to back, starting on the hour a year (and `offset` hours) from now.
  const std::time_t base = (std::time(nullptr) / 3600 + 24 * 366 + a.num("offset", 0)) * 3600;
  Conn c(ctx, port);
  std::string body;
  std::vector<double> lat, missing, ends, every;
  lat.reserve(static_cast<std::size_t>(requests));
  missing.reserve(static_cast<std::size_t>(requests));
  // Between two creates, an authenticated GET of a reservation that does not exist, on the same
  // connection: what a request costs without a commit (TLS, HTTP, the token, the hop to the
  // state thread), so that create minus it is the commit's share.
  auto absent = make_request(bhttp::verb::get, path + "/r-api-bench-absent", token);
  absent.prepare_payload();
  Clock::time_point last_start{};
  for (int i = 0; i < warmup + requests; ++i) {
    auto req = make_request(bhttp::verb::post, path, token);
    req.set(bhttp::field::content_type, "application/json");
    req.body() =
        now ? fmt::format(
                  R"({{"unitIds": ["{}"], "audienceOrgIds": ["org-bench"], "endsAt": "{}", "note": "api_bench {}"}})",
                  unit, rfc3339(std::time(nullptr) + 86400), i)
            : fmt::format(
                  R"({{"unitIds": ["{}"], "audienceOrgIds": ["org-bench"], "startsAt": "{}", "endsAt": "{}", "note": "api_bench {}"}})",
                  unit, rfc3339(base + static_cast<std::time_t>(i) * 3600),
                  rfc3339(base + static_cast<std::time_t>(i + 1) * 3600), i);
    req.prepare_payload();
    auto t0 = Clock::now();
    if (i > warmup) every.push_back(micros(t0 - last_start));
    last_start = t0;
    unsigned st = c.roundtrip(req, body);
    auto dt = micros(Clock::now() - t0);
    expect(st, 201, "POST " + path, body);
    if (i >= warmup) lat.push_back(dt);
    if (now) {  // end it, timed: the unit is free for the next create
      const auto at = body.find("\"rsv_");
      if (at == std::string::npos) die("POST " + path + ": no reservation id in " + body);
      const std::string id = body.substr(at + 1, body.find('"', at + 1) - at - 1);
      auto end = make_request(bhttp::verb::post, path + "/" + id + "/end", token);
      end.set(bhttp::field::content_type, "application/json");
      end.body() = "{}";
      end.prepare_payload();
      std::string answer;
      t0 = Clock::now();
      st = c.roundtrip(end, answer);
      dt = micros(Clock::now() - t0);
      expect(st, 200, "POST " + path + "/" + id + "/end", answer);
      if (i >= warmup) ends.push_back(dt);
    }
    std::string ignored;
    t0 = Clock::now();
    st = c.roundtrip(absent, ignored);
    dt = micros(Clock::now() - t0);
    expect(st, 404, "GET " + path + "/r-api-bench-absent", ignored);
    if (i >= warmup) missing.push_back(dt);
  }
  fmt::print(
      R"({{"mode": "post", "path": "{}", "tls": "{}", "response_bytes": {}, "create": {}, "absent_get": {}, "end": {}, "create_every": {}}})"
      "\n",
      path, c.cipher(), body.size(), json_of(summarize(lat)), json_of(summarize(missing)),
      ends.empty() ? std::string("null") : json_of(summarize(ends)), json_of(summarize(every)));
  return 0;
}

// ---- the bare SQLite reference --------------------------------------------------------------

class Db {
 public:
  explicit Db(const std::string& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK)
      die("sqlite open " + path + ": " + sqlite3_errmsg(db_));
  }
  ~Db() {
    for (auto* s : stmts_) sqlite3_finalize(s);
    sqlite3_close(db_);
  }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  void exec(const std::string& sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : "?";
      sqlite3_free(err);
      die("sqlite: " + sql + ": " + msg);
    }
  }
  std::string query1(const std::string& sql) {
    sqlite3_stmt* s = prepare(sql);
    std::string out;
    if (sqlite3_step(s) == SQLITE_ROW) {
      const unsigned char* t = sqlite3_column_text(s, 0);
      if (t != nullptr) out = reinterpret_cast<const char*>(t);
    }
    sqlite3_reset(s);
    return out;
  }
  sqlite3_stmt* prepare(const std::string& sql) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &s, nullptr) != SQLITE_OK)
      die("sqlite prepare: " + sql + ": " + sqlite3_errmsg(db_));
    stmts_.push_back(s);
    return s;
  }
  void insert(sqlite3_stmt* s, const std::string& key, std::int64_t seq, const std::string& doc) {
    sqlite3_reset(s);
    if (!key.empty()) {
      sqlite3_bind_text(s, 1, key.c_str(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
    } else {
      sqlite3_bind_int64(s, 1, seq);
    }
    sqlite3_bind_text(s, 2, doc.c_str(), static_cast<int>(doc.size()), SQLITE_TRANSIENT);
    if (sqlite3_step(s) != SQLITE_DONE) die(std::string("sqlite insert: ") + sqlite3_errmsg(db_));
  }

 private:
  sqlite3* db_ = nullptr;
  std::vector<sqlite3_stmt*> stmts_;
};

std::string random_doc(std::mt19937_64& rng, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(n, ' ');
  for (auto& ch : s) ch = kHex[rng() & 15];
  return s;
}

// The bare commit's rows are as large as the issue that set the create's share (issue 40, point 8)
// measured them: 700 bytes, about a reservation's stored document.
constexpr std::size_t kRowBytes = 700;

int run_commit(const Args& a) {
  const std::string dir = a.str("dir");
  const int warmup = a.num("warmup", 10), n = a.num("transactions", 300);
  // --pace-us P: a third series, the 3-row transactions started P µs apart (as the agent's creates
  // come, each after the last one's answer and a 404), the thread asleep in between.
  const auto pace = std::chrono::microseconds(a.num("pace-us", 0));
  const std::string path = dir + "/bench-reference.db";
  std::remove(path.c_str());
  std::remove((path + "-wal").c_str());
  std::remove((path + "-shm").c_str());
  std::mt19937_64 rng{42};
  std::string mode, sync;
  Summary one, three, paced;
  {
    Db db(path);
    mode = db.query1("PRAGMA journal_mode=WAL");
    db.exec("PRAGMA synchronous=FULL");
    sync = db.query1("PRAGMA synchronous");
    db.exec(
        "CREATE TABLE reservations (id TEXT PRIMARY KEY, doc TEXT NOT NULL) WITHOUT ROWID;"
        "CREATE TABLE audit (seq INTEGER PRIMARY KEY, record TEXT NOT NULL);"
        "CREATE TABLE outbox (seq INTEGER PRIMARY KEY, event TEXT NOT NULL, delivered INTEGER NOT NULL "
        "DEFAULT 0)");
    auto* begin = db.prepare("BEGIN IMMEDIATE");
    auto* commit = db.prepare("COMMIT");
    auto* ins_r = db.prepare("INSERT INTO reservations (id, doc) VALUES (?1, ?2)");
    auto* ins_a = db.prepare("INSERT INTO audit (seq, record) VALUES (?1, ?2)");
    auto* ins_o = db.prepare("INSERT INTO outbox (seq, event) VALUES (?1, ?2)");
    auto step = [&](sqlite3_stmt* s) {
      sqlite3_reset(s);
      if (sqlite3_step(s) != SQLITE_DONE) die("sqlite: BEGIN/COMMIT failed");
    };
    std::int64_t seq = 0;
    auto tx = [&](int rows) {
      ++seq;
      const std::string id = fmt::format("rsv_{:026d}", seq);
      const std::string doc = random_doc(rng, kRowBytes);
      auto t0 = Clock::now();
      step(begin);
      db.insert(ins_r, id, 0, doc);
      if (rows == 3) {
        db.insert(ins_a, "", seq, doc);
        db.insert(ins_o, "", seq, doc);
      }
      step(commit);
      return micros(Clock::now() - t0);
    };
    for (int i = 0; i < warmup; ++i) tx(1);
    std::vector<double> l1, l3;
    for (int i = 0; i < n; ++i) l1.push_back(tx(1));
    for (int i = 0; i < n; ++i) l3.push_back(tx(3));
    one = summarize(l1);
    three = summarize(l3);
    if (pace.count() > 0) {
      std::vector<double> lp;
      auto next = Clock::now();
      for (int i = 0; i < n; ++i) {
        next += pace;
        std::this_thread::sleep_until(next);
        lp.push_back(tx(3));
      }
      paced = summarize(lp);
    }
  }
  std::remove(path.c_str());
  std::remove((path + "-wal").c_str());
  std::remove((path + "-shm").c_str());
  fmt::print(
      R"({{"mode": "commit", "sqlite": "{}", "journal_mode": "{}", "synchronous": "{}", "row_bytes": {}, "one_row": {}, "three_rows": {}, "pace_us": {}, "three_rows_paced": {}}})"
      "\n",
      sqlite3_libversion(), mode, sync, kRowBytes, json_of(one), json_of(three), pace.count(),
      pace.count() > 0 ? json_of(paced) : std::string("null"));
  return 0;
}

}  // namespace

// ---- paired requests -------------------------------------------------------------------------

int run_pairs(const Args& a) {
  ssl::context ctx = make_tls(a.str("ca"));
  const auto token = read_file(a.str("token-file"));
  const auto want = static_cast<unsigned>(a.num("status", 404));
  const int warmup = a.num("warmup", 200), pairs = a.num("pairs", 2000);
  auto req_a = make_request(bhttp::verb::get, a.str("path-a"), token);
  auto req_b = make_request(bhttp::verb::get, a.str("path-b"), token);
  req_a.prepare_payload();
  req_b.prepare_payload();
  Conn c(ctx, static_cast<unsigned short>(a.num("port", 0)));
  std::mt19937 coin(20261207);
  std::vector<double> la, lb, diff;
  std::size_t a_slower = 0;
  std::string body;
  const auto timed = [&](bhttp::request<bhttp::string_body>& req) {
    const auto t0 = Clock::now();
    const unsigned st = c.roundtrip(req, body);
    const double us = micros(Clock::now() - t0);
    expect(st, want, std::string(req.target()), body);
    return us;
  };
  for (int i = 0; i < warmup + pairs; ++i) {
    double ta = 0, tb = 0;
    if ((coin() & 1U) != 0) {
      ta = timed(req_a);
      tb = timed(req_b);
    } else {
      tb = timed(req_b);
      ta = timed(req_a);
    }
    if (i < warmup) continue;
    la.push_back(ta);
    lb.push_back(tb);
    diff.push_back(ta - tb);
    if (ta > tb) ++a_slower;
  }
  std::sort(diff.begin(), diff.end());
  const double diff_p50 = diff.empty() ? 0 : diff[diff.size() / 2];
  std::printf(
      "%s\n",
      fmt::format(R"({{"mode": "pairs", "path_a": "{}", "path_b": "{}", "pairs": {}, "a": {}, "b": {}, )"
                  R"("diff_p50_us": {:.2f}, "a_slower": {:.3f}}})",
                  std::string(req_a.target()), std::string(req_b.target()), la.size(), json_of(summarize(la)),
                  json_of(summarize(lb)), diff_p50,
                  la.empty() ? 0.0 : static_cast<double>(a_slower) / static_cast<double>(la.size()))
          .c_str());
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: api_bench get|post|commit|pairs --option value ...\n");
    return 2;
  }
  const std::string mode = argv[1];
  Args a;
  for (int i = 2; i < argc; i += 2) {
    std::string k = argv[i];
    if (!k.starts_with("--") || i + 1 >= argc) die("expected --option value, got " + k);
    a.kv[k.substr(2)] = argv[i + 1];
  }
  try {
    if (mode == "get") return run_get(a);
    if (mode == "post") return run_post(a);
    if (mode == "commit") return run_commit(a);
    if (mode == "pairs") return run_pairs(a);
  } catch (const std::exception& e) {
    die(e.what());
  }
  die("unknown mode " + mode);
}
