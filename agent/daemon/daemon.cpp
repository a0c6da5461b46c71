#include "gpunode/daemon/daemon.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <malloc.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/json.hpp>
#include <filesystem>
#include <future>
#include <optional>
#include <thread>

#include "gpunode/auth/token_verifier.hpp"
#include "gpunode/config/config.hpp"
#include "gpunode/daemon/admin_peers.hpp"
#include "gpunode/daemon/audit_checkpoints.hpp"
#include "gpunode/daemon/cadence.hpp"
#include "gpunode/daemon/debounce.hpp"
#include "gpunode/daemon/log.hpp"
#include "gpunode/daemon/policy.hpp"
#include "gpunode/daemon/sd_notify.hpp"
#include "gpunode/daemon/uevents.hpp"
#include "gpunode/daemon/wall_timer.hpp"
#include "gpunode/discovery/pci_ids.hpp"
#include "gpunode/http/server.hpp"
#include "gpunode/metrics/node_metrics.hpp"
#include "gpunode/report/outbox.hpp"
#include "gpunode/reservations/model.hpp"
#include "gpunode/service/routes.hpp"
#include "gpunode/store/state_lock.hpp"
#include "startup.hpp"

namespace gpunode::daemon {
namespace asio = boost::asio;
using config::LogLevel;

namespace {

// CONTRACT §11 Stopping: requests in progress get this long to finish after SIGTERM, so that the
// agent exits within 2 s; idle connections are closed at once, parked polls answered at once.
constexpr std::chrono::milliseconds kStopDrain{1500};
// How long a reload waits for the core thread to apply what it changed before answering.
constexpr std::chrono::seconds kReloadApplyWait{30};

// Runs an io_context until it stops, logging whatever a handler throws: the thread's boundary.
void run_guarded(asio::io_context& io, const Logger& log, const char* loop) {
  for (;;) {
    try {
      io.run();
      return;
    } catch (const std::exception& e) {
      log.log(LogLevel::error, fmt::format("internal error on the {} thread: {}", loop, e.what()));
    } catch (...) {
      log.log(LogLevel::error, fmt::format("internal error on the {} thread", loop));
    }
  }
}

}  // namespace

// Member order is destruction order, reversed: what a later member uses is declared before it.
struct Daemon::Parts {
  DaemonOptions opt;
  Logger log;
  config::Config cfg;  // as started; immutable after start() (a reload compares against it)
  std::optional<discovery::PciIds> names;
  std::optional<store::StateLock> lock;
  std::shared_ptr<const proof::NodeKey> audit_key;  // signs the audit checkpoints (CONTRACT §12)
  PassedListeners passed;                           // the sockets systemd passed (socket activation), if any
  // Core thread only, except read() (any thread). Set in start() before the threads run.
  std::unique_ptr<service::NodeService> node;
  std::shared_ptr<vmctl::Hypervisor> hypervisor;
  std::shared_ptr<AdminPeers> peers;
  // gpunode_http_*: recorded by the server's observer on the net thread as each answer is sent,
  // read by /metrics on the core thread. Shared; HttpMetrics guards itself with its own mutex.
  metrics::HttpMetrics http_metrics;
  // The outbox table as /metrics reads it (depth, oldest event, acknowledged seq): core thread
  // only, a SQLite connection of its own, opened at the first scrape.
  std::optional<report::Outbox> outbox;
  bool outbox_warned = false;

