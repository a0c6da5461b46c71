#include "gpunode/daemon/driver.hpp"

#include <fmt/format.h>

#include <boost/asio/post.hpp>
#include <exception>
#include <utility>
#include <variant>

#include "gpunode/daemon/cadence.hpp"

namespace gpunode::daemon {
namespace asio = boost::asio;
using service::ApiRequest;
using service::ApiResponse;
using service::internal_error;
using service::LogLevel;

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;  // clang before 17 has no aggregate deduction (P1816)

std::string what_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(std::move(e));
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

// Hypervisor calls never throw by contract; if one does anyway it is the hypervisor failing.
std::expected<std::vector<vmctl::Domain>, vmctl::VmError> list_safely(vmctl::Hypervisor& hv) {
  try {
    return hv.list();
  } catch (...) {
    return std::unexpected(
        vmctl::VmError{error::Errc::internal, "listing threw: " + what_of(std::current_exception())});
  }
}

}  // namespace

// The one answer a request gets, shared by every step that carries the request (a list, a batch,
// a parked poll): the first call answers and a later one is dropped (a bug, said in the log). When
// the last reference goes without an answer (a job dropped with its executor, a poll with the
// driver), it answers 500 on the thread that let it go and logs the request: the http layer's
// Reply guarantee (server.hpp), kept for every Respond, not only the server's.
struct Driver::Answer {
  Respond respond;
  service::LogSink log;
  std::string request;  // "REQUEST=ID METHOD PATH", for the log lines
  bool done = false;    // state thread while referenced; read by the destructor after the last release

  Answer(Respond r, service::LogSink l, const ApiRequest& q)
      : respond(std::move(r)),
        log(std::move(l)),
        request(fmt::format("REQUEST={} {} {}", q.request_id, q.method, q.path)) {}
  Answer(const Answer&) = delete;
  Answer& operator=(const Answer&) = delete;
  ~Answer() {
    if (done || !respond) return;
    say(LogLevel::error,
        fmt::format("{}: internal: the request was dropped unanswered; answered 500", request));
    try {
      respond(internal_error());
    } catch (...) {  // a destructor: the respond's own failure is the end of this answer
      say(LogLevel::error, fmt::format("{}: internal: its 500 could not be given", request));
    }
  }
  void operator()(ApiResponse r) {
    if (done) {
      say(LogLevel::error,
          fmt::format("{}: internal: answered twice; the second answer was dropped", request));
      return;
    }
    done = true;
    if (respond) respond(std::move(r));
  }
  void say(LogLevel level, const std::string& text) const {
    if (log) log(level, text);
  }
};

struct Driver::Parked {
  ApiRequest request;
  std::shared_ptr<Answer> answer;
  asio::steady_timer timer;
  Parked(ApiRequest q, std::shared_ptr<Answer> a, asio::io_context& io)
      : request(std::move(q)), answer(std::move(a)), timer(io) {}
};

Driver::Driver(asio::io_context& core, service::NodeService& node,
               std::shared_ptr<vmctl::Hypervisor> hypervisor, Options options, service::LogSink log)
    : core_(core),
      node_(node),
      hypervisor_(std::move(hypervisor)),
      opt_(std::move(options)),
      log_(std::move(log)),
      announced_(node.revision()),
      announced_event_(node.event_seq()),
      retry_timer_(core),
      event_refresh_(core.get_executor(), opt_.event_delay, Debounce::Mode::after_first,
                     [this] {
                       if (!stopping_) refresh();
                     }),
      health_timer_(core) {
  node_.set_has_hypervisor(hypervisor_ != nullptr);
  arm_health();
}

// Unit health (CONTRACT §13): the service polled when it opened; from then on every health.interval,
// on this thread, at the multiples of the interval (cadence.hpp: with the backstop rescan's). What a poll
// stored moves the revision like any change (it wakes the long polls and the reporter).
void Driver::arm_health() {
  const auto interval = node_.health_interval();
  if (!interval || stopping_) return;
  health_timer_.expires_at(next_on_cadence(std::chrono::steady_clock::now(), *interval));  // cadence.hpp
  health_timer_.async_wait([this](const boost::system::error_code& e) {
    if (e || stopping_) return;
    try {
      node_.poll_health();
    } catch (const std::exception& x) {
      say(LogLevel::error, fmt::format("internal error in the health poll: {}", x.what()));
    }
    changed();
    arm_health();
  });
}

