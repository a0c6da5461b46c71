// gpunode/vmctl/fake_hypervisor.hpp: an in-memory Hypervisor for tests.
#pragma once

#include <algorithm>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gpunode/vmctl/vmctl.hpp"

namespace gpunode::vmctl {

// Domains live in `domains`; shutdown stops a domain at once unless its uuid is in
// `ignore_shutdown`; destroy always stops it. While `unavailable` is true every call fails with
// VmError unavailable; a missing domain is not_found, stopping one that is not running invalid (as
// the adapter maps libvirt's codes). `before_call` runs before each call with its name ("list", "record",
// "termination", "shutdown", "destroy", "state") and may change the fake (e.g. set `unavailable`).
// `calls` logs "NAME UUID" (or "list") for every call, including failing ones.
// Every call holds `mu` (a daemon calls it from its list and termination threads at once); a test
// that changes the fake while a daemon runs holds `mu` too. `before_call` runs under it.
class FakeHypervisor : public Hypervisor {
 public:
  std::vector<Domain> domains;
  std::set<std::string> ignore_shutdown;
  bool unavailable = false;
  std::function<void(const std::string& call)> before_call;
  std::vector<std::string> calls;
  mutable std::mutex mu;

  FakeHypervisor() = default;
  explicit FakeHypervisor(std::vector<Domain> initial) : domains(std::move(initial)) {}

  std::expected<std::vector<Domain>, VmError> list() override {
    std::lock_guard lock{mu};
    if (auto e = enter("list", "")) return std::unexpected(*e);
    return domains;
  }
  std::expected<void, VmError> record_termination(const std::string& uuid,
                                                  const TerminationRecord& record) override {
    std::lock_guard lock{mu};
    if (auto e = enter("record", uuid)) return std::unexpected(*e);
    Domain* d = find(uuid);
    if (d == nullptr) return std::unexpected(missing(uuid));
    d->termination = record;
    return {};
  }
  std::expected<std::optional<TerminationRecord>, VmError> termination(const std::string& uuid,
                                                                       Definition which) override {
    std::lock_guard lock{mu};
    if (auto e = enter("termination", uuid)) return std::unexpected(*e);
    Domain* d = find(uuid);
    if (d == nullptr) return std::unexpected(missing(uuid));
    if (which == Definition::live && !d->active())
      return std::unexpected(VmError{error::Errc::invalid, "domain is not running"});
    return d->termination;
  }
  std::expected<void, VmError> shutdown(const std::string& uuid) override {
    std::lock_guard lock{mu};
    if (auto e = enter("shutdown", uuid)) return std::unexpected(*e);
    Domain* d = find(uuid);
    if (d == nullptr) return std::unexpected(missing(uuid));
    if (!d->active()) return std::unexpected(VmError{error::Errc::invalid, "domain is not running"});
    if (!ignore_shutdown.contains(uuid)) d->state = "shutoff";
    return {};
  }
  std::expected<void, VmError> destroy(const std::string& uuid) override {
    std::lock_guard lock{mu};
    if (auto e = enter("destroy", uuid)) return std::unexpected(*e);
    Domain* d = find(uuid);
    if (d == nullptr) return std::unexpected(missing(uuid));
    if (!d->active()) return std::unexpected(VmError{error::Errc::invalid, "domain is not running"});
    d->state = "shutoff";
    return {};
  }
  std::expected<std::string, VmError> state(const std::string& uuid) override {
    std::lock_guard lock{mu};
    if (auto e = enter("state", uuid)) return std::unexpected(*e);
    Domain* d = find(uuid);
    if (d == nullptr) return std::unexpected(missing(uuid));
    return d->state;
  }
  bool connected() const override {
    std::lock_guard lock{mu};
    return !unavailable;
  }
  // Events as libvirt's adapter has them: watching() while `events` is set and it is available;
  // emit() is a lifecycle event (call it without holding mu).
  bool events = false;
  void watch(std::function<void()> on_change) override {
    std::lock_guard lock{mu};
    watcher = std::move(on_change);
  }
  bool watching() const override {
    std::lock_guard lock{mu};
    return events && !unavailable;
  }
  void emit() {
    std::function<void()> w;
    {
      std::lock_guard lock{mu};
      w = watcher;
    }
    if (w) w();
  }
  std::size_t count(const std::string& call) const {
    std::lock_guard lock{mu};
    return static_cast<std::size_t>(std::ranges::count(calls, call));
  }

  std::function<void()> watcher;  // guarded by mu

  Domain* find(const std::string& uuid) {
    auto it = std::ranges::find(domains, uuid, &Domain::uuid);
    return it == domains.end() ? nullptr : &*it;
  }

 private:
  std::optional<VmError> enter(const std::string& call, const std::string& uuid) {
    calls.push_back(uuid.empty() ? call : call + " " + uuid);
    if (before_call) before_call(call);
    if (unavailable) return VmError{error::Errc::unavailable, "fake hypervisor unavailable"};
    return std::nullopt;
  }
  static VmError missing(const std::string& uuid) {
    return VmError{error::Errc::not_found, "Domain not found: no domain with matching uuid '" + uuid + "'"};
  }
};

}  // namespace gpunode::vmctl
