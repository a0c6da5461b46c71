// The termination ledger (see termination_ledger.hpp).
#include "termination_ledger.hpp"

namespace gpunode::service::detail {

void TerminationLedger::follow(TerminationRow row) {
  row.audit_index.reset();
  if (row.state == "pending") {
    const auto seq = row.audit_seq;
    pending_.insert_or_assign(seq, std::move(row));
  } else {
    pending_.erase(row.audit_seq);
  }
}

TerminationRow TerminationLedger::row_of(const BatchVm& vm) const {
  if (auto it = pending_.find(vm.audit_seq); it != pending_.end()) return it->second;
  return TerminationRow{vm.audit_seq, vm.domain.uuid, "{}", "pending", std::nullopt};
}

std::set<std::string> TerminationLedger::underway_domains() const {
  std::set<std::string> out;
  for (const auto& [seq, row] : pending_) out.insert(row.domain_uuid);
  return out;
}

bool TerminationLedger::running_key(const std::string& caller, const std::string& key) const {
  for (const auto& [id, b] : batches_) {
    if (b.idempotency && b.idempotency->caller == caller && b.idempotency->key == key) return true;
  }
  return false;
}

std::uint64_t TerminationLedger::start(Batch b) {
  for (const auto& vm : b.vms) held_.insert(vm.audit_seq);
  const std::uint64_t id = next_++;
  batches_.emplace(id, std::move(b));
  return id;
}

std::optional<Work> TerminationLedger::work(std::uint64_t id) const {
  auto it = batches_.find(id);
  if (it == batches_.end()) return std::nullopt;
  Work w{id, {}};
  for (const auto& vm : it->second.vms)
    w.jobs.push_back(vmctl::TerminationJob{vm.domain, vm.record, vm.grace});
  return w;
}

std::optional<Batch> TerminationLedger::take(std::uint64_t id) {
  auto it = batches_.find(id);
  if (it == batches_.end()) return std::nullopt;
  Batch b = std::move(it->second);
  batches_.erase(it);
  for (const auto& vm : b.vms) held_.erase(vm.audit_seq);
  return b;
}

}  // namespace gpunode::service::detail