  asio::io_context net;
  asio::io_context core;
  asio::executor_work_guard<asio::io_context::executor_type> core_work = asio::make_work_guard(core);
  asio::thread_pool lists{1};
  asio::thread_pool terminations{4};
  asio::thread_pool slow{1};
  // Set once by stop(); read by the termination pool's sleeper and the loops (any thread).
  std::atomic<bool> stopping = false;
  std::optional<Driver> driver;  // core thread only, after start()
  // Core thread only: the next term (reservations::Time) as an instant of the wall clock, re-armed
  // after every change; the backstop rescan; the kernel's device events and the short wait that
  // turns a burst of them into one rescan.
  std::unique_ptr<WallTimer> term_timer;
  asio::steady_timer rescan_timer{core};
  std::optional<AuditCheckpoints> audit_checkpoints;  // every audit.checkpoint_interval, and at stop
  std::unique_ptr<UeventMonitor> uevents;
  Debounce uevent_rescan{core.get_executor(), std::chrono::milliseconds(200), Debounce::Mode::after_first,
                         [this] {
                           if (stopping) return;
                           node->rescan();
                           driver->changed();
                         }};
  // The core loop's last turn seen by the watchdog (steady clock, ns): written on core, read on net.
  std::atomic<std::int64_t> core_beat{0};
  // The state's revision as the core last published it (after each commit that moved it): written
  // on core, read by the reporter's heartbeats. It only grows.
  std::atomic<std::int64_t> revision{0};
  // Set in start() before any thread could use it, then only its thread-safe members are called
  // (notify on core, set_tls_context on slow, status anywhere); stopped first in join_threads().
  std::unique_ptr<report::Reporter> reporter;

  std::optional<http::Server> server;  // HTTPS and metrics.listen, on `net`; callable from any thread
  // The admin socket, served apart (CONTRACT §10): its own io_context, thread and connection
  // budget, so that no load on the HTTPS port delays the hook or an operator. Its requests meet the
  // others only where they all go: the core thread.
  asio::io_context admin_io;
  std::optional<http::Server> admin_server;  // callable from any thread
  std::thread admin_thread;
  // Net thread: once 250 ms pass without a request after a load, the heap's free pages go back to
  // the kernel (malloc_trim, on the slow pool), so a burst leaves no resident high-water mark.
  Debounce trim_after_load{net.get_executor(), std::chrono::milliseconds(250), Debounce::Mode::after_last,
                           [this] { asio::post(slow, [] { ::malloc_trim(0); }); }};
  asio::signal_set signals{net};
  asio::steady_timer watchdog{net};
  std::thread core_thread;
  bool threads_done = false;
  bool stopped_serving =
      false;  // run() saw the network loop end after stop(): the admin thread ends by itself

  void say(LogLevel level, const std::string& text) const { log.log(level, text); }
  // The log as the service, the driver and the reporter take it.
  service::LogSink log_sink() {
    return [this](service::LogLevel level, const std::string& text) { log.log(level, text); };
  }

  // ---- core thread ----
  // Applies the terms that are due, then sleeps until the next one. Not a tick: an idle agent does
  // not wake (CONTRACT §7: a term takes effect within a second of its instant).
  void run_terms() {
    const auto before = node->revision();
    node->tick();
    driver->changed();  // re-arms through on_revision when a term moved the revision...
    if (node->revision() == before) arm_terms();  // ...else here
  }
  // After every change (a request, a term, a rescan): the next term may be sooner or gone.
  void arm_terms() {
    if (stopping) return;
    const auto next = node->next_term();
    const auto now = std::chrono::system_clock::now();
    std::chrono::system_clock::time_point when;
    if (!opt.clock) {
      // Nothing pending: wake once an hour all the same (the idempotency keys' 24 h retention).
      when = next ? std::chrono::system_clock::time_point(*next) : now + std::chrono::hours(1);
    } else {
      // A test's clock is not the kernel's: at the latest every second, as the clock says.
      auto wait = std::chrono::milliseconds(1000);
      if (next)
        wait = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(*next - opt.clock()),
                          std::chrono::milliseconds(0), wait);
      when = now + wait;
    }
    term_timer->wait_until(when, [this](WallTimer::Woken why) {
      if (why == WallTimer::Woken::clock_set)
        say(LogLevel::info, "the system clock was set: looking at the reservations' terms again");
      run_terms();
    });
  }
  // A PCI device added, removed, bound or unbound (or uevents lost): rescan 200 ms after the
  // first of a burst.
  void on_uevent(const UeventNotice& n) {
    if (const auto* e = std::get_if<Uevent>(&n))
      say(LogLevel::debug, fmt::format("uevent: {} {} ({})", e->action, e->devpath, e->subsystem));
    else
      say(LogLevel::info, "uevents: the kernel's queue overflowed and some were lost; rescanning");
    if (!stopping) uevent_rescan.poke();
  }
  // The backstop rescan, every discovery.rescan_interval at its multiples (cadence.hpp: with the
  // health poll's, one wake-up for both).
  void arm_rescan() {
    rescan_timer.expires_at(next_on_cadence(std::chrono::steady_clock::now(), cfg.discovery.rescan_interval));
    rescan_timer.async_wait([this](const boost::system::error_code& e) {
      if (e) return;
      node->rescan_if_changed();
      driver->changed();
      // The workloads: libvirt's events refresh them as they come; without events (none
      // registered, or the connection lost) the interval does.
      if (!stopping && !hypervisor->watching()) driver->refresh();
      // A group created since start counts (admin_peers.hpp: when NSS is asked again); the slow
      // thread is woken only when a lookup is due.
      if (peers->due(std::chrono::steady_clock::now()))
        asio::post(slow, [this] { peers->resolve_if_due(std::chrono::steady_clock::now()); });
      arm_rescan();
    });
  }