Driver::~Driver() = default;

void Driver::say(LogLevel level, const std::string& text) const {
  if (log_) log_(level, text);
}

void Driver::submit(ApiRequest request, Respond respond) {
  auto answer = std::make_shared<Answer>(std::move(respond), log_, request);
  dispatch(std::move(request), std::move(answer));
  changed();
}

void Driver::dispatch(ApiRequest request, std::shared_ptr<Answer> answer) {
  service::Outcome out;
  // The request's log lines and the snapshot's publish wait until its answer has gone
  // (NodeService::handle): neither may delay an acknowledgement. Whatever else the outcome is,
  // after_answer() comes first.
  service::HeldLog held;
  try {
    out = node_.handle(request, held);
  } catch (...) {
    node_.after_answer(held);
    say(LogLevel::error, fmt::format("REQUEST={} internal error: {} {}: {}", request.request_id,
                                     request.method, request.path, what_of(std::current_exception())));
    (*answer)(internal_error());
    return;
  }
  if (!std::holds_alternative<ApiResponse>(out)) node_.after_answer(held);
  std::visit(
      Overloaded{
          [&](ApiResponse& r) {
            (*answer)(std::move(r));
            node_.after_answer(held);
          },
          [&](service::NeedsWorkloads&) {
            if (request.workloads || !hypervisor_) {  // asked twice: a bug, never a loop
              say(LogLevel::error,
                  fmt::format("REQUEST={} internal: the workloads were asked for twice", request.request_id));
              (*answer)(internal_error());
              return;
            }
            list_then_dispatch(std::move(request), std::move(answer));
          },
          [&](service::RunBatch& b) {
            // The write-ahead commit (with its workload.terminating notices, CONTRACT §12) is
            // announced, and the reporter woken, before any guest is asked to shut down.
            changed();
            run_batch(std::move(b.work), std::move(answer));
          },
          [&](service::Park& p) { park(std::move(request), std::move(answer), p.deadline); },
      },
      out);
}

void Driver::list_then_dispatch(ApiRequest request, std::shared_ptr<Answer> answer) {
  asio::post(opt_.lists, [this, request = std::move(request), answer = std::move(answer)]() mutable {
    const auto started = std::chrono::steady_clock::now();
    auto list = list_safely(*hypervisor_);
    asio::post(core_, [this, request = std::move(request), answer = std::move(answer), list = std::move(list),
                       started]() mutable {
      request.workloads = listing(std::move(list), started);  // the service takes it with the request
      dispatch(std::move(request), std::move(answer));
      changed();
    });
  });
}

void Driver::run_batch(service::Work work, std::shared_ptr<Answer> answer) {
  asio::post(opt_.terminations, [this, work = std::move(work), answer = std::move(answer)]() mutable {
    std::vector<vmctl::TerminationOutcome> outcomes;
    std::expected<std::vector<vmctl::Domain>, vmctl::VmError> after =
        std::unexpected(vmctl::VmError{error::Errc::unavailable, "no hypervisor"});
    if (hypervisor_) {
      try {
        outcomes = vmctl::terminate_spot_all(*hypervisor_, work.jobs, opt_.sleeper);
      } catch (...) {
        // Nothing is known of these domains: they stay pending, finished by a later refresh.
        const std::string why = "termination threw: " + what_of(std::current_exception());
        outcomes.clear();
        for (const auto& j : work.jobs)
          outcomes.push_back({j.domain.uuid, std::unexpected(vmctl::VmError{error::Errc::unavailable, why})});
      }
      after = list_safely(*hypervisor_);
    }
    asio::post(core_, [this, batch = work.batch, outcomes = std::move(outcomes), after = std::move(after),
                       answer = std::move(answer)]() mutable {
      ApiResponse r;
      try {
        r = node_.finish(batch, std::move(outcomes), after);
      } catch (...) {
        say(LogLevel::error, fmt::format("internal error recording termination batch {}: {}", batch,
                                         what_of(std::current_exception())));
        r = internal_error();
      }
      if (answer) (*answer)(std::move(r));
      changed();
      // libvirt went away meanwhile: what was left pending is finished by the first list that
      // succeeds, tried again from now on (not only at the next rescan).
      if (!after) after_refresh_failed();
    });
  });
}

