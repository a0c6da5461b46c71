// gpunode/ctl/app.hpp: gpunodectl as a function (CONTRACT §8). Arguments and an Env in, exit status,
// stdout and stderr out. Everything the process owns (the socket, the clock, the terminal, the
// config file, the uid) comes through Env, so the whole command line is tested with a fake agent.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <expected>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunode/ctl/client.hpp"
#include "gpunode/ctl/request.hpp"
#include "gpunode/error/error.hpp"

namespace gpunode::ctl {

struct Env {
  std::function<std::unique_ptr<Transport>(const std::string& socket_path)> connect;
  std::function<std::optional<std::string>(std::string_view path)> read_file;  // nullopt: unreadable
  Time now{};
  bool stdout_tty = false;
  const char* no_color = nullptr;  // the NO_COLOR variable (nullptr: unset)
  std::size_t width = 100;         // the terminal's columns
  uid_t uid = 0;
  std::string version;
  // `audit verify` (CONTRACT §12): checks an export's JSON lines against a PEM public key file's
  // text (`key_label` names it); the summary when whole, else the first break. The real one runs
  // gpunode-agent-proof.so (main.cpp), so gpunodectl itself maps no OpenSSL; unset: not available.
  // The error's detail is what is printed.
  std::function<error::Result<std::string>(std::string_view lines, std::string_view key_pem,
                                           const std::string& key_label)>
      verify_export;
};

struct Result {
  int exit_code = 0;
  std::string out, err;
};

// args: without the program name.
Result run(const std::vector<std::string>& args, const Env& env);

}  // namespace gpunode::ctl