  // GET /metrics (CONTRACT §6), on the core thread: the node's numbers are the service's own, read
  // between two requests, so a scrape sees every change answered before it, and the net thread
  // never waits for them (it posts the scrape here as it posts every request).
  std::string metrics_text() {
    metrics::Snapshot s;
    s.version = opt.version;
    s.node = node->gauges();
    s.delivery = delivery();
    s.libvirt_connected = hypervisor && hypervisor->connected();
    return metrics::render(s, http_metrics);
  }
  // The outbox from its table, whether reporting runs or not (undelivered events are what the
  // table holds: with reporting off, every event written since the state directory began, or since
  // an earlier run's last acknowledgement); the acknowledged seq and failures from the reporter,
  // else what the table says is acknowledged, and no failure.
  metrics::Delivery delivery() {
    metrics::Delivery d;
    if (!outbox) {
      auto o = report::Outbox::open(std::filesystem::path(cfg.state.dir) / "state.db");
      if (o)
        outbox.emplace(std::move(*o));
      else if (!std::exchange(outbox_warned, true))
        say(LogLevel::warning, "metrics: cannot read the outbox: " + report::Outbox::describe(o.error()));
    }
    if (outbox) {
      if (auto st = outbox->stats()) {
        d.outbox_events = st->depth;
        const auto oldest = st->oldest_at ? reservations::parse_time(*st->oldest_at) : std::nullopt;
        if (oldest)
          d.oldest_undelivered_age_seconds = std::max(
              0.0, std::chrono::duration<double>(std::chrono::system_clock::now() - *oldest).count());
      } else {
        say(LogLevel::warning, "metrics: cannot read the outbox: " + report::Outbox::describe(st.error()));
      }
      if (!reporter) {
        if (auto a = outbox->acknowledged()) d.acked_seq = *a;
      }
    }
    if (reporter) {
      const auto st = reporter->status();
      d.acked_seq = st.acked_seq;
      for (std::size_t i = 0; i < report::kFailureKinds; ++i) {
        if (auto at =
                metrics::index_of(metrics::kFailureReasons, report::label(static_cast<report::Failure>(i))))
          d.failures[*at] = st.failures[i];
      }
    }
    return d;
  }
  void serve_metrics(http::Reply reply) {
    asio::post(core, [this, reply = std::move(reply)] {
      try {
        reply(http::Response{200, {{"Content-Type", std::string(metrics::kContentType)}}, metrics_text()});
      } catch (const std::exception& e) {
        say(LogLevel::error, fmt::format("internal error serving /metrics: {}", e.what()));
        reply(http::internal_error("the metrics could not be gathered"));
      }
    });
  }

