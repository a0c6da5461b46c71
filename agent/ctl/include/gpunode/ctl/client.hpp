// gpunode/ctl/client.hpp: HTTP/1.1 over the admin socket (CONTRACT §7, §8), as gpunodectl needs it.
//
// A Transport sends one Request and returns the answer, or says why there is none. The real one,
// UnixClient, connects to the socket for each request (a Unix socket connect costs microseconds,
// and a peer the agent refuses is refused per connection), and bounds the whole exchange by the
// request's timeout. Tests use a fake Transport.
#pragma once

#include <sys/types.h>

#include <expected>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpunode/ctl/request.hpp"

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
    missing,         // no socket at the path (ENOENT, ENOTDIR)
    denied,          // the file system refuses the caller (EACCES, EPERM on connect)
    not_listening,   // a socket file nobody listens on (ECONNREFUSED)
    refused_peer,    // connected, then closed without an answer: the agent's peer check refused us
    timeout,         // no whole answer within the request's timeout
    broken,          // anything else: a read or write error, an answer that is not HTTP
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

class UnixClient final : public Transport {
 public:
  UnixClient(std::string path, std::string user_agent);
  std::expected<Response, TransportError> call(const Request& r) override;

 private:
  std::string path_;
  std::string user_agent_;
};

}  // namespace gpunode::ctl
