// What the daemon makes of its config before daemon.cpp wires the pieces together: the config
// checked with every file it names, the token keys, the TLS contexts, the open-file limit, the
// state directory's lock, the servers' limits and listeners, the reporter's options. start() uses
// them all; reload_now() the ones a reload can change. Plain functions over the config: no thread,
// no io_context of their own.
#pragma once

#include <sys/types.h>

#include <boost/asio/ssl/context.hpp>
#include <cstddef>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpunode/auth/token_verifier.hpp"
#include "gpunode/config/config.hpp"
#include "gpunode/daemon/admin_peers.hpp"
#include "gpunode/daemon/sd_notify.hpp"
#include "gpunode/error/error.hpp"
#include "gpunode/http/server.hpp"
#include "gpunode/report/reporter.hpp"
#include "gpunode/store/state_lock.hpp"

namespace gpunode::daemon {

// Connections of metrics.listen (loopback: Prometheus, and an operator's curl).
constexpr std::size_t kMetricsConnections = 64;

// The config at `file` for `run`, and every file it names usable by this process; else every problem.
std::expected<config::Config, std::vector<config::Problem>> load_checked(const std::string& file);

// The token keys of auth.keys (TokenVerifier's error: the file and why).
error::Result<std::shared_ptr<const auth::TokenVerifier>> load_verifier(const config::Config& c);

// The log line naming the token keys loaded: during a key rollover, which `kid`s this node takes.
std::string token_keys_line(const auth::TokenVerifier& v);

http::TlsFiles tls_files(const config::Config& c);

// The central API's client context, when reporting is on (central.url set); else null.
error::Result<std::shared_ptr<boost::asio::ssl::context>> central_tls(const config::Config& c);

// CONTRACT §10: the open-file limit's soft value raised to its hard one, and the connection caps
// checked to fit below it, so that no stranger's connections can use up the descriptors the agent
// needs for its own files or its operators. Says what was chosen, or why it cannot start (caps
// that do not fit the limit: invalid).
error::Result<std::string> fit_open_files(const config::Config& c);

// state.dir made if missing (0750) and locked against a second agent (one that holds it: busy).
error::Result<store::StateLock> lock_state_dir(const config::Config& c);

// SIGPIPE ignored for the whole process: a write to a peer that hung up is an EPIPE error, never
// the agent's death. Asio's sockets send with MSG_NOSIGNAL already, but libvirt's client writes to
// its own socket without it (a libvirtd that hangs up during connect killed a process that did not
// ignore it). systemd's IgnoreSIGPIPE=yes covers the unit; this covers every other way the agent
// is run (by hand, `make demo`, the tests). The agent executes no program, so no child inherits it.
void ignore_sigpipe();

// The HTTPS port's and metrics.listen's limits, and the admin socket's.
http::Limits api_limits(const config::Config& c);
http::Limits admin_limits(const config::Config& c);

// The listening sockets systemd passed (CONTRACT §11), by what they serve.
struct PassedListeners {
  std::optional<int> api, admin;
};
// Each passed socket matched to api.listen or admin.socket: by its FileDescriptorName= (`api`,
// `admin`), or, for any other name (one socket unit gives all its sockets one name), by its family
// (TCP: api, unix: admin). A socket bound elsewhere than its key says, a second one for a key, or
// one that is neither refuses the start, naming the socket and the key (invalid).
error::Result<PassedListeners> match_passed(const std::vector<PassedSocket>& passed, const config::Config& c);

// Serves api.listen (HTTPS with `tls`) and the admin socket on `admin` (its group `group`, its peers
// as `peers` allows) on the sockets systemd passed, binding those it did not pass; binds
// metrics.listen on `server`.
error::Result<void> listen_all(http::Server& server, http::Server& admin, const config::Config& c,
                               const PassedListeners& passed, std::shared_ptr<boost::asio::ssl::context> tls,
                               std::optional<gid_t> group, std::shared_ptr<AdminPeers> peers);

// The reporter's options from central.*, but for `facts` and `log` (the daemon's own).
report::Options reporter_options(const config::Config& c, const std::string& version,
                                 std::shared_ptr<boost::asio::ssl::context> tls);

}  // namespace gpunode::daemon