  // POST /v1/admin/reload (admin socket only; CONTRACT §11): the reload runs on the slow thread, as
  // SIGHUP's does, and its outcome is the answer: 200 {"reloaded", "restartNeeded"} or 422
  // reload-refused with each problem as {"field": "FILE:LINE:COLUMN", "message"}.
  void serve_reload(http::Reply reply) {
    asio::post(slow, [this, reply = std::move(reply)] {
      try {
        const auto outcome = reload_now();
        if (!outcome) {
          std::vector<json::FieldError> errors;
          for (const auto& e : outcome.errors) {
            errors.push_back(
                {e.line > 0 ? fmt::format("{}:{}:{}", e.file, e.line, e.column) : e.file, e.message});
          }
          return reply(http::problem(422, "reload-refused",
                                     fmt::format("{} problem{}: the running configuration is kept",
                                                 errors.size(), errors.size() == 1 ? "" : "s"),
                                     errors));
        }
        boost::json::array keys;
        for (const auto& k : outcome.restart_needed) keys.emplace_back(k);
        reply(http::Response{200,
                             {{"Content-Type", "application/json"}},
                             boost::json::serialize(boost::json::object{
                                 {"reloaded", true}, {"restartNeeded", std::move(keys)}})});
      } catch (const std::exception& e) {
        say(LogLevel::error, fmt::format("reload failed: {}", e.what()));
        reply(http::internal_error("the reload failed; the running configuration is kept"));
      }
    });
  }

  // ---- net thread ----
  // Every request, by the route table (gpunode/service/routes.hpp): the daemon's own routes
  // (GET /metrics on the admin socket and metrics.listen, POST /v1/admin/reload on the admin socket)
  // are answered here; the metrics listener serves nothing else but what the table gives it
  // (/healthz, as HTTPS answers it); a read the service's snapshot answers (NodeService::read) is
  // answered here; the rest goes to the core thread's Driver.
  void on_request(http::Request q, http::Reply reply) {
    if (q.peer.kind == http::Peer::Kind::unix_socket) {
      asio::post(net, [this] { trim_after_load.poke(); });  // the admin thread's request: the timer is net's
    } else {
      trim_after_load.poke();
    }
    const auto m = service::match_route(q);
    if (m.path != nullptr && m.path->daemon != service::DaemonRoute::none) {
      if (m.route == nullptr) return reply(http::method_not_allowed(m.allow(service::door_of(q.peer))));
      if (m.route->daemon == service::DaemonRoute::metrics) return serve_metrics(std::move(reply));
      return serve_reload(std::move(reply));
    }
    if (m.path == nullptr && q.peer.kind == http::Peer::Kind::plain_tcp) return reply(http::not_found());
    service::ApiRequest a(std::move(q));  // the same request, with the service's own fields
    // A read the published snapshot answers (units, state, reservations): answered here, no hop.
    if (auto kept = node->read(a, opt.clock ? opt.clock() : std::chrono::system_clock::now())) {
      return reply(std::move(*kept));
    }
    asio::post(core, [this, a = std::move(a), reply = std::move(reply)]() mutable {
      driver->submit(std::move(a),
                     [reply = std::move(reply)](service::ApiResponse r) { reply(std::move(r)); });
    });
  }

  void arm_watchdog(std::chrono::microseconds interval) {
    // Pets only while the core loop turns too: a wedged state thread must look dead to systemd.
    const auto now = std::chrono::steady_clock::now().time_since_epoch();
    const auto age = std::chrono::nanoseconds(now.count() - core_beat.load());
    if (age < interval)
      sd_notify("WATCHDOG=1");
    else
      say(LogLevel::warning, fmt::format("watchdog: the core loop has not turned for {} ms; not petting",
                                         age.count() / 1000000));
    asio::post(core, [this] { core_beat = std::chrono::steady_clock::now().time_since_epoch().count(); });
    watchdog.expires_after(interval / 2);
    watchdog.async_wait([this, interval](const boost::system::error_code& e) {
      if (!e) arm_watchdog(interval);
    });
  }
  void wait_signal() {
    signals.async_wait([this](const boost::system::error_code& e, int sig) {
      if (e) return;
      if (sig == SIGHUP) {
        asio::post(slow, [this] {
          try {
            reload_now();
          } catch (const std::exception& x) {
            say(LogLevel::error, fmt::format("reload failed: {}", x.what()));
          }
        });
        wait_signal();
        return;
      }
      say(LogLevel::info, fmt::format("signal {}: stopping (draining connections)", sig));
      stop();
    });
  }

  void stop() {
    if (stopping.exchange(true)) return;
    sd_notify("STOPPING=1");
    asio::post(core, [this] { driver->stop(); });  // long polls are answered now (304)
    asio::post(net, [this] {
      watchdog.cancel();
      server->shutdown(kStopDrain, [this] {
        signals.cancel();
        net.stop();
      });
    });
    asio::post(admin_io, [this] { admin_server->shutdown(kStopDrain, [this] { admin_io.stop(); }); });
  }

