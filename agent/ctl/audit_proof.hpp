// gpunodectl's `audit export` and `audit verify` (CONTRACT §12), private to gpunode::ctl: app.cpp
// parses their options and hands them a way to call the agent.
#pragma once

#include <expected>
#include <functional>
#include <optional>
#include <string>

#include "gpunode/ctl/app.hpp"
#include "gpunode/ctl/paging.hpp"

namespace CLI {
class App;
}

namespace gpunode::ctl {

struct ProofArgs {
  std::string after;   // export --after aud_N
  std::string output;  // export --output FILE ("": stdout)
  std::string file;    // verify --file EXPORT ("": the live agent's chain)
  std::string key;     // verify --key PUBLIC_KEY
};

// `audit`'s subcommands export and verify, their options into `a`.
void proof_arguments(CLI::App& audit, ProofArgs& a);

// One call to the agent, its answer parsed (Session::call).
using ProofCall = std::function<std::expected<Page, Failure>(const Request&)>;

// export: asks the agent to sign its head (POST /v1/admin/audit/checkpoint), then writes every
// record up to that head (GET audit, after --after), then every checkpoint up to it (GET
// audit/checkpoints, from the one at --after, which must exist: it anchors the records after it),
// one JSON object a line, each as the route gave it; to stdout or, atomically, to --output. An
// export always ends signed (CONTRACT §12).
Result audit_export(const ProofCall& call, const std::string& node, const ProofArgs& a);
// verify: --file and --key offline; else the live chain, read as export reads it (the head signed
// first), and the key the agent shows (auditKey).
Result audit_verify(const ProofCall& call, const std::string& node, const ProofArgs& a, const Env& env);

}  // namespace gpunode::ctl
