// The node's state on disk (state.db): the one place that writes it. Private to gpunode_service.
//
// A `Change` is one transaction's worth of change: reservations, units, audit records, events,
// an idempotent answer and termination rows. `StateStore::commit` writes it whole or not at all
// and returns what it assigned (the audit records' seqs): nothing outside the store predicts an
// id. The counters it keeps (revision, audit seq, event seq, the audit chain's last hash, the
// inventory digest) move only after the transaction committed. Only NodeState (state.hpp) commits.
#pragma once

#include <boost/json.hpp>
#include <chrono>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "caller.hpp"
#include "gpunode/health/judge.hpp"
#include "gpunode/reservations/model.hpp"
#include "gpunode/service/api.hpp"
#include "gpunode/service/reservation_json.hpp"
#include "gpunode/store/database.hpp"

namespace gpunode::service::detail {

// PREFIX + 26 Crockford base32 characters: 48 bits of milliseconds, then 80 random bits, so ids
// sort by creation time (rsv_..., evt_...).
std::string new_id(std::string_view prefix, std::chrono::system_clock::time_point now);
// Whether `id` is one new_id(prefix, ...) could have made: the prefix and 26 of its characters.
bool is_new_id(std::string_view prefix, std::string_view id);

// How long an Idempotency-Key's answer is kept and replayed (CONTRACT §4 Conventions).
inline constexpr std::chrono::seconds kIdempotencyWindow = std::chrono::hours(24);

struct AuditDraft {
  std::string action;
  std::optional<std::string> reservation_id;
  std::vector<std::string> unit_ids;
  std::vector<std::string> vm_ids;
  std::string result = "ok";
  std::optional<std::string> detail;
};

struct EventDraft {
  std::string type;
  boost::json::object data;
  // An event about one of its Change's new audit records (workload.terminating): the index of that
  // record in `audits`; the commit sets data["auditId"] from the seq it assigns.
  std::optional<std::size_t> audit_index{};
};

struct IdempotencyDraft {
  std::string caller, key, fingerprint;
  ApiResponse response;
};

// A termination as stored (crash safety): written pending, with its audit record, before the
// domain is touched; done or failed once the hypervisor answered.
struct TerminationRow {
  std::int64_t audit_seq = 0;  // the row's key: its write-ahead audit record
  std::string domain_uuid;
  std::string doc;    // {vmId, name, unitIds, by, at, grace}
  std::string state;  // pending | done | failed
  // A new row: the index, in its Change's `audits`, of the record whose seq the commit assigns
  // as `audit_seq`. Unset: `audit_seq` names a row already stored.
  std::optional<std::size_t> audit_index;
};

// Unit health's rows (CONTRACT §13; health_store.cpp): what is kept of each function, by PCI
// address, and each unit's reasons, by unit id. Not a change of the node's state by itself: a
// baseline taken or a width seen moves no revision; the unit's JSON written with it does.
struct HealthRows {
  std::vector<std::pair<std::string, health::DeviceState>> devices{};
  std::vector<std::string> devices_gone{};  // rows no unit is judged on any more
  std::vector<std::pair<std::string, health::Verdict>> units{};
  std::vector<std::string> restart{};  // functions whose in-memory memo begins again (a clear)
  bool empty() const { return devices.empty() && devices_gone.empty() && units.empty() && restart.empty(); }
};

// One transaction's worth of change.
// Built by name (`Change{.actor = c, .at = t, .upserts = {x}}`); what is not named is empty.
struct Change {
  Caller actor{};
  std::optional<std::string> request_id{};
  reservations::Time at{};
  std::vector<reservations::Reservation> upserts{};
  std::vector<AuditDraft> audits{};
  std::vector<EventDraft> events{};
  std::vector<std::pair<std::string, std::pair<std::string, bool>>> units{};  // id -> (doc, absent)
  std::optional<std::string> inventory_digest{};
  std::optional<IdempotencyDraft> idempotency{};
  std::vector<TerminationRow> terminations{};
  HealthRows health{};

