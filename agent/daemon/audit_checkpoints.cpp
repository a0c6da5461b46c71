// The signed audit checkpoints' timer (see audit_checkpoints.hpp).
#include "gpunode/daemon/audit_checkpoints.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <utility>

#include "gpunode/daemon/cadence.hpp"

namespace gpunode::daemon {

error::Result<std::shared_ptr<const proof::NodeKey>> load_audit_key(const config::Config& c,
                                                                    std::string& said) {
  const auto path = config::signing_key_path(c);
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  auto key = proof::NodeKey::load_or_create(path);
  if (!key) return std::unexpected(error::with_context(std::move(key.error()), "audit.signing_key"));
  said = fmt::format("audit signing key {}: keyId {}{}", path, key->key_id(),
                     existed ? "" : " (created: keep a copy with the state directory's)");
  return std::make_shared<const proof::NodeKey>(std::move(*key));
}

void AuditCheckpoints::start() {
  checkpoint("at start");
  arm();
}

void AuditCheckpoints::stop() {
  if (std::exchange(stopped_, true)) return;
  timer_.cancel();
  checkpoint("at stop");
}

void AuditCheckpoints::arm() {
  if (stopped_) return;
  // The first look first_within after start, as said; the later ones at the multiples of their
  // interval (cadence.hpp), so that an idle agent's look every first_within shares the rescan's and
  // the health poll's wake-up.
  const auto every = signed_since_start_ ? interval_ : first_within_;
  if (std::exchange(armed_, true))
    timer_.expires_at(next_on_cadence(std::chrono::steady_clock::now(), every));
  else
    timer_.expires_after(every);
  timer_.async_wait([this](const boost::system::error_code& e) {
    if (e || stopped_) return;
    if (checkpoint(signed_since_start_ ? "periodic" : "first since start")) signed_since_start_ = true;
    arm();
  });
}

bool AuditCheckpoints::checkpoint(const char* when) {
  auto made = node_.checkpoint_audit();
  if (!made) {
    say_(config::LogLevel::error,
         fmt::format("audit checkpoint ({}) not stored: {}", when, made.error().detail));
    return false;
  }
  if (!*made) return false;  // the chain has not grown
  const auto* seq = (*made)->if_contains("seq");
  say_(config::LogLevel::info, fmt::format("audit checkpoint ({}): aud_{} signed", when,
                                           seq != nullptr && seq->is_int64() ? seq->get_int64() : 0));
  if (stored_) stored_();
  return true;
}

}  // namespace gpunode::daemon
