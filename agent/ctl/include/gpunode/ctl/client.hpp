// gpunode/ctl/client.hpp: HTTP/1.1 over the admin socket (CONTRACT §7, §8), as gpunodectl needs it.
//
// A Transport sends one Request and returns the answer, or says why there is none. The real one,
// UnixClient, connects to the socket for each request (a Unix socket connect costs microseconds,
// and a peer the agent refuses is refused per connection), and bounds the whole exchange by the
// request's timeout. Tests use a fake Transport.
#pragma once

#include <sys/types.h>

#include <expected>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpunode/ctl/request.hpp"
#include "gpunode/error/error.hpp"

namespace gpunode::ctl {

struct Response {
  unsigned status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  [[nodiscard]] std::string_view header(std::string_view lower_name) const;  // "" when absent
};

// Why there is no answer. Each is exit status 3 (CONTRACT §8).
struct TransportError {
  enum class Kind {
    missing,        // no socket at the path (ENOENT, ENOTDIR)
    denied,         // the file system refuses the caller (EACCES, EPERM on connect)
    not_listening,  // a socket file nobody listens on (ECONNREFUSED)
    refused_peer,   // connected, then closed without an answer: the agent's peer check refused us
    timeout,        // no whole answer within the request's timeout
    untrusted,      // the server at the socket failed the caller's check (UnixClient's vet)
    broken,         // anything else: a read or write error, an answer that is not HTTP
  } kind = Kind::broken;
  std::string path;    // the socket
  std::string detail;  // what the system or the parser said
};

// "PROGRAM: ..." lines for stderr: the path, what happened and what to check.
std::string describe(const TransportError& e, uid_t uid, std::string_view program = "gpunodectl");

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::expected<Response, TransportError> call(const Request& r) = 0;
};

// Checks the server on a connected socket before anything is written to it: success, or an error
// whose detail says why it is not to be trusted. Runs on the very connection the request then uses
// (no check-then-connect race).
using VetServer = std::function<error::Result<void>(int fd)>;

class UnixClient final : public Transport {
 public:
  UnixClient(std::string path, std::string user_agent, VetServer vet = {});
  std::expected<Response, TransportError> call(const Request& r) override;

 private:
  std::string path_;
  std::string user_agent_;
  VetServer vet_;
};

// CONTRACT §9 "Who answers": the server at the socket `path` (SO_PEERCRED of `fd`) runs as root or
// as the owner of the socket's directory, and that directory is owned by root or by that user and
// writable by no one else. Else permission (an errno's code when the socket or the directory cannot
// be inspected), the detail saying why not, naming the uids and the mode.
error::Result<void> vet_agent_socket(const std::string& path, int fd);

}  // namespace gpunode::ctl
