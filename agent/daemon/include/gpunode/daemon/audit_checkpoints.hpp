// gpunode/daemon/audit_checkpoints.hpp: the signed audit checkpoints' timer (CONTRACT §12), on the
// core thread like the daemon's other timers: every audit.checkpoint_interval, and once at stop,
// NodeService::checkpoint_audit() signs and stores the chain's head when it has grown. The signing
// and the commit run there, never on a network thread.
#pragma once

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
  AuditCheckpoints(boost::asio::io_context& core, service::NodeService& node,
                   std::chrono::milliseconds interval, std::function<void()> stored, Say say)
      : timer_(core), node_(node), interval_(interval), stored_(std::move(stored)), say_(std::move(say)) {}

  // Core thread. start() arms the timer; stop() cancels it and makes the stop's checkpoint.
  void start();
  void stop();

 private:
  void arm();
  void checkpoint(const char* when);
  boost::asio::steady_timer timer_;
  service::NodeService& node_;
  std::chrono::milliseconds interval_;
  std::function<void()> stored_;
  Say say_;
  bool stopped_ = false;
};

}  // namespace gpunode::daemon
