// Terminating spot domains (CONTRACT §4 terminate-spot, §5): the record first, then the stop.
// A batch is stopped together: every record is written, every graceful shutdown is asked for, the
// states are polled until each domain's grace is spent, then the survivors are destroyed. So 64
// domains with a 30 s grace take 30 s, not 32 minutes.
#include <algorithm>
#include <optional>

#include "gpunode/vmctl/vmctl.hpp"

namespace gpunode::vmctl {
namespace {

using std::chrono::milliseconds;

struct Running {
  const TerminationJob* job = nullptr;
  std::optional<std::expected<TerminateResult, VmError>> outcome;  // set once decided
  bool shutdown_asked = false;
  std::string shutdown_note;
  std::string last_state;

  [[nodiscard]] bool live() const { return !outcome.has_value(); }
  void fail(VmError e) { outcome = std::unexpected(std::move(e)); }
  void done(bool terminated, std::string detail) { outcome = TerminateResult{terminated, std::move(detail)}; }
};

// Gone: inactive, or no longer defined (a transient domain vanishes when stopped).
std::expected<bool, VmError> gone(Hypervisor& hv, Running& r) {
  auto state = hv.state(r.job->domain.uuid);
  if (!state) {
    if (state.error().code == error::Errc::not_found) return true;
    return std::unexpected(state.error());
  }
  r.last_state = *state;
  return !state_active(*state);
}

// 1. The record goes first, so that it outlives the stop; without it nothing is stopped.
void record_all(Hypervisor& hv, std::vector<Running>& runs) {
  for (auto& r : runs) {
    const auto& d = r.job->domain;
    if (!d.label || d.label->tier != Tier::spot) {
      r.fail(VmError{error::Errc::invalid, "not spot"});
      continue;
    }
    if (auto recorded = hv.record_termination(d.uuid, r.job->record); !recorded) {
      auto e = recorded.error();  // not_found: it went away by itself before we touched it
      e.detail = "the termination record could not be written, nothing was stopped: " + e.detail;
      r.fail(std::move(e));
      continue;
    }
    auto g = gone(hv, r);
    if (!g)
      r.fail(g.error());
    else if (*g)
      r.done(true, "already stopped");
  }
}

// 2. Graceful shutdowns for those with a grace period.
void ask_shutdowns(Hypervisor& hv, std::vector<Running>& runs) {
  for (auto& r : runs) {
    if (!r.live() || r.job->grace <= std::chrono::seconds{0}) continue;
    auto down = hv.shutdown(r.job->domain.uuid);
    if (!down && down.error().code == error::Errc::unavailable) {
      r.fail(down.error());
      continue;
    }
    if (!down) r.shutdown_note = "; graceful shutdown refused: " + down.error().detail;
    r.shutdown_asked = static_cast<bool>(down);
  }
}

// One poll of the domains asked to shut down: those now gone are decided. Returns how long until
// the soonest grace of those still running is spent (milliseconds::max() when none is left).
milliseconds poll_shutdowns(Hypervisor& hv, std::vector<Running>& runs, milliseconds waited) {
  milliseconds next = milliseconds::max();
  for (auto& r : runs) {
    if (!r.live() || !r.shutdown_asked) continue;
    auto g = gone(hv, r);
    if (!g) {
      r.fail(g.error());
      continue;
    }
    if (*g) {
      r.done(true, "shut down gracefully");
      continue;
    }
    const milliseconds limit = r.job->grace;
    if (waited < limit) next = std::min(next, limit - waited);
  }
  return next;
}

// 3. Poll until each domain is down or its grace is spent.
void wait_out_grace(Hypervisor& hv, std::vector<Running>& runs, const Sleeper& sleep) {
  milliseconds waited{0};
  while (true) {
    const milliseconds next = poll_shutdowns(hv, runs, waited);
    if (next == milliseconds::max()) break;
    const milliseconds step = std::min(terminate_poll_interval, next);
    if (!sleep(step)) {  // the agent is stopping: decided nothing, the caller finishes later
      for (auto& r : runs) {
        if (r.live())
          r.fail(VmError{error::Errc::unavailable, "the agent stopped before the grace period ended"});
      }
      break;
    }
    waited += step;
  }
}

// 4. Destroy what is still running.
void destroy_survivors(Hypervisor& hv, std::vector<Running>& runs) {
  for (auto& r : runs) {
    if (!r.live()) continue;
    const auto& uuid = r.job->domain.uuid;
    auto destroyed = hv.destroy(uuid);
    if (!destroyed && destroyed.error().code == error::Errc::unavailable) {
      r.fail(destroyed.error());
      continue;
    }
    auto g = gone(hv, r);
    if (!g) {
      r.fail(g.error());
      continue;
    }
    const std::string how =
        r.job->grace > std::chrono::seconds{0} ? "destroyed after the grace period" : "destroyed";
    if (*g)
      r.done(true, how + r.shutdown_note);
    else if (!destroyed)
      r.done(false, "destroy failed: " + destroyed.error().detail + r.shutdown_note);
    else
      r.done(false, "still " + r.last_state + " after destroy" + r.shutdown_note);
  }
}

}  // namespace

std::vector<TerminationOutcome> terminate_spot_all(Hypervisor& hv, const std::vector<TerminationJob>& jobs,
                                                   const Sleeper& sleep) {
  std::vector<Running> runs(jobs.size());
  for (std::size_t i = 0; i < jobs.size(); ++i) runs[i].job = &jobs[i];
  record_all(hv, runs);
  ask_shutdowns(hv, runs);
  wait_out_grace(hv, runs, sleep);
  destroy_survivors(hv, runs);

  std::vector<TerminationOutcome> out;
  out.reserve(runs.size());
  for (auto& r : runs) out.push_back(TerminationOutcome{r.job->domain.uuid, std::move(*r.outcome)});
  return out;
}

std::expected<TerminateResult, VmError> terminate_spot(
    Hypervisor& hypervisor, const Domain& domain, const TerminationRecord& record, std::chrono::seconds grace,
    const std::function<void(std::chrono::milliseconds)>& sleep) {
  std::vector<TerminationJob> one{TerminationJob{domain, record, grace}};
  auto out = terminate_spot_all(hypervisor, one, [&](milliseconds d) {
    sleep(d);
    return true;
  });
  return std::move(out.front().result);
}

}  // namespace gpunode::vmctl