  // Whether committing it moves the node's revision (an idempotency row alone does not).
  bool moves_state() const {
    return !upserts.empty() || !units.empty() || !audits.empty() || !events.empty() ||
           inventory_digest.has_value() || !terminations.empty();
  }
};

// What a commit assigned.
struct Committed {
  std::int64_t revision = 0;
  std::vector<std::int64_t> audit_seqs;  // one per Change::audits, in order
};

// What the store holds beyond its counters, read once at open: what is live, not the history.
struct Loaded {
  std::map<std::string, reservations::Reservation, std::less<>> reservations;  // the ones not ended
  std::int64_t ended = 0;                                                      // how many ended ones are kept
  std::map<std::int64_t, TerminationRow> pending;           // terminations cut short, by audit seq
  std::map<std::string, boost::json::object> absent_units;  // last seen JSON, `absent` applied
  std::map<std::string, health::DeviceState, std::less<>> health_devices;  // by PCI address
  std::map<std::string, health::Verdict, std::less<>> health_units;        // by unit id
};

// Which stored reservations a page reads, in id order after `after`: all or the ended ones, and
// (with `org`) only those `org` is or was audience or manager of. The rules decide on each.
struct StoredRows {
  bool ended_only = false;
  std::optional<std::string> org;
  std::string after;
  std::size_t limit = 0;
};

// An answer kept for an Idempotency-Key.
struct StoredAnswer {
  std::string fingerprint;
  ApiResponse response;
  std::int64_t created_at = 0;  // seconds since the epoch
};

class StateStore {
 public:
  // Opens (creating) `file`, runs the migrations, reads the counters and what `loaded()` returns.
  // `node_id` goes into every audit record.
  static std::expected<StateStore, store::DbError> open(const std::filesystem::path& file,
                                                        std::string node_id);

  StateStore(StateStore&&) noexcept = default;
  StateStore& operator=(StateStore&&) noexcept = default;

  // What was read at open; moved out once by the service.
  Loaded take_loaded() { return std::move(loaded_); }

  // Zero-fills the WAL ahead of the commits (store::Database::preallocate_wal): an error is worth a
  // warning only, the commits grow the WAL as they would have.
  std::expected<void, store::DbError> preallocate_wal() { return db_.preallocate_wal(); }

  std::int64_t revision() const { return revision_; }
  // The seq of the last event stored in the outbox (0 before the first): it moves with every commit
  // that stores an event, also one that does not move the revision (an audit checkpoint).
  std::int64_t event_seq() const { return event_seq_; }
  const std::string& inventory_digest() const { return inventory_digest_; }
  // How many ended reservations are kept (on disk only).
  std::int64_t ended_reservations() const { return ended_; }
  const std::filesystem::path& path() const { return db_.path(); }

  // Units stored as present (absent = 0), and one unit's stored document.
  std::vector<std::string> present_unit_ids();
  std::optional<boost::json::object> unit_doc(const std::string& id);

  // The answer kept for (caller, key), expired or not; nothing when none (or unreadable).
  std::optional<StoredAnswer> idempotent_answer(const std::string& caller, const std::string& key);
  // Deletes the answers created before `cutoff` (seconds since the epoch).
  std::expected<void, store::DbError> purge_idempotency(std::int64_t cutoff);

  // One stored reservation, ended or not (ended ones are not in memory: CONTRACT §11).
  std::expected<std::optional<reservations::Reservation>, store::DbError> reservation(std::string_view id);
  // One stored reservation's document as stored, unparsed (parse_reservation reads it).
  std::expected<std::optional<std::string>, store::DbError> reservation_row(std::string_view id);
  std::expected<reservations::Reservation, store::DbError> parse_reservation(const std::string& id,
                                                                             const std::string& doc) const;
  // Whether `org` is or was audience or manager of reservation `id`, from reservation_orgs (a
  // superset: an amend that drops an org leaves its row): one lookup in that index, the same
  // whether `id` is live, ended or no reservation at all.
  std::expected<bool, store::DbError> org_linked(std::string_view org, std::string_view id);
  // Up to `q.limit` stored reservations (see StoredRows).
  std::expected<std::vector<reservations::Reservation>, store::DbError> reservations_after(
      const StoredRows& q);

  // Up to `limit` audit records after `after_seq`, as (seq, stored JSON text).
  std::expected<std::vector<std::pair<std::int64_t, std::string>>, store::DbError> audit_after(
      std::int64_t after_seq, std::size_t limit);