  // Core thread: what a reload changes in the node.
  void core_apply_reload(std::shared_ptr<const auth::TokenVerifier> v, std::vector<std::string> unsellable,
                         config::EnforcementMode mode) {
    node->set_verifier(std::move(v));
    node->set_unsellable(std::move(unsellable));
    node->set_enforcement(mode);
    driver->changed();
  }

  // Slow thread (one at a time: SIGHUP's and POST /v1/admin/reload's).
  ReloadOutcome reload_now() {
    ReloadOutcome outcome;
    const auto refuse = [&](std::vector<config::Problem> problems) {
      for (const auto& p : problems) say(LogLevel::error, "reload: " + p.to_string());
      say(LogLevel::error,
          fmt::format("reload refused: {}{}; keeping the running configuration", problems.front().to_string(),
                      problems.size() > 1 ? fmt::format(" (and {} more above)", problems.size() - 1)
                                          : std::string()));
      outcome.errors = std::move(problems);
      return outcome;
    };
    auto checked = load_checked(opt.config_file);
    if (!checked) return refuse(std::move(checked.error()));
    config::Config fresh_config = std::move(*checked);
    auto v = load_verifier(fresh_config);
    auto t = http::make_tls_context(tls_files(fresh_config));
    // The central API's files, when reporting runs and is still meant to (a changed url is a restart).
    error::Result<std::shared_ptr<asio::ssl::context>> c = nullptr;
    if (reporter) c = central_tls(fresh_config);
    if (!v || !t || !c) {  // the files changed again since they were checked
      const auto& why = !v ? v.error() : !t ? t.error() : c.error();
      return refuse({config::Problem{opt.config_file, 0, 0, why.detail}});
    }
    const auto restart = config::keys_needing_restart(cfg, fresh_config);
    if (!restart.empty()) {
      say(LogLevel::warning,
          fmt::format("reload: {} changed and take effect only after a restart: {}",
                      restart.size() == 1 ? "this key" : "these keys", fmt::join(restart, ", ")));
    }
    server->set_tls_context(*t);
    if (reporter && *c) reporter->set_tls_context(*c);
    log.configure(fresh_config.log.level, fresh_config.log.format);
    peers->configure(fresh_config.admin);
    peers->resolve();
    // Open connections lose what the reload took away, before anything more is answered on them
    // (CONTRACT §10): admin-socket peers no longer admitted, HTTPS clients whose certificate the
    // client CA now in force does not accept. The reload's own answer is queued after this.
    server->recheck_access();
    admin_server->recheck_access();
    say(LogLevel::info, token_keys_line(**v));
    // What the node serves changes on the core thread; the reload is answered once it has, so that a
    // read after "reloaded" sees it (the snapshot is published by then). The wait is bounded: a core
    // thread that has stopped runs nothing more (a core destroyed with the task unrun breaks its
    // promise, which ends the wait at once).
    auto applied = asio::post(core, asio::use_future([this, v = *v, u = fresh_config.node.unsellable_units,
                                                      mode = fresh_config.enforcement.mode]() mutable {
                                core_apply_reload(std::move(v), std::move(u), mode);
                              }));
    if (applied.wait_for(kReloadApplyWait) != std::future_status::ready) {
      say(LogLevel::warning,
          fmt::format("reload: the core thread did not apply it within {} s; answering anyway",
                      kReloadApplyWait.count()));
    } else {
      try {
        applied.get();  // what the task threw, which the core thread's boundary no longer sees
      } catch (const std::exception& e) {
        say(LogLevel::error, fmt::format("reload: applying it on the core thread failed: {}", e.what()));
      }
    }
    say(LogLevel::info, reporter ? "reloaded: TLS files, token keys, log level and format, unsellable units, "
                                   "enforcement mode, admin peers, central API files"
                                 : "reloaded: TLS files, token keys, log level and format, unsellable units, "
                                   "enforcement mode, admin peers");
    outcome.reloaded = true;
    outcome.restart_needed = restart;
    return outcome;
  }

