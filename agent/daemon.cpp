// The daemon: two event loops. `net` runs the HTTPS listener and the admin socket (Beast);
// `core` is one thread that owns the NodeService (SQLite, discovery, the clock's timers). A request
// is parsed on `net`, handled on `core`, and answered back on `net`: the reactor never waits for
// an fsync.
#include "daemon.hpp"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <atomic>
#include <filesystem>
#include <list>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <fmt/format.h>

#include "gpunode/auth/token_verifier.hpp"
#include "gpunode/config/config.hpp"
#include "gpunode/discovery/pci_ids.hpp"
#include "gpunode/http/server.hpp"
#include "gpunode/service/node_service.hpp"
#include "log.hpp"
#include "policy.hpp"
#include "sd_notify.hpp"

namespace gpunode::agent {
namespace {

namespace asio = boost::asio;
using config::LogLevel;


// Who may use the admin socket: a uid of admin.allowed_uids, or a member of admin.allowed_group.
class AdminPeers {
 public:
  explicit AdminPeers(const config::Config::Admin& a) : uids_(a.allowed_uids), group_name_(a.allowed_group) {}
  // Called on the I/O thread for each admin-socket connection. The group is looked up when a peer
  // first needs it (NSS modules are loaded then, not at start), and again on every such check, so
  // a group created after start counts.
  bool allowed(const http::Peer& peer) const {
    if (!peer.uid) return false;
    if (std::find(uids_.begin(), uids_.end(), *peer.uid) != uids_.end()) return true;
    if (group_name_.empty()) return false;
    std::optional<gid_t> gid;
    {
      group g{};
      group* found = nullptr;
      std::vector<char> buf(16384);
      if (::getgrnam_r(group_name_.c_str(), &g, buf.data(), buf.size(), &found) == 0 && found != nullptr) gid = found->gr_gid;
    }
    if (!gid) return false;
    if (peer.gid && *peer.gid == *gid) return true;
    passwd pwd{};
    passwd* pw = nullptr;
    std::vector<char> pbuf(16384);
    if (::getpwuid_r(*peer.uid, &pwd, pbuf.data(), pbuf.size(), &pw) != 0 || pw == nullptr) return false;
    int n = 64;
    std::vector<gid_t> groups(static_cast<std::size_t>(n));
    if (::getgrouplist(pw->pw_name, pw->pw_gid, groups.data(), &n) < 0) {
      groups.resize(static_cast<std::size_t>(n));
      if (::getgrouplist(pw->pw_name, pw->pw_gid, groups.data(), &n) < 0) return false;
    }
    groups.resize(static_cast<std::size_t>(n));
    return std::find(groups.begin(), groups.end(), *gid) != groups.end();
  }