  // Signed audit checkpoints (CONTRACT §12; checkpoint_store.cpp). The chain's head as committed:
  // (0, 64 zeros) before the first record.
  std::pair<std::int64_t, std::string> audit_head() const { return {audit_seq_, audit_last_hash_}; }
  // The head seq of the last checkpoint stored; 0 when there is none.
  std::expected<std::int64_t, store::DbError> last_checkpoint_seq();
  // The last checkpoint stored, as (seq, stored JSON text); nothing when there is none.
  std::expected<std::optional<std::pair<std::int64_t, std::string>>, store::DbError> last_checkpoint();
  // Stores `checkpoint` (its "seq" is its key) and its audit.checkpoint event, stamped `at`, in one
  // transaction. Not a change of the node's state: the revision does not move.
  std::expected<void, store::DbError> commit_checkpoint(const boost::json::object& checkpoint,
                                                        std::string_view at,
                                                        std::chrono::system_clock::time_point wall);
  // Up to `limit` checkpoints after head seq `after_seq`, as (seq, stored JSON text).
  std::expected<std::vector<std::pair<std::int64_t, std::string>>, store::DbError> checkpoints_after(
      std::int64_t after_seq, std::size_t limit);

 private:
  // The writes that change what the node shows: NodeState (state.hpp) alone calls them, and moves
  // its generation and memory with them, so no other caller can store a change and forget a step.
  friend class NodeState;
  // Writes `c` in one transaction. `wall` stamps the events' ids. The error says what failed,
  // SQLite's code kept (a full disk, a busy or a corrupt database are told apart).
  std::expected<Committed, store::DbError> commit(const Change& c,
                                                  std::chrono::system_clock::time_point wall);
  // Moves the revision alone (the workloads' list changed: not a stored change of its own).
  std::expected<void, store::DbError> bump_revision();

  StateStore(store::Database db, std::string node_id) : db_(std::move(db)), node_id_(std::move(node_id)) {}
  std::expected<void, store::DbError> load();
  // Prepared once, reused by every commit (a prepare costs more than the insert it serves).
  std::expected<store::Statement*, store::DbError> cached(std::string_view sql);
  template <class... Args>
  std::expected<void, store::DbError> write(std::string_view sql, const Args&... args);
  // Runs the cached `sql` with `args` bound, calling `row` on each row; the statement is reset after.
  template <class Row, class... Args>
  std::expected<void, store::DbError> read(std::string_view sql, Row row, const Args&... args);

  // commit()'s steps, in order, inside its transaction: each writes one part of the change and
  // counts what it numbered in the Tally (the audit chain's head and sequence, the event sequence).
  struct Tally {
    std::int64_t seq = 0;    // the last audit record's
    std::int64_t ev = 0;     // the last event's
    std::int64_t ended = 0;  // the ended reservations, this change's included
    std::string last_hash;
    Committed out;
  };
  using Wall = std::chrono::system_clock::time_point;
  std::expected<void, store::DbError> write_reservations(const Change& c, Tally& t, Wall wall);
  std::expected<void, store::DbError> write_units(const Change& c, Tally& t, Wall wall);
  std::expected<void, store::DbError> write_audits(const Change& c, Tally& t, Wall wall);
  std::expected<void, store::DbError> write_events(const Change& c, Tally& t, Wall wall);
  std::expected<void, store::DbError> write_idempotency(const Change& c, Tally& t, Wall wall);
  std::expected<void, store::DbError> write_terminations(const Change& c, Tally& t, Wall wall);
  std::expected<void, store::DbError> write_health(const Change& c, Tally& t, Wall wall);  // health_store.cpp
  std::expected<void, store::DbError> load_health();                                       // health_store.cpp
  std::expected<void, store::DbError> write_meta(const Change& c, const Tally& t, bool moves);

  store::Database db_;
  std::string node_id_;
  std::map<std::string, store::Statement, std::less<>> statements_;
  std::int64_t revision_ = 0, audit_seq_ = 0, event_seq_ = 0, ended_ = 0;
  std::string audit_last_hash_;
  std::string inventory_digest_;
  Loaded loaded_;
};

}  // namespace gpunode::service::detail