  void join_threads() {
    if (threads_done) return;
    threads_done = true;
    stopping = true;
    if (admin_thread.joinable()) {  // after a stop() its drain has ended it; else it ends now
      if (!stopped_serving) admin_io.stop();
      admin_thread.join();
    }
    if (reporter) reporter->stop();  // prompt: no request to the central API is waited for
    terminations.join();  // terminations stop waiting at once (their domains are finished at the next start)
    lists.join();
    slow.join();
    asio::post(core, [this] {
      if (audit_checkpoints) audit_checkpoints->stop();  // the next agent reports its checkpoint
      term_timer->cancel();
      rescan_timer.cancel();
      uevent_rescan.cancel();
      if (uevents) uevents->stop();
      if (driver) driver->stop();
      core_work.reset();
    });
    if (core_thread.joinable()) core_thread.join();
    if (hypervisor) hypervisor->watch({});  // no more events into `core`
  }
};

Daemon::Daemon(std::unique_ptr<Parts> parts) : p_(std::move(parts)) {}

Daemon::~Daemon() {
  if (!p_) return;
  p_->join_threads();
  p_->server.reset();
  p_->admin_server.reset();
  p_->driver.reset();
  p_->node.reset();
}

namespace {

// The GPU names, then the node's state opened (applying the terms that passed while the agent was
// down), and the hypervisor it drives.
error::Result<void> open_node(Daemon::Parts& p, const std::shared_ptr<const auth::TokenVerifier>& verifier) {
  const auto& cfg = p.cfg;
  const discovery::Policy policy = policy_from(cfg);
  auto names = discovery::PciIds::load(p.opt.pci_ids_file, policy.gpu_vendors);
  if (names)
    p.names.emplace(std::move(*names));
  else
    p.say(LogLevel::warning, fmt::format("no GPU names: {}", names.error().detail));

  const service::ServiceOptions so = service_options(cfg, p.opt.version);
  service::Clock clock = p.opt.clock ? p.opt.clock : [] { return std::chrono::system_clock::now(); };
  auto opened = service::NodeService::open(so, verifier, p.names ? &*p.names : nullptr, clock, p.log_sink());
  if (!opened)
    return std::unexpected(
        error::with_context(std::move(opened.error()), fmt::format("state {}", cfg.state.dir)));
  p.node = std::move(*opened);
  // libvirt connects lazily on the first call, and reconnects after libvirtd restarts.
  p.hypervisor = p.opt.hypervisor ? p.opt.hypervisor : vmctl::make_libvirt(cfg.libvirt.uri);
  return {};
}

// The Driver on the core thread: its pools, a grace's sleep that ends when the agent stops, the
// terms' timer re-armed (and the reporter woken) at each new revision, the workloads' events.
error::Result<void> start_driver(Daemon::Parts& p) {
  Daemon::Parts* raw = &p;
  Driver::Options dopt;
  dopt.lists = p.lists.get_executor();
  dopt.terminations = p.terminations.get_executor();
  dopt.sleeper = [raw](std::chrono::milliseconds d) {
    for (auto left = d; left.count() > 0; left -= std::chrono::milliseconds(50)) {
      if (raw->stopping) return false;
      std::this_thread::sleep_for(std::min(left, std::chrono::milliseconds(50)));
    }
    return !raw->stopping.load();
  };
  dopt.max_retry =
      std::max<std::chrono::milliseconds>(p.cfg.discovery.rescan_interval, std::chrono::seconds(1));
  p.revision = p.node->revision();
  auto term_timer = WallTimer::open(p.core);
  if (!term_timer) return std::unexpected(std::move(term_timer.error()));
  p.term_timer = std::move(*term_timer);
  dopt.on_revision = [raw](std::int64_t revision) {
    raw->revision = revision;
    raw->arm_terms();
    if (raw->reporter) raw->reporter->notify();  // a change is a commit, and every event is one
  };
  dopt.on_event = [raw] {
    if (raw->reporter) raw->reporter->notify();
  };
  p.driver.emplace(p.core, *p.node, p.hypervisor, std::move(dopt), p.log_sink());
  p.hypervisor->watch([raw] { raw->driver->workloads_event(); });
  return {};
}

// The admin socket's peers resolved, the open-file limit fitted to the connection caps, and both
// servers made and bound: HTTPS and metrics.listen on `net`, the admin socket on its own loop.
error::Result<void> bind_servers(Daemon::Parts& p, const std::shared_ptr<asio::ssl::context>& tls) {
  const auto& cfg = p.cfg;
  Daemon::Parts* raw = &p;
  p.peers = std::make_shared<AdminPeers>(cfg.admin);
  const auto gid = p.peers->resolve();  // at start, before serving: NSS may block here
  if (!gid && !cfg.admin.allowed_group.empty()) {
    p.say(LogLevel::info,
          fmt::format("admin group {} does not exist: the admin socket is for admin.allowed_uids only",
                      cfg.admin.allowed_group));
  }
  const auto fit = fit_open_files(cfg);
  if (!fit) return std::unexpected(fit.error());
  p.say(LogLevel::info, *fit);
  const auto handle = [raw](http::Request q, http::Reply reply) {
    raw->on_request(std::move(q), std::move(reply));
  };
  const auto log_line = [raw](std::string_view m) { raw->log.log(LogLevel::info, std::string(m)); };
  const auto observe = [raw](const http::Answered& a) {
    raw->http_metrics.record(a.method, a.path, a.status, a.took);
  };
  p.server.emplace(p.net, api_limits(cfg), handle, log_line, observe);
  p.admin_server.emplace(p.admin_io, admin_limits(cfg), handle, log_line, observe);
  return listen_all(*p.server, *p.admin_server, cfg, p.passed, tls, gid, p.peers);
}

// Reporting to the central API when central.url is set (`central`, its TLS context); else a line
// saying it is off.
error::Result<void> start_reporter(Daemon::Parts& p, std::shared_ptr<asio::ssl::context> central) {
  if (!central) {
    p.say(LogLevel::info,
          "central.url is empty: reporting to the central API is off (events are kept in the outbox)");
    return {};
  }
  Daemon::Parts* raw = &p;
  auto ro = reporter_options(p.cfg, p.opt.version, std::move(central));
  ro.audit_key = p.audit_key->public_pem();
  ro.facts = [raw] {
    return report::NodeFacts{raw->revision.load(), raw->hypervisor && raw->hypervisor->connected()};
  };
  ro.log = p.log_sink();
  auto reporter = report::Reporter::start(std::move(ro));
  if (!reporter) return std::unexpected(std::move(reporter.error()));
  p.reporter = std::move(*reporter);
  return {};
}

// The kernel's device events when there are any, the core loop's first turn queued (the terms,
// the rescan, the workloads), and the core and admin socket threads started.
void start_threads(Daemon::Parts& p) {
  Daemon::Parts* raw = &p;
  p.core_beat = std::chrono::steady_clock::now().time_since_epoch().count();
  if (auto u = UeventMonitor::open(p.core)) {
    p.uevents = std::move(*u);
  } else {
    p.say(LogLevel::info,
          fmt::format(
              "kernel device events are not available ({}): rescanning every {} s only", u.error().detail,
              std::chrono::duration_cast<std::chrono::seconds>(p.cfg.discovery.rescan_interval).count()));
  }
  asio::post(p.core, [raw] {
    if (raw->uevents) raw->uevents->watch([raw](const UeventNotice& n) { raw->on_uevent(n); });
    raw->run_terms();
    raw->arm_rescan();
    raw->audit_checkpoints->start();
    raw->driver->refresh();  // finishes terminations an earlier run left pending
  });
  p.core_thread = std::thread([raw] { run_guarded(raw->core, raw->log, "core"); });
  p.admin_thread = std::thread([raw] { run_guarded(raw->admin_io, raw->log, "admin socket"); });
}

}  // namespace

