// The Reporter: the delivery and heartbeat loops on a thread of their own (see reporter.hpp).
#include "gpunode/report/reporter.hpp"

#include <fmt/format.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "client.hpp"
#include "gpunode/report/outbox.hpp"
#include "gpunode/reservations/model.hpp"

namespace gpunode::report {
namespace asio = boost::asio;
using asio::redirect_error;
using asio::use_awaitable;
using config::LogLevel;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kIdlePoll = std::chrono::seconds(5);           // the safety net under notify()
constexpr auto kStaleWarning = std::chrono::minutes(10);      // CONTRACT §6
constexpr auto kStaleWarningEvery = std::chrono::minutes(5);  // CONTRACT §6
constexpr auto kSameFailureLogEvery = std::chrono::minutes(1);
constexpr auto kRestartAfterCrash = std::chrono::seconds(1);
// stop() closes everything the loops wait on, so they end at once; should one not (a bug, or a
// SQLite call waiting out its busy timeout), the loop is stopped after this anyway.
constexpr auto kStopGrace = std::chrono::seconds(3);

std::string snippet(std::string_view body) {
  std::string out;
  for (char c : body.substr(0, 200)) out.push_back(c == '\n' || c == '\r' ? ' ' : c);
  if (body.size() > 200) out += "...";
  return out;
}

std::string seconds_text(std::chrono::milliseconds d) {
  return fmt::format("{:.1f}s", static_cast<double>(d.count()) / 1000.0);
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

struct Reporter::Impl {
  Options opt;
  detail::Endpoint endpoint;
  std::string events_path, heartbeat_path;
  Outbox outbox;

  // Reporter thread only (no lock): the loops' own state.
  std::int64_t base = 0;  // the highest seq known acknowledged
  // Acknowledged through this seq, but the delete failed (a full or read-only disk): tried again at
  // each turn of the delivery loop, so that the depth heartbeats report is what still waits.
  std::optional<std::int64_t> undeleted;
  std::mt19937_64 rng{std::random_device{}()};
  bool idle = false;
  bool delivered_once = false;
  std::optional<Clock::time_point> outage_since;        // first failure of the current outage
  std::optional<std::chrono::milliseconds> recovering;  // the outage's length, while its backlog drains
  std::uint64_t recovered_events = 0;
  std::optional<Clock::time_point> last_stale_warning;
  struct Throttle {
    std::optional<Clock::time_point> last;
    std::uint64_t quiet = 0;  // failures not logged since `last`
  };
  std::array<Throttle, kFailureKinds> throttles{};
  Throttle nothing_throttle, heartbeat_throttle;
  bool heartbeat_failing = false;

  // Shared: the status snapshot (written on the reporter thread, read anywhere).
  mutable std::mutex status_mu;
  Status status;  // guarded by status_mu

  std::atomic<bool> stopping{false};
  std::atomic<bool> poked{false};  // a notify() is posted and not yet run
  detail::TlsSource tls;

  // Destroyed before the io_context (declared after it): every socket and timer of the loops.
  asio::io_context io;
  asio::steady_timer wake{io};
  asio::steady_timer backoff{io};
  asio::steady_timer beat{io};
  asio::steady_timer restart{io};
  detail::Client events;
  detail::Client heartbeats;
  std::promise<void> finished;  // set when the thread's loop has returned
  std::future<void> finished_future = finished.get_future();
  std::thread thread;

  Impl(Options o, detail::Endpoint e, Outbox ob)
      : opt(std::move(o)),
        endpoint(std::move(e)),
        outbox(std::move(ob)),
        tls(opt.tls),
        events(io, endpoint, tls, "gpunode-agent/" + opt.version, opt.connect_timeout),
        heartbeats(io, endpoint, tls, "gpunode-agent/" + opt.version, opt.connect_timeout) {
    events_path = "/v1/nodes/" + opt.node_id + "/events";
    heartbeat_path = "/v1/nodes/" + opt.node_id + "/heartbeat";
  }

  void say(LogLevel level, const std::string& text) const {
    if (opt.log) opt.log(level, text);
  }

  template <class F>
  void with_status(F&& f) {
    std::lock_guard lock(status_mu);
    f(status);
  }

  // ---- reporter thread ----

  // Depth and age from the table itself; the 10-minute warning.
  void refresh_stats() {
    auto s = outbox.stats();
    if (!s) {
      say(LogLevel::warning, "central: cannot read the outbox's depth: " + Outbox::describe(s.error()));
      return;
    }
    std::optional<std::chrono::sys_seconds> oldest;
    if (s->oldest_at) oldest = reservations::parse_time(*s->oldest_at);
    with_status([&](Status& st) {
      st.outbox_depth = s->depth;
      st.oldest_undelivered_at = s->oldest_at;
      st.oldest_undelivered = oldest;
    });
    if (!oldest) return;
    const auto age = std::chrono::system_clock::now() - *oldest;
    const auto now = Clock::now();
    if (age < kStaleWarning || (last_stale_warning && now - *last_stale_warning < kStaleWarningEvery)) return;
    last_stale_warning = now;
    say(LogLevel::warning,
        fmt::format("central: the oldest undelivered event (seq {}, at {}) is {} minutes old; {} events wait "
                    "in the outbox and are "
                    "kept until the central API acknowledges them",
                    s->first_seq, *s->oldest_at,
                    std::chrono::duration_cast<std::chrono::minutes>(age).count(), s->depth));
  }

  // One line per failure class at most every minute (a refused request: every time, as an error).
  // The outage began at the first failure, or earlier: when the oldest event still waiting was
  // made (it would have been delivered at once), which also counts the time before a restart.
  void begin_outage() {
    recovering.reset();
    if (outage_since) return;
    outage_since = Clock::now();
    std::optional<std::chrono::sys_seconds> oldest;
    {
      std::lock_guard lock(status_mu);
      oldest = status.oldest_undelivered;
    }
    if (!oldest) return;
    const auto waited = std::chrono::system_clock::now() - *oldest;
    if (waited > std::chrono::seconds(0))
      *outage_since -= std::chrono::duration_cast<Clock::duration>(waited);
  }

  void log_failure(Failure f, const std::string& why, std::chrono::milliseconds wait, unsigned attempt) {
    begin_outage();
    with_status([&](Status& st) { ++st.failures[static_cast<std::size_t>(f)]; });
    if (f == Failure::rejected) {
      say(LogLevel::error,
          fmt::format("central: events seq {}.. refused ({}): {}; holding them and trying again in {}",
                      base + 1, label(f), why, seconds_text(wait)));
      return;
    }
    auto& t = throttles[static_cast<std::size_t>(f)];
    const auto now = Clock::now();
    if (t.last && now - *t.last < kSameFailureLogEvery) {
      ++t.quiet;
      return;
    }
    const std::string quiet = t.quiet ? fmt::format(" ({} more like it since the last line)", t.quiet) : "";
    t = Throttle{now, 0};
    say(LogLevel::warning,
        fmt::format("central: event delivery failed ({}): {}; retrying in {} (attempt {}){}", label(f), why,
                    seconds_text(wait), attempt, quiet));
  }

  void protocol_error(const std::string& why) {
    begin_outage();
    with_status([](Status& st) { ++st.protocol_errors; });
    say(LogLevel::error, "central: protocol error: " + why);
  }

  void delivered(std::int64_t first, std::int64_t acked, std::int64_t sent_last) {
    const auto count = static_cast<std::uint64_t>(acked - base);
    if (auto d = outbox.delete_through(acked); !d) {
      // The rows stay until a delete succeeds; after a restart they are sent again (the central
      // API dedups by seq).
      say(LogLevel::error,
          fmt::format("central: acknowledged through seq {} but cannot delete it from the outbox: {}", acked,
                      Outbox::describe(d.error())));
      undeleted = acked;
    } else {
      undeleted.reset();
    }
    base = acked;
    with_status([&](Status& st) {
      st.acked_seq = acked;
      st.events_delivered += count;
    });
    if (!delivered_once) {
      delivered_once = true;
      say(LogLevel::info,
          fmt::format("central: first delivery: events seq {}..{} acknowledged", first, acked));
    }
    if (acked < sent_last) {
      say(LogLevel::info,
          fmt::format("central: partial acknowledgement: seq {}..{} of {}..{}; sending the rest", first,
                      acked, first, sent_last));
    }
    if (outage_since) {
      recovering = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - *outage_since);
      recovered_events = 0;
      outage_since.reset();
      throttles = {};
    }
    if (recovering) recovered_events += count;
  }

  void retry_delete() {
    if (!undeleted || !outbox.delete_through(*undeleted))
      return;  // its failure was logged when it first failed
    say(LogLevel::info,
        fmt::format("central: the acknowledged events through seq {} are deleted from the outbox now",
                    *undeleted));
    undeleted.reset();
  }

  // The outbox is drained: an outage's recovery is over.
  void caught_up() {
    if (!recovering) return;
    say(LogLevel::info, fmt::format("central: delivered {} events after an outage of {}", recovered_events,
                                    seconds_text(*recovering)));
    recovering.reset();
  }

  asio::awaitable<void> sleep(asio::steady_timer& timer, std::chrono::milliseconds d) {
    boost::system::error_code ec;
    timer.expires_after(d);
    co_await timer.async_wait(redirect_error(use_awaitable, ec));
  }

  // A batch as sent: its first and last seq and how many events it holds.
  struct Sent {
    std::int64_t first = 0, last = 0;
    std::size_t count = 0;
  };

  asio::awaitable<void> deliver_loop() {
    unsigned attempt = 0;
    while (!stopping) {
      retry_delete();
      refresh_stats();
      BatchBuilder batch(opt.node_id);
      auto read = outbox.read_batch(base, batch);
      if (!read) {
        ++attempt;
        say(LogLevel::error, "central: cannot read the outbox: " + Outbox::describe(read.error()));
        co_await sleep(backoff, full_jitter(attempt, rng()));
        continue;
      }
      if (batch.count() == 0) {
        if (read->bad) {
          protocol_error(read->bad->detail +
                         "; delivery is held there (nothing after it is sent) until the row is repaired");
          co_await sleep(backoff, Limits::kHold);
          continue;
        }
        caught_up();
        idle = true;
        co_await sleep(wake, kIdlePoll);
        idle = false;
        continue;
      }
      const Sent sent{batch.first(), batch.last(), batch.count()};
      auto answer = co_await events.post(events_path, batch.finish(), opt.request_timeout);
      if (stopping) break;
      const auto wait = after_answer(sent, answer, attempt);
      if (!wait) continue;  // the next batch at once
      co_await sleep(backoff, *wait);
    }
  }

  // What the answer to a batch means: how long to wait before the next one, or nothing when
  // events were acknowledged (the next batch goes at once). A failure counts an attempt and is
  // logged.
  std::optional<std::chrono::milliseconds> after_answer(const Sent& sent,
                                                        const error::Result<detail::Answer>& answer,
                                                        unsigned& attempt) {
    std::optional<Failure> failed;
    std::optional<std::chrono::milliseconds> retry_after;
    std::string why;
    std::chrono::milliseconds wait{0};
    if (!answer) {
      failed = Failure::transport;
      why = answer.error().detail;
    } else if (answer->status < 200 || answer->status > 299) {
      failed = classify_status(answer->status);
      if (answer->retry_after) retry_after = parse_retry_after(*answer->retry_after);
      why = fmt::format("HTTP {} for {} events (seq {}..{}){}", answer->status, sent.count, sent.first,
                        sent.last, answer->body.empty() ? "" : ": " + snippet(answer->body));
    } else if (auto acked = parse_ack(answer->body); !acked) {
      protocol_error(fmt::format("the answer to seq {}..{} is unusable ({}): {}; trying again in {}",
                                 sent.first, sent.last, acked.error().detail, snippet(answer->body),
                                 seconds_text(Limits::kHold)));
      wait = Limits::kHold;
    } else {
      return after_ack(sent, *acked, attempt);
    }
    if (failed) {
      ++attempt;
      wait = retry_delay(*failed, attempt, retry_after, rng());
      log_failure(*failed, why, wait, attempt);
    }
    return wait;
  }

  // What an acknowledgement (ackedSeq `acked`) of a batch means, as after_answer.
  std::optional<std::chrono::milliseconds> after_ack(const Sent& sent, std::int64_t acked,
                                                     unsigned& attempt) {
    const AckVerdict v = judge_ack(base, sent.last, acked);
    switch (v.kind) {
      case AckVerdict::Kind::progress:
        attempt = 0;
        delivered(sent.first, v.acked, sent.last);
        return std::nullopt;
      case AckVerdict::Kind::nothing: {
        ++attempt;
        const auto wait = full_jitter(attempt, rng());
        with_status([](Status& st) { ++st.protocol_errors; });
        const auto now = Clock::now();
        if (!nothing_throttle.last || now - *nothing_throttle.last >= kSameFailureLogEvery) {
          nothing_throttle = Throttle{now, 0};
          say(LogLevel::warning,
              fmt::format("central: acknowledged none of seq {}..{} (ackedSeq {}); trying again in {}",
                          sent.first, sent.last, v.acked, seconds_text(wait)));
        }
        return wait;
      }
      case AckVerdict::Kind::beyond:
        protocol_error(fmt::format(
            "ackedSeq {} is beyond the last event sent ({}); nothing is deleted; trying again in {} "
            "(was the state directory reset while the central API kept this node's events?)",
            v.acked, sent.last, seconds_text(Limits::kHold)));
        return Limits::kHold;
      case AckVerdict::Kind::backwards:
        protocol_error(fmt::format(
            "ackedSeq {} goes back from {} acknowledged before; nothing is deleted; trying again in {}",
            v.acked, base, seconds_text(Limits::kHold)));
        return Limits::kHold;
    }
    return std::chrono::milliseconds{0};
  }

  asio::awaitable<void> heartbeat_loop() {
    auto next = Clock::now();
    while (!stopping) {
      refresh_stats();
      NodeFacts facts;
      if (opt.facts) facts = opt.facts();  // read now: never a stale revision
      Heartbeat h;
      h.node_id = opt.node_id;
      h.at = reservations::format_time(
          std::chrono::floor<std::chrono::seconds>(std::chrono::system_clock::now()));
      h.version = opt.version;
      h.revision = facts.revision;
      h.libvirt_connected = facts.libvirt_connected;
      h.audit_key = opt.audit_key;
      {
        std::lock_guard lock(status_mu);
        h.outbox_depth = status.outbox_depth;
        h.oldest_undelivered_at = status.oldest_undelivered_at;
      }
      const auto timeout = std::min(opt.heartbeat_timeout, opt.heartbeat_interval);
      auto answer = co_await heartbeats.post(heartbeat_path, heartbeat_body(h), timeout);
      if (stopping) break;
      const bool ok = answer && answer->status >= 200 && answer->status <= 299;
      with_status([&](Status& st) { ++(ok ? st.heartbeats_sent : st.heartbeat_failures); });
      if (ok && heartbeat_failing) {
        heartbeat_failing = false;
        say(LogLevel::info, "central: heartbeats are answered again");
      } else if (!ok) {
        heartbeat_failing = true;
        const auto now = Clock::now();
        auto& t = heartbeat_throttle;
        if (!t.last || now - *t.last >= kSameFailureLogEvery) {
          const std::string quiet = t.quiet ? fmt::format(" ({} more since the last line)", t.quiet) : "";
          t = Throttle{now, 0};
          say(LogLevel::warning,
              fmt::format("central: heartbeat failed: {} (not retried; the next one in {}){}",
                          answer ? fmt::format("HTTP {}", answer->status) : answer.error().detail,
                          seconds_text(opt.heartbeat_interval), quiet));
        } else {
          ++t.quiet;
        }
      }
      // A fixed schedule; a late beat does not make a burst.
      next += opt.heartbeat_interval;
      if (next < Clock::now()) next = Clock::now() + opt.heartbeat_interval;
      boost::system::error_code ec;
      beat.expires_at(next);
      co_await beat.async_wait(redirect_error(use_awaitable, ec));
    }
  }

  // Each loop's exception boundary: a throw is logged and the loop starts again a second later.
  void spawn(asio::awaitable<void> (Impl::*loop)(), const char* name) {
    asio::co_spawn(io, (this->*loop)(), [this, loop, name](const std::exception_ptr& e) {
      if (!e || stopping) return;
      say(LogLevel::error,
          fmt::format("internal error in the reporter's {} loop: {}; restarting it", name, what_of(e)));
      restart.expires_after(kRestartAfterCrash);
      restart.async_wait([this, loop, name](const boost::system::error_code& ec) {
        if (!ec && !stopping) spawn(loop, name);
      });
    });
  }

  void run_thread() {
    for (;;) {
      try {
        io.run();
        return;
      } catch (const std::exception& e) {
        say(LogLevel::error, fmt::format("internal error on the reporter thread: {}", e.what()));
      } catch (...) {
        say(LogLevel::error, "internal error on the reporter thread");
      }
    }
  }
};

Reporter::Reporter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Reporter::~Reporter() {
  stop();
}

error::Result<std::unique_ptr<Reporter>> Reporter::start(Options options) {
  auto endpoint = detail::parse_endpoint(options.url);
  if (!endpoint) return std::unexpected(endpoint.error());
  if (!options.tls) return error::fail(error::Errc::invalid, "central: no TLS context");
  if (options.heartbeat_interval.count() <= 0)
    return error::fail(error::Errc::invalid, "central: the heartbeat interval must be positive");
  const auto outbox_failed = [](const error::Error& e) {
    return error::fail(e.code, "central: the outbox: " + Outbox::describe(e));
  };
  auto outbox = Outbox::open(options.state_db);
  if (!outbox) return outbox_failed(outbox.error());
  auto acked = outbox->acknowledged();
  if (!acked) return outbox_failed(acked.error());
  auto impl = std::make_unique<Impl>(std::move(options), std::move(*endpoint), std::move(*outbox));
  Impl* p = impl.get();
  p->base = *acked;
  p->status.acked_seq = *acked;
  p->say(LogLevel::info,
         fmt::format("central: reporting to {} as node {}: events after seq {}, heartbeats every {}",
                     p->opt.url, p->opt.node_id, *acked, seconds_text(p->opt.heartbeat_interval)));
  p->spawn(&Impl::deliver_loop, "delivery");
  p->spawn(&Impl::heartbeat_loop, "heartbeat");
  p->thread = std::thread([p] {
    p->run_thread();
    p->finished.set_value();
  });
  return std::unique_ptr<Reporter>(new Reporter(std::move(impl)));
}

void Reporter::notify() {
  Impl* p = impl_.get();
  if (p->poked.exchange(true)) return;  // one post covers every commit before it runs
  asio::post(p->io, [p] {
    p->poked = false;
    if (p->idle) p->wake.cancel();
  });
}

void Reporter::set_tls_context(std::shared_ptr<boost::asio::ssl::context> tls) {
  if (tls) impl_->tls.set(std::move(tls));
}

Status Reporter::status() const {
  std::lock_guard lock(impl_->status_mu);
  return impl_->status;
}

void Reporter::stop() {
  Impl* p = impl_.get();
  if (!p) return;
  if (!p->stopping.exchange(true)) {
    asio::post(p->io, [p] {
      p->wake.cancel();
      p->backoff.cancel();
      p->beat.cancel();
      p->restart.cancel();
      p->events.close();
      p->heartbeats.close();
    });
  }
  if (!p->thread.joinable() || p->thread.get_id() == std::this_thread::get_id()) return;
  if (p->finished_future.wait_for(kStopGrace) == std::future_status::timeout) {
    p->say(LogLevel::error, "internal: the reporter's loops did not end when asked; stopping its thread");
    p->io.stop();
  }
  p->thread.join();
}

}  // namespace gpunode::report