 private:
  std::vector<std::uint32_t> uids_;
  std::string group_name_;
};

service::ApiRequest to_api(http::Request&& q) {
  service::ApiRequest a;
  a.method = std::move(q.method);
  a.path = std::move(q.path);
  a.query = std::move(q.query);
  a.headers = std::move(q.headers);
  std::erase_if(a.headers, [](const auto& h) { return h.first.starts_with("x-gpunode-"); });  // ours, internal
  a.body = std::move(q.body);
  a.via = q.peer.kind == http::Peer::Kind::unix_socket ? service::ApiRequest::Via::admin_socket
                                                      : service::ApiRequest::Via::https;
  if (q.peer.uid) a.peer_uid = static_cast<std::uint32_t>(*q.peer.uid);
  a.request_id = std::move(q.request_id);
  return a;
}

std::expected<std::shared_ptr<const auth::TokenVerifier>, std::string> load_verifier(const config::Config& c) {
  auto v = auth::TokenVerifier::from_files(c.auth.keys, {c.auth.issuer, c.auth.audience, c.node.id, std::chrono::seconds(60)});
  if (!v) return std::unexpected(v.error());
  return std::make_shared<const auth::TokenVerifier>(std::move(*v));
}

}  // namespace

int run_daemon(const std::string& config_file, const std::string& pci_ids_file, const std::string& version) {
  Logger log;
  auto loaded = config::load_file(config_file, config::Purpose::run);
  if (!loaded.ok()) {
    for (const auto& p : loaded.problems) fmt::print(stderr, "{}\n", p.to_string());
    fmt::print(stderr, "gpunode-agent: refusing to start: {} is invalid\n", config_file);
    return 1;
  }
  config::Config cfg = std::move(loaded.config);
  log.configure(cfg.log.level, cfg.log.format);
  auto fail = [&](const std::string& what) {
    log.log(LogLevel::error, "refusing to start: " + what);
    return 1;
  };

  auto verifier = load_verifier(cfg);
  if (!verifier) return fail(verifier.error());
  auto tls = http::make_tls_context({cfg.api.tls.cert, cfg.api.tls.key, cfg.api.tls.client_ca});
  if (!tls) return fail(tls.error());
  std::error_code ec;
  std::filesystem::create_directories(cfg.state.dir, ec);
  if (ec) return fail(fmt::format("cannot create state directory {}: {}", cfg.state.dir, ec.message()));
  ::chmod(cfg.state.dir.c_str(), 0700);

  const discovery::Policy policy = policy_from(cfg);
  auto names = discovery::PciIds::load(pci_ids_file, policy.gpu_vendors);
  if (!names) log.log(LogLevel::warning, fmt::format("no GPU names: {}", names.error()));

  service::ServiceOptions opts{cfg.node.id, cfg.node.owner_org, policy, cfg.discovery.host_root, cfg.state.dir, version,
                               std::chrono::duration_cast<std::chrono::seconds>(cfg.libvirt.shutdown_grace)};
  auto service_log = [&log](service::LogLevel level, const std::string& text) {
    log.log(static_cast<LogLevel>(static_cast<int>(level)), text);
  };
  auto opened = service::NodeService::open(opts, *verifier, names ? &*names : nullptr,
                                           [] { return std::chrono::system_clock::now(); }, service_log);
  if (!opened) return fail(fmt::format("state {}: {}", cfg.state.dir, opened.error()));
  std::unique_ptr<service::NodeService> node = std::move(*opened);
  // libvirt connects lazily on the first call, and reconnects after libvirtd restarts.
  std::shared_ptr<vmctl::Hypervisor> hypervisor = vmctl::make_libvirt(cfg.libvirt.uri);
  node->set_hypervisor(hypervisor);
  node->set_list_off_thread(true);  // the state thread never waits for libvirt

  asio::io_context net;
  asio::io_context core;
  auto core_work = asio::make_work_guard(core);
  // Terminations wait for domains to stop (a grace of up to 300 s): they run here, never on `core`
  // or `net`. The workload refresh lists the domains here too.
  asio::thread_pool vm_pool(4);
  // Lists of the domains (for requests and the refresh) have a thread of their own, so that they
  // never queue behind terminations waiting out a grace period.
  asio::thread_pool list_pool(1);
  std::atomic<bool> stopping = false;
  const vmctl::Sleeper sleeper = [&stopping](std::chrono::milliseconds d) {
    for (auto left = d; left.count() > 0; left -= std::chrono::milliseconds(50)) {
      if (stopping) return false;
      std::this_thread::sleep_for(std::min(left, std::chrono::milliseconds(50)));
    }
    return !stopping.load();
  };

  // The clock's timers run on `core`, beside the service.
  asio::steady_timer term_timer(core);
  asio::steady_timer rescan_timer(core);
  std::function<void()> on_change = [] {};
  // Runs a batch of terminations on vm_pool, then records it on `core` and answers `reply` (if any).
  std::function<void(service::Work, std::function<void(service::ApiResponse)>)> run_work =
      [&](service::Work w, std::function<void(service::ApiResponse)> done) {
        asio::post(vm_pool, [&, w = std::move(w), done = std::move(done)]() mutable {
          auto outcomes = vmctl::terminate_spot_all(*hypervisor, w.jobs, sleeper);
          auto after = hypervisor->list();
          asio::post(core, [&, batch = w.batch, outcomes = std::move(outcomes), after = std::move(after), done = std::move(done)]() mutable {
            auto r = node->finish(batch, std::move(outcomes), after);
            if (done) done(std::move(r));
            on_change();
          });
        });
      };
  // The workloads as libvirt lists them: vacated reclaiming units, terminations to finish.
  // While libvirt cannot be reached, the refresh is retried after 1 s, 2 s, 4 s... up to the rescan
  // interval, so that after a libvirtd restart the agent reconnects (and hears events again, and
  // finishes cut-short terminations) within seconds rather than at the next rescan.
  asio::steady_timer retry_timer(core);
  auto retry_delay = std::chrono::milliseconds(1000);
  bool retry_armed = false;
  std::function<void()> refresh_workloads;
  refresh_workloads = [&] {
    asio::post(list_pool, [&] {
      auto list = hypervisor->list();
      if (!list) {
        log.log(LogLevel::warning, "workload refresh: " + list.error().message);
        asio::post(core, [&] {
          if (retry_armed || stopping) return;
          retry_armed = true;
          retry_timer.expires_after(retry_delay);
          retry_delay = std::min(retry_delay * 2, std::chrono::milliseconds(cfg.discovery.rescan_interval));
          retry_timer.async_wait([&](const boost::system::error_code& e) {
            retry_armed = false;
            if (!e && !stopping) refresh_workloads();
          });
        });
        return;
      }
      asio::post(core, [&, list = std::move(*list)] {
        retry_delay = std::chrono::milliseconds(1000);
        if (auto w = node->observe_workloads(list)) run_work(std::move(*w), nullptr);
        on_change();
      });
    });
  };
  std::function<void()> arm_terms = [&] {
    auto next = node->tick();
    on_change();
    auto wait = std::chrono::seconds(1);  // at the latest every second: "within a second"
    if (next) {
      auto until = *next - std::chrono::system_clock::now();
      if (until < wait) wait = std::max(std::chrono::duration_cast<std::chrono::seconds>(until), std::chrono::seconds(0));
    }
    term_timer.expires_after(wait == std::chrono::seconds(0) ? std::chrono::milliseconds(50) : std::chrono::milliseconds(wait));
    term_timer.async_wait([&](const boost::system::error_code& e) {
      if (!e) arm_terms();
    });
  };
  // libvirt's lifecycle events (a domain started, stopped, defined...) refresh the workloads a
  // quarter second after the first of a burst, so reclaiming units are vacated as soon as their
  // spot VMs stop; the periodic refresh remains the backstop.
  asio::steady_timer event_timer(core);
  bool event_refresh_armed = false;
  hypervisor->watch([&] {
    asio::post(core, [&] {
      if (event_refresh_armed || stopping) return;
      event_refresh_armed = true;
      event_timer.expires_after(std::chrono::milliseconds(250));
      event_timer.async_wait([&](const boost::system::error_code& e) {
        event_refresh_armed = false;
        if (!e && !stopping) refresh_workloads();
      });
    });
  });
  std::function<void()> arm_rescan = [&] {
    rescan_timer.expires_after(std::chrono::milliseconds(cfg.discovery.rescan_interval));
    rescan_timer.async_wait([&](const boost::system::error_code& e) {
      if (e) return;
      node->rescan();
      on_change();
      if (!stopping) refresh_workloads();
      arm_rescan();
    });
  };
  asio::post(core, [&] {
    arm_terms();
    arm_rescan();
    refresh_workloads();  // finishes terminations an earlier run left pending
  });

  // Long polls of GET .../state wait here (on `core`) until the revision moves or their wait ends.
  struct Parked {
    service::ApiRequest request;
    http::Reply reply;
    asio::steady_timer timer;
    Parked(service::ApiRequest q, http::Reply r, asio::io_context& io) : request(std::move(q)), reply(std::move(r)), timer(io) {}
  };
  std::list<std::shared_ptr<Parked>> parked;
  std::int64_t announced_revision = node->revision();
  std::function<void(service::ApiRequest, http::Reply)> answer = [&](service::ApiRequest a, http::Reply reply) {
    service::ApiResponse r = node->handle(a);
    if (r.status == 0 && r.needs_workloads) {  // list the domains off this thread, then again
      asio::post(list_pool, [&, a = std::move(a), reply = std::move(reply)]() mutable {
        auto listing = std::make_shared<const service::WorkloadListing>(service::WorkloadListing{hypervisor->list()});
        asio::post(core, [&, a = std::move(a), reply = std::move(reply), listing = std::move(listing)]() mutable {
          a.workloads = std::move(listing);
          answer(std::move(a), std::move(reply));
          on_change();
        });
      });
      return;
    }
    if (r.status == 0 && r.work != 0) {  // terminations first, off this thread
      if (auto w = node->work(r.work)) {
        run_work(std::move(*w), [reply = std::move(reply)](service::ApiResponse done) mutable {
          reply(http::Response{done.status, std::move(done.headers), std::move(done.body)});
        });
        return;
      }
      r = service::problem(500, "internal", "a termination batch went missing");
    }
    if (r.status == 0) {
      const auto ms_text = r.header("X-Gpunode-Wait-Ms").value_or("0");
      std::int64_t ms = 0;
      std::from_chars(ms_text.data(), ms_text.data() + ms_text.size(), ms);  // the service's own number
      const auto wait = std::chrono::milliseconds(ms);
      auto p = std::make_shared<Parked>(std::move(a), std::move(reply), core);
      parked.push_back(p);
      p->timer.expires_after(wait);
      p->timer.async_wait([&, p](const boost::system::error_code& e) {
        if (e) return;  // woken by a change instead
        parked.remove(p);
        p->request.headers.emplace_back("x-gpunode-waited", "1");
        answer(std::move(p->request), std::move(p->reply));
      });
      return;
    }
    reply(http::Response{r.status, std::move(r.headers), std::move(r.body)});
  };
  // After anything that may change the revision: wake the long polls.
  auto changed = [&] {
    if (node->revision() == announced_revision) return;
    announced_revision = node->revision();
    auto woken = std::move(parked);
    parked.clear();
    for (auto& p : woken) {
      p->timer.cancel();
      answer(std::move(p->request), std::move(p->reply));
    }
  };
  on_change = changed;

  http::Server server(net, http::Limits{}, [&](http::Request q, http::Reply reply) {
    asio::post(core, [&, q = std::move(q), reply = std::move(reply)]() mutable {
      answer(to_api(std::move(q)), std::move(reply));
      changed();
    });
  }, [&](std::string_view m) { log.log(LogLevel::info, std::string(m)); });

  if (auto l = server.listen_tls(cfg.api.listen, *tls); !l) return fail(l.error());
  auto peers = std::make_shared<AdminPeers>(cfg.admin);
  if (auto l = server.listen_unix(cfg.admin.socket, 0660, [peers](const http::Peer& p) { return peers->allowed(p); }); !l) {
    return fail(l.error());
  }

  std::thread core_thread([&] { core.run(); });
  log.log(LogLevel::info, fmt::format("gpunode-agent {} serving node {} on https://{} and {}", version, cfg.node.id,
                                      cfg.api.listen, cfg.admin.socket));
  sd_notify("READY=1");

  // systemd's watchdog, petted from the network loop (a stuck reactor stops the pets).
  asio::steady_timer watchdog(net);
  const auto watchdog_interval = sd_watchdog_interval();
  std::function<void()> pet = [&] {
    sd_notify("WATCHDOG=1");
    watchdog.expires_after(*watchdog_interval / 2);
    watchdog.async_wait([&](const boost::system::error_code& e) {
      if (!e) pet();
    });
  };
  if (watchdog_interval) pet();

  asio::signal_set signals(net, SIGTERM, SIGINT, SIGHUP);
  std::function<void()> wait_signal = [&] {
    signals.async_wait([&](const boost::system::error_code& e, int sig) {
      if (e) return;
      if (sig == SIGHUP) {
        auto fresh = config::load_file(config_file, config::Purpose::run);
        if (!fresh.ok()) {
          for (const auto& p : fresh.problems) log.log(LogLevel::error, "reload: " + p.to_string());
          log.log(LogLevel::error, "reload refused: keeping the running configuration");
        } else {
          auto v = load_verifier(fresh.config);
          auto t = http::make_tls_context({fresh.config.api.tls.cert, fresh.config.api.tls.key, fresh.config.api.tls.client_ca});
          if (!v || !t) {
            log.log(LogLevel::error, "reload refused: " + (v ? t.error() : v.error()));
          } else {
            server.set_tls_context(*t);
            log.configure(fresh.config.log.level, fresh.config.log.format);
            asio::post(core, [&node, v = *v, u = fresh.config.node.unsellable_units]() mutable {
              node->set_verifier(v);
              node->set_unsellable(std::move(u));
            });
            log.log(LogLevel::info, "reloaded: TLS files, token keys, log level, unsellable units");
          }
        }
        wait_signal();
        return;
      }
      if (stopping.exchange(true)) return;
      log.log(LogLevel::info, fmt::format("signal {}: stopping (draining connections)", sig));
      sd_notify("STOPPING=1");
      asio::post(core, [&] {  // long polls are answered now (304), not at the end of their wait
        auto waiting = std::move(parked);
        parked.clear();
        for (auto& p : waiting) {
          p->timer.cancel();
          p->request.headers.emplace_back("x-gpunode-waited", "1");
          answer(std::move(p->request), std::move(p->reply));
        }
      });
      watchdog.cancel();
      server.shutdown(std::chrono::seconds(10), [&] {
        signals.cancel();
        net.stop();
      });
    });
  };
  wait_signal();
  net.run();

  stopping = true;
  vm_pool.join();  // terminations stop waiting at once (their domains are finished at the next start)
  list_pool.join();
  asio::post(core, [&] {
    term_timer.cancel();
    rescan_timer.cancel();
    event_timer.cancel();
    retry_timer.cancel();
    core_work.reset();
  });
  core_thread.join();
  hypervisor->watch({});  // no more events into `core`, which goes away with this scope
  node.reset();
  log.log(LogLevel::info, "stopped");
  return 0;
}

}  // namespace gpunode::agent