error::Result<std::unique_ptr<Daemon>> Daemon::start(DaemonOptions options) {
  auto p = std::make_unique<Parts>();
  p->opt = std::move(options);
  // Socket activation (CONTRACT §11): read first, while this is the only thread.
  const auto passed = sd_listen_fds();
  ignore_sigpipe();  // before libvirt, or a peer, may write to a socket that hung up
  // The config, and every file it names as this process would open it (CONTRACT §11): all problems at once.
  auto loaded = load_checked(p->opt.config_file);
  if (!loaded) {
    std::string all;
    for (const auto& x : loaded.error()) all += x.to_string() + "\n";
    return error::fail(error::Errc::invalid, fmt::format("{}{} is invalid", all, p->opt.config_file));
  }
  p->cfg = std::move(*loaded);
  const auto& cfg = p->cfg;
  p->log.configure(cfg.log.level, cfg.log.format);
  auto matched = match_passed(passed, cfg);
  if (!matched) return std::unexpected(std::move(matched.error()));
  p->passed = *matched;

  auto verifier = load_verifier(cfg);
  if (!verifier) return std::unexpected(std::move(verifier.error()));
  p->say(LogLevel::info, token_keys_line(**verifier));
  auto tls = http::make_tls_context(tls_files(cfg));
  if (!tls) return std::unexpected(std::move(tls.error()));
  auto central = central_tls(cfg);
  if (!central) return std::unexpected(std::move(central.error()));
  auto lock = lock_state_dir(cfg);
  if (!lock) return std::unexpected(std::move(lock.error()));
  p->lock.emplace(std::move(*lock));
  std::string key_line;
  auto audit_key = load_audit_key(cfg, key_line);
  if (!audit_key) return std::unexpected(std::move(audit_key.error()));
  p->audit_key = std::move(*audit_key);
  p->say(LogLevel::info, key_line);

  if (auto ok = open_node(*p, *verifier); !ok) return std::unexpected(std::move(ok.error()));
  p->node->set_audit_key(p->audit_key);
  p->audit_checkpoints.emplace(
      p->core, *p->node, cfg.audit.checkpoint_interval,
      [raw = p.get()] {
        if (raw->reporter) raw->reporter->notify();
      },
      p->log_sink(), p->opt.first_checkpoint_within);
  if (auto ok = start_driver(*p); !ok) return std::unexpected(std::move(ok.error()));
  if (auto ok = bind_servers(*p, *tls); !ok) return std::unexpected(std::move(ok.error()));
  if (auto ok = start_reporter(*p, *central); !ok) return std::unexpected(std::move(ok.error()));
  start_threads(*p);
  return std::unique_ptr<Daemon>(new Daemon(std::move(p)));
}

