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
};

// Gone: inactive, or no longer defined (a transient domain vanishes when stopped).
std::expected<bool, VmError> gone(Hypervisor& hv, Running& r) {
  auto state = hv.state(r.job->domain.uuid);
  if (!state) {
    if (state.error().kind == VmError::Kind::not_found) return true;
    return std::unexpected(state.error());
  }
  r.last_state = *state;
  return !state_active(*state);
}

}  // namespace

std::vector<TerminationOutcome> terminate_spot_all(Hypervisor& hv, const std::vector<TerminationJob>& jobs,
                                                   const Sleeper& sleep) {
  std::vector<Running> runs(jobs.size());
  for (std::size_t i = 0; i < jobs.size(); ++i) runs[i].job = &jobs[i];
  auto fail = [](Running& r, VmError e) { r.outcome = std::unexpected(std::move(e)); };
  auto done = [](Running& r, bool terminated, std::string detail) {
    r.outcome = TerminateResult{terminated, std::move(detail)};
  };
  auto live = [](const Running& r) { return !r.outcome.has_value(); };

  // 1. The record goes first, so that it outlives the stop; without it nothing is stopped.
  for (auto& r : runs) {
    const auto& d = r.job->domain;
    if (!d.label || d.label->tier != Tier::spot) {
      fail(r, VmError{VmError::Kind::failed, "not spot"});
      continue;
    }
    if (auto recorded = hv.record_termination(d.uuid, r.job->record); !recorded) {
      auto e = recorded.error();  // not_found: it went away by itself before we touched it
      e.message = "the termination record could not be written, nothing was stopped: " + e.message;
      fail(r, std::move(e));
      continue;
    }
    auto g = gone(hv, r);
    if (!g)
      fail(r, g.error());
    else if (*g)
      done(r, true, "already stopped");
  }

  // 2. Graceful shutdowns for those with a grace period.
  for (auto& r : runs) {
    if (!live(r) || r.job->grace <= std::chrono::seconds{0}) continue;
    auto down = hv.shutdown(r.job->domain.uuid);
    if (!down && down.error().kind == VmError::Kind::unavailable) {
      fail(r, down.error());
      continue;
    }
    if (!down) r.shutdown_note = "; graceful shutdown refused: " + down.error().message;
    r.shutdown_asked = static_cast<bool>(down);
  }

  // 3. Poll until each domain is down or its grace is spent.
  milliseconds waited{0};
  while (true) {
    milliseconds next = milliseconds::max();
    for (auto& r : runs) {
      if (!live(r) || !r.shutdown_asked) continue;
      auto g = gone(hv, r);
      if (!g) {
        fail(r, g.error());
        continue;
      }
      if (*g) {
        done(r, true, "shut down gracefully");
        continue;
      }
      const milliseconds limit = r.job->grace;
      if (waited < limit) next = std::min(next, limit - waited);
    }
    if (next == milliseconds::max()) break;
    const milliseconds step = std::min(terminate_poll_interval, next);
    if (!sleep(step)) {  // the agent is stopping: decided nothing, the caller finishes later
      for (auto& r : runs) {
        if (live(r))
          fail(r, VmError{VmError::Kind::unavailable, "the agent stopped before the grace period ended"});
      }
      break;
    }
    waited += step;
  }

  // 4. Destroy what is still running.
  for (auto& r : runs) {
    if (!live(r)) continue;
    const auto& uuid = r.job->domain.uuid;
    auto destroyed = hv.destroy(uuid);
    if (!destroyed && destroyed.error().kind == VmError::Kind::unavailable) {
      fail(r, destroyed.error());
      continue;
    }
    auto g = gone(hv, r);
    if (!g) {
      fail(r, g.error());
      continue;
    }
    const std::string how =
        r.job->grace > std::chrono::seconds{0} ? "destroyed after the grace period" : "destroyed";
    if (*g)
      done(r, true, how + r.shutdown_note);
    else if (!destroyed)
      done(r, false, "destroy failed: " + destroyed.error().message + r.shutdown_note);
    else
      done(r, false, "still " + r.last_state + " after destroy" + r.shutdown_note);
  }

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
