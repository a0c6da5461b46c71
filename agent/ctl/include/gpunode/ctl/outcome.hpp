// gpunode/ctl/outcome.hpp: how a gpunodectl command ends (CONTRACT §8 exit statuses).
#pragma once

#include <string>

namespace gpunode::ctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitProblem =
    1;  // the agent answered a problem (or an answer that is not the contract's)
inline constexpr int kExitUsage = 2;        // a usage error (with the usage)
inline constexpr int kExitUnreachable = 3;  // the socket is missing, unreachable or refuses the caller

struct Failure {
  int exit_code = kExitProblem;
  std::string message;  // for stderr, whole lines
  std::string body;     // with --json, printed on stdout (a problem's body as it came); empty: nothing
};

}  // namespace gpunode::ctl