int Daemon::run(bool signals) {
  auto& p = *p_;
  p.say(LogLevel::info,
        fmt::format("gpunode-agent {} serving node {} on https://{}{} and {}{}{}", p.opt.version,
                    p.cfg.node.id, p.cfg.api.listen, p.passed.api ? " (systemd's socket)" : "",
                    p.cfg.admin.socket, p.passed.admin ? " (systemd's socket)" : "",
                    p.cfg.metrics.listen.empty()
                        ? std::string()
                        : fmt::format("; /metrics on http://{}", p.cfg.metrics.listen)));
  sd_notify("READY=1");
  asio::post(p_->slow, [] { ::malloc_trim(0); });  // what start-up freed goes back to the kernel
  if (auto interval = sd_watchdog_interval()) p.arm_watchdog(*interval);
  if (signals) {
    p.signals.add(SIGTERM);
    p.signals.add(SIGINT);
    p.signals.add(SIGHUP);
    p.wait_signal();
  }
  run_guarded(p.net, p.log, "network");  // a stop() before run() has queued the drain that ends it
  p.stopped_serving = true;              // the admin socket's drain, queued by stop() too, ends its thread
  p.join_threads();
  p.say(LogLevel::info, "stopped");
  return 0;
}

void Daemon::stop() {
  p_->stop();
}

void Daemon::reload() {
  asio::post(p_->slow, [p = p_.get()] {
    try {
      p->reload_now();
    } catch (const std::exception& e) {
      p->say(LogLevel::error, fmt::format("reload failed: {}", e.what()));
    }
  });
}

ReloadOutcome Daemon::reload_now() {
  return p_->reload_now();
}

void Daemon::submit(service::ApiRequest request, Respond respond) {
  asio::post(p_->core, [p = p_.get(), request = std::move(request), respond = std::move(respond)]() mutable {
    p->driver->submit(std::move(request), std::move(respond));
  });
}

std::uint16_t Daemon::tls_port() const {
  return p_->server->tls_port();
}

}  // namespace gpunode::daemon
