// gpunode-agent-proof.so: `gpunodectl audit verify`'s check (command_line.hpp, kVerifyEntry), so
// that gpunodectl maps OpenSSL only when it verifies.
#include "command_line.hpp"
#include "gpunode/proof/checkpoint.hpp"

extern "C" GPUNODE_EXPORT int gpunode_agent_audit_verify_v1(std::string_view lines, std::string_view key_pem,
                                                            const std::string& key_label,
                                                            std::string& message);

extern "C" GPUNODE_EXPORT int gpunode_agent_audit_verify_v1(std::string_view lines, std::string_view key_pem,
                                                            const std::string& key_label,
                                                            std::string& message) {
  return gpunode::agent::report_internal_errors(
      [&] {
        auto v = gpunode::proof::verify_export(lines, key_pem, key_label);
        if (!v) {
          message = v.error().detail;
          return 1;
        }
        message = gpunode::proof::describe(*v);
        return 0;
      },
      1);
}
