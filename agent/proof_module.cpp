// gpunode-agent-proof.so: `gpunodectl audit verify`'s check (module_abi.hpp, kVerifyEntry), so that
// gpunodectl maps OpenSSL only when it verifies. Plain C across: byte buffers in, a malloc'ed
// message out.
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "gpunode/proof/checkpoint.hpp"
#include "module_abi.hpp"

extern "C" GPUNODE_EXPORT int gpunode_agent_audit_verify(const char* lines, std::size_t lines_size,
                                                         const char* key_pem, std::size_t key_pem_size,
                                                         const char* key_label, char** message) {
  static_assert(std::is_same_v<decltype(gpunode_agent_audit_verify), gpunode_agent_verify_fn>);
  *message = nullptr;
  std::string said = "the check failed with an internal error";
  const int verdict = gpunode::agent::report_internal_errors(
      [&] {
        auto v = gpunode::proof::verify_export(std::string_view(lines, lines_size),
                                               std::string_view(key_pem, key_pem_size), key_label);
        said = v ? gpunode::proof::describe(*v) : v.error().detail;
        return v ? 0 : 1;
      },
      1);
  *message = ::strdup(said.c_str());  // nullptr without memory: the caller has its own words
  return verdict;
}
