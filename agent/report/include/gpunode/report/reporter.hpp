// gpunode/report/reporter.hpp: delivers the outbox to the central API and sends heartbeats
// (CONTRACT §6, §7 TLS, Inventory and heartbeat).
//
// Threads. The Reporter runs on one thread of its own with its own io_context and its own SQLite
// connection to state.db: it never runs on, or waits for, the daemon's core (state) thread or its
// network thread. Two coroutines share that thread:
// - delivery: reads a batch of the outbox after the last acknowledged seq (policy.hpp: 500 events
//   or 1 MiB), POSTs it to {url}/v1/nodes/{nodeId}/events on one keep-alive connection, deletes
//   the acknowledged rows, and goes on while there are rows; when there are none it waits for
//   notify() (or 5 s, a cheap safety net: one indexed look-up). Failures wait per policy.hpp.
// - heartbeat: at start and every heartbeat_interval, POSTs {url}/v1/nodes/{nodeId}/heartbeat on
//   a second connection with a short timeout, so a stalled heartbeat never delays a batch and a
//   batch being retried never delays a heartbeat. Never retried.
// Shared state, and how: status() reads a snapshot under a mutex the reporter thread writes; the
// TLS context is swapped under a mutex (set_tls_context); notify() and stop() post to the
// reporter's io_context; `facts` is called on the reporter thread and must be thread-safe.
#pragma once

#include <array>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "gpunode/config/config.hpp"
#include "gpunode/error/error.hpp"
#include "gpunode/report/policy.hpp"

namespace gpunode::report {

// What the heartbeat says of the node, read at each send (never cached: a heartbeat never carries
// a revision older than one the daemon had published when it was sent).
struct NodeFacts {
  std::int64_t revision = 0;
  bool libvirt_connected = false;
};

// The numbers for metrics and heartbeats (a copy; any thread).
struct Status {
  std::int64_t acked_seq = 0;     // every event up to it is acknowledged (gpunode_central_acked_seq)
  std::int64_t outbox_depth = 0;  // undelivered events (gpunode_outbox_events)
  std::optional<std::string> oldest_undelivered_at;            // RFC 3339, as stored in the event
  std::optional<std::chrono::sys_seconds> oldest_undelivered;  // the same, parsed (for the age gauge)
  std::array<std::uint64_t, kFailureKinds> failures{};  // by Failure: gpunode_central_delivery_failures_total
  std::uint64_t protocol_errors = 0;                    // 2xx answers that were not a usable ack
  std::uint64_t events_delivered = 0;                   // acknowledged since start
  std::uint64_t heartbeats_sent = 0;                    // answered 2xx
  std::uint64_t heartbeat_failures = 0;
  [[nodiscard]] std::uint64_t failures_of(Failure f) const { return failures[static_cast<std::size_t>(f)]; }
};

using LogSink = std::function<void(config::LogLevel, const std::string&)>;

struct Options {
  std::string url;  // central.url (https)
  std::string node_id;
  std::string version;  // the heartbeat's "version" and the User-Agent
  std::filesystem::path state_db;
  std::shared_ptr<boost::asio::ssl::context> tls;  // http::make_client_tls_context
  std::chrono::milliseconds heartbeat_interval{30'000};
  std::chrono::milliseconds connect_timeout{10'000};
  std::chrono::milliseconds request_timeout{30'000};    // a batch: connect to the last byte of the answer
  std::chrono::milliseconds heartbeat_timeout{10'000};  // at most the interval
  std::function<NodeFacts()> facts;
  LogSink log;
  std::string audit_key;  // the heartbeat's auditKey: the node key's public PEM (CONTRACT §12)
};

class Reporter {
 public:
  // Parses the URL, opens the outbox, reads where delivery stands and starts the thread (which
  // sends the first heartbeat at once). An error names what and why; nothing runs then.
  static error::Result<std::unique_ptr<Reporter>> start(Options options);
  ~Reporter();  // stop()
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  // Any thread, cheap (an atomic and at most one post): events were committed; deliver them now.
  void notify();
  // Any thread: connections made from now on use this context; an open one is replaced before
  // its next request.
  void set_tls_context(std::shared_ptr<boost::asio::ssl::context> tls);
  // Any thread.
  [[nodiscard]] Status status() const;
  // Any thread but the reporter's own: closes both connections, ends both loops and joins the
  // thread. Prompt whatever the central API does (no request is waited for); idempotent.
  void stop();

  struct Impl;

 private:
  explicit Reporter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpunode::report
