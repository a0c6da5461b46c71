// Signed audit checkpoints (CONTRACT §12): NodeService's members that make them, and the route
// GET /v1/nodes/{nodeId}/audit/checkpoints. A checkpoint is not an audit record and not a change
// of the node's state (units, reservations, workloads): it is stored with its audit.checkpoint
// event in one transaction, and the revision does not move.
#include <fmt/format.h>

#include <charconv>

#include "gpunode/proof/checkpoint.hpp"
#include "impl.hpp"

namespace gpunode::service {

void NodeService::set_audit_key(std::shared_ptr<const proof::NodeKey> key) {
  impl_->audit_key = std::move(key);
}

error::Result<std::optional<boost::json::object>> NodeService::checkpoint_audit() {
  if (!impl_->audit_key || impl_->store.audit_head().first == 0) return std::nullopt;  // no key, no record
  auto made = impl_->checkpoint_head();
  if (!made) return std::unexpected(std::move(made.error()));
  if (!made->second) return std::nullopt;  // the chain has not grown since the last one
  return std::move(made->first);
}

std::int64_t NodeService::event_seq() const {
  return impl_->store.event_seq();
}

// The checkpoint of the head (there is a record and a key): the last one stored when it is at the
// head, else a new one, signed and stored with its event; and whether it is new.
error::Result<std::pair<json::object, bool>> NodeService::Impl::checkpoint_head() {
  const auto [seq, hash] = store.audit_head();
  auto last = store.last_checkpoint();
  if (!last) return std::unexpected(error::with_kind(std::move(last.error())));
  if (*last && (*last)->first >= seq) {
    boost::system::error_code ec;
    auto kept = json::parse((*last)->second, ec);
    if (ec || !kept.is_object())
      return error::fail(error::Errc::corrupt, fmt::format("audit checkpoint {} is not a JSON object", seq));
    return std::pair{std::move(kept.get_object()), false};
  }
  const auto wall = clock();
  const auto at = r::format_time(detail::to_time(wall));
  auto cp = proof::make_checkpoint(*audit_key, opt.node_id, seq, hash, at);
  if (!cp) return std::unexpected(std::move(cp.error()));
  if (auto stored = store.commit_checkpoint(*cp, at, wall); !stored)
    return std::unexpected(error::with_kind(std::move(stored.error())));
  return std::pair{std::move(*cp), true};
}

// POST /v1/admin/audit/checkpoint (admin socket only): the checkpoint of the chain's head, made now
// when the head moved since the last one, else the last one. gpunodectl's export and live verify ask
// first, so that what they read ends signed. Not audited: an audit record would move the head.
ApiResponse NodeService::Impl::checkpoint_route() {
  if (!audit_key) return problem(503, "audit-signing-unavailable", "this agent has no audit signing key");
  if (store.audit_head().first == 0)
    return problem(409, "audit-empty", "the audit chain has no records yet: there is nothing to sign");
  auto made = checkpoint_head();
  if (!made) {
    say(LogLevel::error, "audit checkpoint (asked for): " + made.error().to_string());
    return problem(503, "audit-signing-unavailable",
                   fmt::format("the head could not be signed: {}", made.error().kind()));
  }
  if (made->second)
    say(LogLevel::info, fmt::format("audit checkpoint (asked for): aud_{} signed", store.audit_head().first));
  return json_response(std::move(made->first));
}

// {"checkpoints": [...], "nextPageToken", "auditKey"}: oldest first, after=SEQ and pageToken (the
// last seq of the page before) as cursors, limit as on every list. auditKey is the public key (PEM)
// the heartbeat carries, so that gpunodectl's live verify has it from the agent.
ApiResponse NodeService::Impl::audit_checkpoints(const ApiRequest& q, const Caller& c) {
  if (!allowed(r::Action::read_audit, c))
    return detail::forbidden("the audit log is for operators and the owner");
  auto page = detail::paging(q);
  if (!page) return page.error();
  const auto& [limit, token] = *page;
  std::int64_t after = 0;
  for (const auto& [name, cursor] :
       {std::pair{"after", q.query_param("after").value_or("")}, std::pair{"pageToken", token}}) {
    if (cursor.empty()) continue;
    std::int64_t v = -1;
    const auto [p, ec] = std::from_chars(cursor.data(), cursor.data() + cursor.size(), v);
    if (ec != std::errc{} || p != cursor.data() + cursor.size() || v < 0)
      return problem(400, "invalid-request",
                     fmt::format("{} must be a checkpoint seq, an integer from 0", name),
                     {{name, "must be a checkpoint seq, an integer from 0"}});
    after = std::max(after, v);
  }
  auto rows = store.checkpoints_after(after, limit + 1);
  if (!rows) {
    say(LogLevel::error, "audit checkpoints read: " + rows.error().to_string());
    return detail::storage_problem(rows.error(), "the audit checkpoints cannot be read",
                                   "try again once the agent's log says it can");
  }
  auto got = detail::stored_page(std::move(*rows), limit,
                                 [](std::int64_t seq) { return fmt::format("audit checkpoint {}", seq); });
  if (!got) return got.error();
  return json_response(
      json::object{{"checkpoints", std::move(got->documents)},
                   {"nextPageToken",
                    got->next_after ? json::value(std::to_string(*got->next_after)) : json::value(nullptr)},
                   {"auditKey", audit_key ? json::value(audit_key->public_pem()) : json::value(nullptr)}});
}

}  // namespace gpunode::service
