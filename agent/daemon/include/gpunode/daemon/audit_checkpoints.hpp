// gpunode/daemon/audit_checkpoints.hpp: the signed audit checkpoints' timer (CONTRACT §12), on the
// core thread like the daemon's other timers: at start (a head an earlier run left unsigned, say
// by a crash), `first_within` after start and then at its multiples (cadence.hpp) until the first record
// written since start is signed (so the chain is never unsigned for an hour after a start: "within a
// minute"), then every audit.checkpoint_interval, and once at stop, NodeService::checkpoint_audit() signs and
// stores the chain's head when it has grown. A look that finds nothing new is an in-memory compare and one
// indexed read. The signing and the commit run there, never on a network thread.
#pragma once

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "gpunode/config/config.hpp"
#include "gpunode/error/error.hpp"
#include "gpunode/proof/node_key.hpp"
#include "gpunode/service/node_service.hpp"

namespace gpunode::daemon {

// The node key of config::signing_key_path(c), created (0600) when missing; a line for the log
// naming its keyId; or why the agent cannot start (NodeKey's error, "audit.signing_key: " before
// its detail).
error::Result<std::shared_ptr<const proof::NodeKey>> load_audit_key(const config::Config& c,
                                                                    std::string& said);

class AuditCheckpoints {
 public:
  using Say = std::function<void(config::LogLevel, const std::string&)>;
  // `stored` runs after each checkpoint stored (the daemon wakes the reporter: its event waits).
  static constexpr std::chrono::milliseconds kFirstWithin{std::chrono::seconds(30)};
  AuditCheckpoints(boost::asio::io_context& core, service::NodeService& node,
                   std::chrono::milliseconds interval, std::function<void()> stored, Say say,
                   std::chrono::milliseconds first_within = kFirstWithin)
      : timer_(core),
        node_(node),
        interval_(interval),
        first_within_(std::min(first_within, interval)),
        stored_(std::move(stored)),
        say_(std::move(say)) {}

  // Core thread. start() arms the timer; stop() cancels it and makes the stop's checkpoint.
  void start();
  void stop();

 private:
  void arm();
  bool checkpoint(const char* when);  // whether one was made
  boost::asio::steady_timer timer_;
  service::NodeService& node_;
  std::chrono::milliseconds interval_;
  std::chrono::milliseconds first_within_;
  bool signed_since_start_ = false;  // a record written since start has been signed
  bool armed_ = false;               // the first look (first_within after start) is armed
  std::function<void()> stored_;
  Say say_;
  bool stopped_ = false;
};

}  // namespace gpunode::daemon
