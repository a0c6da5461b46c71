// gpunode/daemon/driver.hpp: the one driver of the NodeService, used by the daemon and the tests.
//
// NodeService::handle() says what to do with a request (service::Outcome); the driver does it:
// answers, lists the domains off the state thread and handles the request again, runs a batch of
// terminations off the state thread and answers with finish(), or parks a long poll until the
// revision moves or its own deadline comes (CONTRACT §7 Deadlines). Every request it is given is
// answered exactly once, also one it drops (500, as http::Reply's last copy answers); an exception
// from the service is a 500 for that request, never the end of the thread.
//
// Threads: every member function runs on the state thread (the `core` io_context's one thread),
// except workloads_event(), which any thread may call (it posts to the state thread). Slow work goes to the
// executors of Options: `lists` runs Hypervisor::list(), `terminations` runs terminate_spot_all (which waits
// out grace periods). The daemon gives each a thread pool; the tests give them the core itself, which makes
// everything run on one thread, in order.
//
// Lifetime: the driver must outlive every run of `core` and every job it posted to the executors
// (the daemon joins its pools and stops `core` before it destroys the driver).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "gpunode/daemon/debounce.hpp"
#include "gpunode/service/node_service.hpp"
#include "gpunode/vmctl/vmctl.hpp"

namespace gpunode::daemon {

using Respond = std::function<void(service::ApiResponse)>;

class Driver {
 public:
  struct Options {
    boost::asio::any_io_executor lists;         // where Hypervisor::list() runs
    boost::asio::any_io_executor terminations;  // where batches of terminations run
    vmctl::Sleeper sleeper;                     // a termination's grace; false: the agent is stopping
    std::size_t max_parked = 4096;              // long polls parked at once; more are 503
    std::chrono::milliseconds max_retry = std::chrono::seconds(30);          // refresh backoff cap
    std::chrono::milliseconds event_delay = std::chrono::milliseconds(250);  // events -> refresh
    // On the state thread, each time changed() sees the revision move (after the commit that
    // moved it): the daemon publishes the revision and wakes the reporter. Must be quick.
    std::function<void(std::int64_t revision)> on_revision;
    // On the state thread, each time changed() sees an event stored that moved no revision (an
    // audit checkpoint): the daemon wakes the reporter. Must be quick.
    std::function<void()> on_event;
  };

  // `hypervisor` may be null: the service then answers 503 hypervisor-unavailable itself.
  Driver(boost::asio::io_context& core, service::NodeService& node,
         std::shared_ptr<vmctl::Hypervisor> hypervisor, Options options, service::LogSink log);
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // Handles one request; `respond` is called exactly once, on the state thread. A request the
  // driver lets go unanswered (its list or batch dropped with an executor that never ran it, a
  // parked poll dropped with the driver) is answered 500 and logged, on the thread that let it go.
  void submit(service::ApiRequest request, Respond respond);
  // After anything that may have moved the revision (a request, a tick, a rescan): the long polls
  // parked on an older revision are handled again.
  void changed();
  // Lists the domains (off this thread) and hands them to the service: reclaiming units are
  // vacated and terminations cut short are finished. A list that fails is retried after 1 s, 2 s,
  // 4 s... up to max_retry, so a restarted libvirtd is seen again within seconds.
  void refresh();
  // Any thread: libvirt reported a lifecycle event; refreshes event_delay after the first of a burst.
  void workloads_event();
  // SIGTERM: parked polls are answered now (304) and no poll is parked any more; no refresh starts.
  void stop();

  [[nodiscard]] std::size_t parked() const { return parked_.size(); }

 private:
  struct Answer;
  struct Parked;
  void dispatch(service::ApiRequest request, std::shared_ptr<Answer> answer);
  void list_then_dispatch(service::ApiRequest request, std::shared_ptr<Answer> answer);
  void run_batch(service::Work work, std::shared_ptr<Answer> answer);
  void park(service::ApiRequest request, std::shared_ptr<Answer> answer,
            std::chrono::steady_clock::time_point deadline);
  void after_refresh_failed();
  void arm_health();
  void say(service::LogLevel level, const std::string& text) const;

  boost::asio::io_context& core_;
  service::NodeService& node_;
  std::shared_ptr<vmctl::Hypervisor> hypervisor_;
  Options opt_;
  service::LogSink log_;

  // State-thread only (no lock): the parked polls, the revision they were last told about, the
  // retry and event timers.
  std::map<std::uint64_t, std::unique_ptr<Parked>> parked_;
  std::uint64_t next_parked_ = 1;
  std::int64_t announced_ = 0;
  std::int64_t announced_event_ = 0;  // the outbox's last event seq changed() has seen
  bool stopping_ = false;
  boost::asio::steady_timer retry_timer_;
  std::chrono::milliseconds retry_delay_{1000};
  bool retry_armed_ = false;
  Debounce event_refresh_;                  // a burst of events: one refresh, event_delay after the first
  boost::asio::steady_timer health_timer_;  // the next health poll (NodeService::health_interval)
  std::chrono::steady_clock::time_point last_event_{};  // when the last event reached this thread
  std::shared_ptr<const service::WorkloadListing> listing(
      std::expected<std::vector<vmctl::Domain>, vmctl::VmError> list,
      std::chrono::steady_clock::time_point listed_at) const;
};

}  // namespace gpunode::daemon
