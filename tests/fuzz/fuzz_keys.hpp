// tests/fuzz/fuzz_keys.hpp: the fuzzers' signing keys, fixed so that a reproducer replays the
// same way in every run (a key made at start would change every signature and kid). Made for
// these fuzzers with `openssl genpkey`; they sign nothing but fuzz inputs.
#pragma once

#include <string_view>

namespace gpunode::fuzz {

inline constexpr std::string_view kEd25519Pem =
    "-----BEGIN PRIVATE KEY-----\n"
    "MC4CAQAwBQYDK2VwBCIEIPV0DGKNZsJsbAUDR6DHijbYxiDLTnQ2Z3ki/YcEp+Iq\n"
    "-----END PRIVATE KEY-----\n";

inline constexpr std::string_view kP256Pem =
    "-----BEGIN PRIVATE KEY-----\n"
    "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgDUdiBaib+t5ENm5u\n"
    "O+jdgGPGMbuS8iBndpfAS8bvmgahRANCAAQcUaWgMfzxmUgCGmVxeAEXtDffeqsB\n"
    "DVe33OjN6qR7paLfaI+FQgxzShVOb39XDap6WXaBUx8np34tClxw+gec\n"
    "-----END PRIVATE KEY-----\n";

// The verifiers' settings (the http_request fuzzer's service uses the same).
inline constexpr std::string_view kIssuer = "https://central.fuzz";
inline constexpr std::string_view kAudience = "gpunode";
inline constexpr std::string_view kNodeId = "node-fuzz";
// "Now" for every verification: 2027-01-15T08:00:00Z.
inline constexpr long long kNowSeconds = 1'800'000'000;

}  // namespace gpunode::fuzz
