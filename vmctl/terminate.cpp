// Terminating one spot domain (CONTRACT §4 terminate-spot, §5): record first, then stop it.
#include <algorithm>

#include "gpunode/vmctl/vmctl.hpp"

namespace gpunode::vmctl {

std::expected<TerminateResult, VmError> terminate_spot(Hypervisor& hypervisor, const Domain& domain,
                                                       const TerminationRecord& record,
                                                       std::chrono::seconds grace,
                                                       const std::function<void(std::chrono::milliseconds)>& sleep) {
  using std::chrono::milliseconds;
  if (!domain.label || domain.label->tier != Tier::spot)
    return std::unexpected(VmError{VmError::Kind::failed, "not spot"});
  const std::string& uuid = domain.uuid;

  // The record goes first, so that it outlives the stop; without it nothing is stopped.
  if (auto recorded = hypervisor.record_termination(uuid, record); !recorded)
    return std::unexpected(recorded.error());

  // Gone: inactive, or no longer defined (a transient domain vanishes when stopped).
  std::string last_state;
  auto gone = [&]() -> std::expected<bool, VmError> {
    auto state = hypervisor.state(uuid);
    if (!state) {
      if (state.error().kind == VmError::Kind::not_found) return true;
      return std::unexpected(state.error());
    }
    last_state = *state;
    return !state_active(*state);
  };

  auto initially = gone();
  if (!initially) return std::unexpected(initially.error());
  if (*initially) return TerminateResult{true, "already stopped"};

  std::string shutdown_note;
  if (grace > std::chrono::seconds{0}) {
    auto down = hypervisor.shutdown(uuid);
    if (!down && down.error().kind == VmError::Kind::unavailable) return std::unexpected(down.error());
    if (!down) shutdown_note = "; graceful shutdown refused: " + down.error().message;
    milliseconds waited{0};
    const milliseconds limit = grace;
    while (down) {
      auto g = gone();
      if (!g) return std::unexpected(g.error());
      if (*g) return TerminateResult{true, "shut down gracefully"};
      if (waited >= limit) break;
      const milliseconds step = std::min(terminate_poll_interval, limit - waited);
      sleep(step);
      waited += step;
    }
  }

  auto destroyed = hypervisor.destroy(uuid);
  if (!destroyed && destroyed.error().kind == VmError::Kind::unavailable)
    return std::unexpected(destroyed.error());
  auto g = gone();
  if (!g) return std::unexpected(g.error());
  const std::string how = grace > std::chrono::seconds{0} ? "destroyed after the grace period" : "destroyed";
  if (*g) return TerminateResult{true, how + shutdown_note};
  if (!destroyed) return TerminateResult{false, "destroy failed: " + destroyed.error().message + shutdown_note};
  return TerminateResult{false, "still " + last_state + " after destroy" + shutdown_note};
}

}  // namespace gpunode::vmctl
