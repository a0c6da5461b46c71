// Fuzz target: the JWT verifier (gpunode::auth::TokenVerifier::verify).
//
// The first byte picks how the rest becomes an Authorization header value:
//   0: the rest is the header value, as a client sends it (tokens it cannot sign);
//   1: the rest is "HEADER\nPAYLOAD" (two JSON texts; without a newline the header is
//      {"alg":"EdDSA","typ":"JWT"} and the rest the payload), signed with the fixed Ed25519 key;
//   2: the same signed with the fixed P-256 key (ES256, raw R||S).
// Signed inputs reach what lies behind the signature check: the header's alg, kid and crit, and
// the claims. Properties: verify() never throws; an unsigned input is never accepted; an accepted
// token has a non-empty sub, and its roles and org are what the payload says (valid UTF-8).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"
#include "fuzz_keys.hpp"
#include "gpunode/auth/token_verifier.hpp"
#include "gpunode/store/canonical_json.hpp"
#include "jwt_signer.hpp"

namespace {

using gpunode::fuzz::check;
namespace testing = gpunode::auth::testing;

struct Setup {
  testing::TestKey ed =
      testing::TestKey::from_private_pem(testing::KeyKind::ed25519, gpunode::fuzz::kEd25519Pem);
  testing::TestKey p256 = testing::TestKey::from_private_pem(testing::KeyKind::p256, gpunode::fuzz::kP256Pem);
  std::unique_ptr<gpunode::auth::TokenVerifier> verifier;

  Setup() {
    gpunode::auth::VerifierConfig config{std::string(gpunode::fuzz::kIssuer),
                                         std::string(gpunode::fuzz::kAudience),
                                         std::string(gpunode::fuzz::kNodeId), std::chrono::seconds(60)};
    auto v = gpunode::auth::TokenVerifier::from_pems({ed.public_pem(), p256.public_pem()}, config);
    if (!v) gpunode::fuzz::fail("the fuzzer's keys do not load", v.error().detail);
    verifier = std::make_unique<gpunode::auth::TokenVerifier>(std::move(*v));
  }
};

const Setup& setup() {
  static const Setup s;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const Setup& s = setup();
  const unsigned mode = data[0] % 3;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);

  std::string authorization;
  if (mode == 0) {
    authorization = rest;
  } else {
    std::string_view header = mode == 1 ? R"({"alg":"EdDSA","typ":"JWT"})" : R"({"alg":"ES256","typ":"JWT"})";
    std::string_view payload = rest;
    if (const auto nl = rest.find('\n'); nl != std::string_view::npos) {
      header = rest.substr(0, nl);
      payload = rest.substr(nl + 1);
    }
    authorization = "Bearer " + testing::mint(mode == 1 ? s.ed : s.p256, header, payload);
  }

  const auto now = std::chrono::system_clock::time_point{std::chrono::seconds(gpunode::fuzz::kNowSeconds)};
  auto claims = s.verifier->verify(authorization, now);
  static const bool verbose = std::getenv("GPUNODE_FUZZ_VERBOSE") != nullptr;
  if (verbose)
    std::fprintf(stderr, "%s\n",
                 claims ? "accepted" : std::string(gpunode::auth::to_string(claims.error().why)).c_str());
  if (!claims) {
    check(!gpunode::auth::to_string(claims.error().why).empty(), "a rejection without a name");
    return 0;
  }
  check(mode != 0, "a token the fuzzer did not sign was accepted", authorization);
  check(!claims->sub.empty(), "an accepted token without sub");
  check(gpunode::store::is_valid_utf8(claims->sub), "sub is not valid UTF-8");
  if (claims->org) check(gpunode::store::is_valid_utf8(*claims->org), "org is not valid UTF-8");
  for (const auto& role : claims->roles)
    check(gpunode::store::is_valid_utf8(role), "a role is not valid UTF-8");
  return 0;
}