void Driver::park(ApiRequest request, std::shared_ptr<Answer> answer,
                  std::chrono::steady_clock::time_point deadline) {
  if (stopping_) {  // answered now, as its wait had ended
    request.wait_over = true;
    dispatch(std::move(request), std::move(answer));
    return;
  }
  if (parked_.size() >= opt_.max_parked) {
    auto busy =
        service::problem(503, "too-many-waiters",
                         fmt::format("{} long polls are waiting already; retry shortly", parked_.size()));
    busy.headers.emplace_back("Retry-After", "1");
    (*answer)(std::move(busy));
    return;
  }
  const std::uint64_t id = next_parked_++;
  auto& p = *parked_.emplace(id, std::make_unique<Parked>(std::move(request), std::move(answer), core_))
                 .first->second;
  p.timer.expires_at(deadline);
  // Whether it fired or was cancelled, the poll is answered here only if it is still parked: a
  // change that woke it took it out of parked_ first, so it is never answered twice.
  p.timer.async_wait([this, id](const boost::system::error_code&) {
    auto it = parked_.find(id);
    if (it == parked_.end()) return;
    auto mine = std::move(it->second);
    parked_.erase(it);
    mine->request.wait_over = true;
    dispatch(std::move(mine->request), std::move(mine->answer));
  });
}

void Driver::changed() {
  const auto revision = node_.revision();
  const auto event = std::exchange(announced_event_, node_.event_seq());
  if (revision == announced_) {
    if (event != announced_event_ && opt_.on_event) opt_.on_event();
    return;
  }
  announced_ = revision;
  if (opt_.on_revision) opt_.on_revision(revision);
  auto woken = std::exchange(parked_, {});
  for (auto& [id, p] : woken) {
    p->timer.cancel();
    dispatch(std::move(p->request), std::move(p->answer));  // answered now, or parked again (same deadline)
  }
}

void Driver::refresh() {
  if (!hypervisor_ || stopping_) return;
  asio::post(opt_.lists, [this] {
    const auto started = std::chrono::steady_clock::now();
    auto list = list_safely(*hypervisor_);
    asio::post(core_, [this, list = std::move(list), started]() mutable {
      const bool listed = list.has_value();
      if (!listed) say(LogLevel::warning, "workload refresh: " + list.error().detail);
      std::optional<service::Work> work;
      try {
        work = node_.observe_workloads(listing(std::move(list), started));
      } catch (...) {
        say(LogLevel::error, "internal error in the workload refresh: " + what_of(std::current_exception()));
      }
      if (!listed) {
        after_refresh_failed();
        return;
      }
      retry_delay_ = std::chrono::milliseconds(1000);
      try {
        if (work) run_batch(std::move(*work), nullptr);
      } catch (...) {
        say(LogLevel::error, "internal error in the workload refresh: " + what_of(std::current_exception()));
      }
      changed();
    });
  });
}

void Driver::after_refresh_failed() {
  if (retry_armed_ || stopping_) return;
  retry_armed_ = true;
  retry_timer_.expires_after(retry_delay_);
  retry_delay_ = std::min(retry_delay_ * 2, opt_.max_retry);
  retry_timer_.async_wait([this](const boost::system::error_code& e) {
    retry_armed_ = false;
    if (!e && !stopping_) refresh();
  });
}

// A list as the service takes it: current while libvirt's events are watched and none came since
// the listing began (`listed_at`): an event meanwhile may be a domain the list missed.
std::shared_ptr<const service::WorkloadListing> Driver::listing(
    std::expected<std::vector<vmctl::Domain>, vmctl::VmError> list,
    std::chrono::steady_clock::time_point listed_at) const {
  const bool current = list.has_value() && hypervisor_->watching() && listed_at >= last_event_;
  return std::make_shared<const service::WorkloadListing>(
      service::WorkloadListing{std::move(list), listed_at, current});
}

void Driver::workloads_event() {
  asio::post(core_, [this] {
    last_event_ = std::chrono::steady_clock::now();
    node_.workloads_changed();  // the domains changed: the next request that needs them lists them
    if (!stopping_) event_refresh_.poke();
  });
}

void Driver::stop() {
  stopping_ = true;
  retry_timer_.cancel();
  event_refresh_.cancel();
  health_timer_.cancel();
  auto waiting = std::exchange(parked_, {});
  for (auto& [id, p] : waiting) {
    p->timer.cancel();
    p->request.wait_over = true;
    dispatch(std::move(p->request), std::move(p->answer));
  }
}

}  // namespace gpunode::daemon
