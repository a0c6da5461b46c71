// Unit tests of gpunode::auth::TokenVerifier: bearer tokens as CONTRACT §4 "Authentication"
// defines them. Every rejection class is its own case and asserts the exact Rejection; tokens are
// minted by the test-only signer in jwt_signer.hpp, plus the published RFC 7515 / RFC 8037
// vectors as known answers for the two signature algorithms.
#include "gpunode/auth/token_verifier.hpp"

#include <doctest/doctest.h>
#include <unistd.h>

#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "jwt_signer.hpp"

namespace {

namespace json = boost::json;
using gpunode::auth::AuthError;
using gpunode::auth::Claims;
using gpunode::auth::Rejection;
using gpunode::auth::TokenVerifier;
using gpunode::auth::VerifierConfig;
using gpunode::auth::testing::b64url;
using gpunode::auth::testing::KeyKind;
using gpunode::auth::testing::mint;
using gpunode::auth::testing::mint_hs256;
using gpunode::auth::testing::signing_input;
using gpunode::auth::testing::TestKey;

constexpr std::int64_t kNow = 1'800'000'000;  // 2027-01-15T08:00:00Z
const std::chrono::system_clock::time_point now_tp{std::chrono::seconds(kNow)};

constexpr std::string_view kIssuer = "https://central.example";

VerifierConfig config() {
  return VerifierConfig{std::string(kIssuer), "gpunode", "node-7", std::chrono::seconds(60)};
}

// Keys are slow-ish to make (RSA): one of each for the whole run.
const TestKey& ed() {
  static const TestKey k(KeyKind::ed25519);
  return k;
}
const TestKey& ed2() {
  static const TestKey k(KeyKind::ed25519);
  return k;
}
const TestKey& ec() {
  static const TestKey k(KeyKind::p256);
  return k;
}
const TestKey& ec2() {
  static const TestKey k(KeyKind::p256);
  return k;
}
const TestKey& p384() {
  static const TestKey k(KeyKind::p384);
  return k;
}
const TestKey& rsa() {
  static const TestKey k(KeyKind::rsa2048);
  return k;
}

TokenVerifier verifier(const std::vector<std::string>& pems, VerifierConfig cfg = config()) {
  auto v = TokenVerifier::from_pems(pems, std::move(cfg));
  REQUIRE_MESSAGE(v.has_value(), (v ? std::string() : v.error().detail));
  return std::move(*v);
}

// The verifier most cases use: one Ed25519 and one P-256 key.
const TokenVerifier& both() {
  static const TokenVerifier v = verifier({ed().public_pem(), ec().public_pem()});
  return v;
}

json::object good_claims() {
  return json::object{{"iss", kIssuer},
                      {"aud", "gpunode"},
                      {"sub", "user-1"},
                      {"org", "org-a"},
                      {"roles", json::array{"platform-admin"}},
                      {"exp", kNow + 3600},
                      {"nbf", kNow - 10},
                      {"iat", kNow - 10}};
}

std::string text(const json::object& o) {
  return json::serialize(o);
}

std::string ed_token(const json::object& claims = good_claims(),
                     std::string_view header = R"({"alg":"EdDSA","typ":"JWT"})") {
  return mint(ed(), header, text(claims));
}
std::string ec_token(const json::object& claims = good_claims(),
                     std::string_view header = R"({"alg":"ES256","typ":"JWT"})") {
  return mint(ec(), header, text(claims));
}

std::string bearer(std::string_view token) {
  return "Bearer " + std::string(token);
}

// Asserts a rejection of the expected class and a non-empty detail that does not hold the token.
void rejects(const TokenVerifier& v, std::string_view authorization, Rejection why,
             std::chrono::system_clock::time_point at = now_tp) {
  const auto r = v.verify(authorization, at);
  REQUIRE_FALSE(r.has_value());
  CHECK_MESSAGE(r.error().why == why, "got ", gpunode::auth::to_string(r.error().why), " (", r.error().detail,
                "), want ", gpunode::auth::to_string(why));
  CHECK_FALSE(r.error().detail.empty());
  const std::string_view token = authorization.size() > 7 ? authorization.substr(7) : std::string_view();
  if (token.size() >= 8) CHECK(r.error().detail.find(token) == std::string::npos);
}

Claims accepts(const TokenVerifier& v, std::string_view authorization,
               std::chrono::system_clock::time_point at = now_tp) {
  const auto r = v.verify(authorization, at);
  REQUIRE_MESSAGE(r.has_value(), "rejected: ", (r ? "" : gpunode::auth::to_string(r.error().why)), " ",
                  (r ? std::string() : r.error().detail));
  return *r;
}

json::object with(json::object o, std::string_view key, json::value v) {
  o[key] = std::move(v);
  return o;
}
json::object without(json::object o, std::string_view key) {
  o.erase(key);
  return o;
}

// Replaces one base64url part of a token.
std::string with_part(const std::string& token, int part, std::string_view replacement) {
  const std::size_t d1 = token.find('.');
  const std::size_t d2 = token.find('.', d1 + 1);
  if (part == 0) return std::string(replacement) + token.substr(d1);
  if (part == 1) return token.substr(0, d1 + 1) + std::string(replacement) + token.substr(d2);
  return token.substr(0, d2 + 1) + std::string(replacement);
}

std::string part(const std::string& token, int n) {
  const std::size_t d1 = token.find('.');
  const std::size_t d2 = token.find('.', d1 + 1);
  if (n == 0) return token.substr(0, d1);
  if (n == 1) return token.substr(d1 + 1, d2 - d1 - 1);
  return token.substr(d2 + 1);
}

// A scratch directory removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    path = std::filesystem::temp_directory_path() /
           ("gpunode-auth-test-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string write(const std::string& name, std::string_view content) const {
    const auto p = path / name;
    std::ofstream(p, std::ios::binary) << content;
    return p.string();
  }
};

// RFC 8037 A.1/A.4: an Ed25519 key and a JWS over "Example of Ed25519 signing".
constexpr std::string_view kRfc8037Pem =
    "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=\n-----END "
    "PUBLIC KEY-----\n";
constexpr std::string_view kRfc8037Thumbprint =
    "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k";  // RFC 8037 A.3
constexpr std::string_view kRfc8037Jws =
    "eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc."
    "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg";

// RFC 7515 A.3: a P-256 key and an ES256 JWS of {"iss":"joe","exp":1300819380,...} (no aud).
constexpr std::string_view kRfc7515Pem =
    "-----BEGIN PUBLIC KEY-----\n"
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEf83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvR\n"
    "VEXH8UTNG72bfocs3+257rn0s2ldbqkLJK2KRiMohYjlrQ==\n"
    "-----END PUBLIC KEY-----\n";
constexpr std::string_view kRfc7515Jws =
    "eyJhbGciOiJFUzI1NiJ9."
    "eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ."
    "DtEhU3ljbEg8L38VWAfUAqOyKAM6-Xx-F4GawxaepmXFCgfTjDxw5djxLa8ISlSApmWQxfKTUJqPP3-Kg6NU1Q";

}  // namespace

// ------------------------------------------------------------------------------------------------
TEST_SUITE("accept") {
  TEST_CASE("an EdDSA token yields its claims") {
    const Claims c = accepts(both(), bearer(ed_token()));
    CHECK(c.sub == "user-1");
    REQUIRE(c.org.has_value());
    CHECK(*c.org == "org-a");
    CHECK(c.roles == std::vector<std::string>{"platform-admin"});
    CHECK(c.has_role("platform-admin"));
    CHECK_FALSE(c.has_role("platform-operator"));
    CHECK(c.exp == kNow + 3600);
    REQUIRE(c.nbf.has_value());
    CHECK(*c.nbf == kNow - 10);
  }

  TEST_CASE("an ES256 token yields its claims") {
    const Claims c = accepts(both(), bearer(ec_token()));
    CHECK(c.sub == "user-1");
    CHECK(c.org == std::optional<std::string>("org-a"));
  }

  TEST_CASE("the scheme is case-insensitive and surrounding spaces are ignored") {
    accepts(both(), "bearer " + ed_token());
    accepts(both(), "BEARER " + ed_token());
    accepts(both(), "  Bearer   " + ed_token() + "  ");
  }

  TEST_CASE("aud as a string, as an array, and as the node id") {
    accepts(both(), bearer(ed_token(with(good_claims(), "aud", "gpunode"))));
    accepts(both(), bearer(ed_token(with(good_claims(), "aud", json::array{"other", "gpunode"}))));
    accepts(both(), bearer(ed_token(with(good_claims(), "aud", "node-7"))));
    accepts(both(), bearer(ed_token(with(good_claims(), "aud", json::array{"x", "node-7"}))));
  }

  TEST_CASE("nbf in the past, nbf within the leeway, no nbf at all") {
    accepts(both(), bearer(ed_token(with(good_claims(), "nbf", kNow - 1000))));
    accepts(both(), bearer(ed_token(with(good_claims(), "nbf", kNow + 60))));
    const Claims c = accepts(both(), bearer(ed_token(without(good_claims(), "nbf"))));
    CHECK_FALSE(c.nbf.has_value());
  }

  TEST_CASE("exp already past but within the 60 s leeway") {
    accepts(both(), bearer(ed_token(with(good_claims(), "exp", kNow - 60))));
    accepts(both(), bearer(ed_token(with(good_claims(), "exp", kNow))));
  }

  TEST_CASE("two keys of a type loaded, the token signed by the second") {
    const TokenVerifier v =
        verifier({ed().public_pem(), ed2().public_pem(), ec().public_pem(), ec2().public_pem()});
    accepts(v, bearer(mint(ed2(), R"({"alg":"EdDSA"})", text(good_claims()))));
    accepts(v, bearer(mint(ec2(), R"({"alg":"ES256"})", text(good_claims()))));
  }

  TEST_CASE("a kid equal to the signing key's RFC 7638 thumbprint") {
    const TokenVerifier v =
        verifier({ed().public_pem(), ed2().public_pem(), ec().public_pem(), ec2().public_pem()});
    CHECK(v.key_ids() == std::vector<std::string>{ed().thumbprint(), ed2().thumbprint(), ec().thumbprint(),
                                                  ec2().thumbprint()});
    accepts(v, bearer(mint(ed2(), R"({"alg":"EdDSA","kid":")" + ed2().thumbprint() + "\"}",
                           text(good_claims()))));
    accepts(v, bearer(mint(ec2(), R"({"alg":"ES256","kid":")" + ec2().thumbprint() + "\"}",
                           text(good_claims()))));
  }

  TEST_CASE("optional claims absent or null: no org, no roles; unknown roles are kept as sent") {
    Claims c = accepts(both(), bearer(ed_token(without(without(good_claims(), "org"), "roles"))));
    CHECK_FALSE(c.org.has_value());
    CHECK(c.roles.empty());
    c = accepts(both(), bearer(ed_token(with(with(good_claims(), "org", nullptr), "roles", nullptr))));
    CHECK_FALSE(c.org.has_value());
    CHECK(c.roles.empty());
    c = accepts(
        both(),
        bearer(ed_token(with(good_claims(), "roles", json::array{"platform-operator", "tea-maker"}))));
    CHECK(c.roles == std::vector<std::string>{"platform-operator", "tea-maker"});
  }

  TEST_CASE("a header's jwk/jku/x5c is ignored, never trusted") {
    // Signed by our key: accepted, the embedded key plays no part.
    accepts(both(),
            bearer(ed_token(good_claims(),
                            R"({"alg":"EdDSA","jku":"https://evil.example/k","jwk":{"kty":"OKP"}})")));
    // Signed by the attacker's key that the header embeds: refused.
    const TestKey attacker(KeyKind::ed25519);
    rejects(both(),
            bearer(mint(attacker, R"({"alg":"EdDSA","jwk":{"kty":"OKP","crv":"Ed25519","x":"AAAA"}})",
                        text(good_claims()))),
            Rejection::bad_signature);
  }

  TEST_CASE("RFC 8037 A.4 Ed25519 vector: the signature verifies (the payload is then not a JWT)") {
    const TokenVerifier v = verifier({std::string(kRfc8037Pem)});
    CHECK(v.key_ids() == std::vector<std::string>{std::string(kRfc8037Thumbprint)});
    // malformed (payload not JSON), not bad_signature: the known-answer signature was accepted.
    rejects(v, bearer(kRfc8037Jws), Rejection::malformed);
    std::string tampered(kRfc8037Jws);
    tampered[tampered.size() - 5] = tampered[tampered.size() - 5] == 'A' ? 'B' : 'A';
    rejects(v, bearer(tampered), Rejection::bad_signature);
  }

  TEST_CASE("RFC 7515 A.3 ES256 vector: raw R||S verifies (then fails on its claims)") {
    const TokenVerifier v =
        verifier({std::string(kRfc7515Pem)}, VerifierConfig{"joe", "gpunode", "", std::chrono::seconds(60)});
    // It has iss "joe" and no aud: missing_claim proves the signature was accepted.
    rejects(v, bearer(kRfc7515Jws), Rejection::missing_claim,
            std::chrono::system_clock::time_point{std::chrono::seconds(1300819000)});
    std::string tampered(kRfc7515Jws);
    tampered[tampered.size() - 5] = tampered[tampered.size() - 5] == 'A' ? 'B' : 'A';
    rejects(v, bearer(tampered), Rejection::bad_signature,
            std::chrono::system_clock::time_point{std::chrono::seconds(1300819000)});
  }
}

// ------------------------------------------------------------------------------------------------
TEST_SUITE("reject: the header value") {
  TEST_CASE("no Authorization header") {
    rejects(both(), "", Rejection::missing);
    rejects(both(), "   ", Rejection::missing);
  }
  TEST_CASE("another scheme (Basic)") {
    rejects(both(), "Basic dXNlcjpwYXNz", Rejection::missing);
  }
  TEST_CASE("Bearer with an empty token") {
    rejects(both(), "Bearer", Rejection::malformed);
    rejects(both(), "Bearer ", Rejection::malformed);
  }
  TEST_CASE("two tokens after Bearer") {
    rejects(both(), bearer(ed_token()) + " " + ed_token(), Rejection::malformed);
  }
  TEST_CASE("a token over 8 KiB, even a validly signed one") {
    // Padded with a long claim so the signature is good: only the size refuses it.
    const std::string big = ed_token(with(good_claims(), "pad", json::string(std::string(7000, 'x'))));
    REQUIRE(big.size() > gpunode::auth::kMaxTokenBytes);
    rejects(both(), bearer(big), Rejection::malformed);
    rejects(both(), "Bearer " + std::string(1 << 20, 'A'), Rejection::malformed);
  }
}

TEST_SUITE("reject: the compact serialization") {
  TEST_CASE("2 parts") {
    rejects(both(), bearer(part(ed_token(), 0) + "." + part(ed_token(), 1)), Rejection::malformed);
  }
  TEST_CASE("4 parts") {
    rejects(both(), bearer(ed_token() + ".AAAA"), Rejection::malformed);
  }
  TEST_CASE("1 part") {
    rejects(both(), bearer("abcdef"), Rejection::malformed);
  }
  TEST_CASE("base64 padding") {
    // Header {"alg":"EdDSA"} encodes to 20 chars plus no padding; append '=' padding to a part.
    const std::string t = ed_token();
    rejects(both(), bearer(with_part(t, 2, part(t, 2) + "==")), Rejection::malformed);
    rejects(both(), bearer(with_part(t, 1, part(t, 1) + "=")), Rejection::malformed);
  }
  TEST_CASE("standard base64 characters + and /") {
    const std::string t = ed_token();
    std::string sig = part(t, 2);
    sig[3] = '+';
    rejects(both(), bearer(with_part(t, 2, sig)), Rejection::malformed);
    sig[3] = '/';
    rejects(both(), bearer(with_part(t, 2, sig)), Rejection::malformed);
  }
  TEST_CASE("illegal characters") {
    const std::string t = ed_token();
    for (const char c : std::string_view("!*~%\"\\\x01\x7f")) {
      std::string payload = part(t, 1);
      payload[2] = c;
      rejects(both(), bearer(with_part(t, 1, payload)), Rejection::malformed);
    }
    rejects(both(), bearer(t + std::string(1, '\0')), Rejection::malformed);
  }
  TEST_CASE("a part of impossible length or with non-zero trailing bits") {
    const std::string t = ed_token();
    rejects(both(), bearer(with_part(t, 2, part(t, 2) + "AAA")),
            Rejection::malformed);  // 89 chars: len % 4 == 1
    // 64-byte signature = 86 chars with 2 spare bits: change the last char so a spare bit is set.
    std::string sig = part(t, 2);
    REQUIRE(sig.size() == 86);
    const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const std::size_t v = alphabet.find(sig.back());
    sig.back() = alphabet[v ^ 1u];  // same decoded bytes, non-canonical spelling
    rejects(both(), bearer(with_part(t, 2, sig)), Rejection::malformed);
    rejects(both(), bearer(with_part(t, 1, "A")), Rejection::malformed);  // 1 char: no bytes encode to it
  }
  TEST_CASE("the header is not JSON") {
    rejects(both(), bearer(mint(ed(), "alg=EdDSA", text(good_claims()))), Rejection::malformed);
    rejects(both(), bearer(mint(ed(), R"({"alg":"EdDSA",})", text(good_claims()))), Rejection::malformed);
    rejects(both(), bearer(mint(ed(), R"(["EdDSA"])", text(good_claims()))), Rejection::malformed);
    rejects(both(), bearer(mint(ed(), "", text(good_claims()))), Rejection::malformed);
  }
  TEST_CASE("the payload is not JSON (validly signed)") {
    rejects(both(), bearer(mint(ed(), R"({"alg":"EdDSA"})", "sub=user-1")), Rejection::malformed);
    rejects(both(), bearer(mint(ed(), R"({"alg":"EdDSA"})", "[1,2]")), Rejection::malformed);
    rejects(both(), bearer(mint(ed(), R"({"alg":"EdDSA"})", "")), Rejection::malformed);
    rejects(both(), bearer(mint(ed(), R"({"alg":"EdDSA"})", text(good_claims()) + " trailing")),
            Rejection::malformed);
    rejects(both(), bearer(mint(ed(), R"({"alg":"EdDSA"})", "{\"sub\":\"\xff\xfe\"}")),
            Rejection::malformed);  // not UTF-8
  }
  TEST_CASE("duplicate keys in the header or the payload") {
    rejects(both(), bearer(mint(ed(), R"({"alg":"ES256","alg":"EdDSA"})", text(good_claims()))),
            Rejection::malformed);
    const std::string dup_iss =
        R"({"iss":"https://evil.example","iss":"https://central.example","aud":"gpunode",)"
        R"("sub":"u","exp":)" +
        std::to_string(kNow + 100) + "}";
    rejects(both(), bearer(mint(ed(), R"({"alg":"EdDSA"})", dup_iss)), Rejection::malformed);
    // Equal after unescaping: "sub" and "\u0073ub".
    const std::string dup_escaped =
        R"({"iss":"https://central.example","aud":"gpunode","sub":"a","\u0073ub":"b","exp":)" +
        std::to_string(kNow + 100) + "}";
    rejects(both(), bearer(mint(ed(), R"({"alg":"EdDSA"})", dup_escaped)), Rejection::malformed);
    // Nested objects have their own key sets: a repeated key across levels is fine.
    accepts(both(), bearer(ed_token(with(good_claims(), "ext",
                                         json::object{{"sub", "x"}, {"n", json::object{{"sub", 1}}}}))));
  }
  TEST_CASE("a crit header is refused") {
    rejects(both(), bearer(ed_token(good_claims(), R"({"alg":"EdDSA","crit":["exp"],"exp":1})")),
            Rejection::malformed);
  }
}

TEST_SUITE("reject: algorithms and keys") {
  TEST_CASE("alg none, with and without an empty signature") {
    const std::string input = signing_input(R"({"alg":"none","typ":"JWT"})", text(good_claims()));
    rejects(both(), bearer(input + "."), Rejection::unsupported_alg);
    rejects(both(), bearer(input), Rejection::malformed);  // two parts
    rejects(both(), bearer(input + "." + part(ed_token(), 2)), Rejection::unsupported_alg);
    rejects(both(), bearer(signing_input(R"({"alg":"None"})", text(good_claims())) + "."),
            Rejection::unsupported_alg);
  }
  TEST_CASE("no alg, or alg not a string") {
    rejects(both(), bearer(ed_token(good_claims(), R"({"typ":"JWT"})")), Rejection::malformed);
    rejects(both(), bearer(ed_token(good_claims(), R"({"alg":null})")), Rejection::malformed);
    rejects(both(), bearer(ed_token(good_claims(), R"({"alg":["EdDSA"]})")), Rejection::malformed);
  }
  TEST_CASE("HS256 keyed with the public key (the key-confusion attack)") {
    for (const TestKey* k : {&ed(), &ec()}) {
      const std::string pem = k->public_pem();
      rejects(both(), bearer(mint_hs256(pem, R"({"alg":"HS256"})", text(good_claims()))),
              Rejection::unsupported_alg);
      rejects(both(), bearer(mint_hs256(pem, R"({"alg":"HS512"})", text(good_claims()))),
              Rejection::unsupported_alg);
    }
  }
  TEST_CASE("RS256, ES384 and other algs") {
    const TokenVerifier v = verifier({ed().public_pem()});
    rejects(v, bearer(mint(rsa(), R"({"alg":"RS256"})", text(good_claims()))), Rejection::unsupported_alg);
    rejects(v, bearer(mint(p384(), R"({"alg":"ES384"})", text(good_claims()))), Rejection::unsupported_alg);
    rejects(v, bearer(ed_token(good_claims(), R"({"alg":"Ed25519"})")), Rejection::unsupported_alg);
    rejects(v, bearer(ed_token(good_claims(), R"({"alg":"eddsa"})")), Rejection::unsupported_alg);
    rejects(v, bearer(ed_token(good_claims(), R"({"alg":"PS256"})")), Rejection::unsupported_alg);
  }
  TEST_CASE("ES256 header over an Ed25519 signature") {
    // Only an Ed25519 key loaded: no P-256 key to try.
    rejects(verifier({ed().public_pem()}), bearer(ed_token(good_claims(), R"({"alg":"ES256"})")),
            Rejection::unknown_key);
    // Both types loaded: the 64 Ed25519 bytes are read as R||S and do not verify.
    rejects(both(), bearer(ed_token(good_claims(), R"({"alg":"ES256"})")), Rejection::bad_signature);
    // And the other way round.
    rejects(both(), bearer(ec_token(good_claims(), R"({"alg":"EdDSA"})")), Rejection::bad_signature);
  }
  TEST_CASE("signed by a key that is not loaded") {
    rejects(both(), bearer(mint(ed2(), R"({"alg":"EdDSA"})", text(good_claims()))), Rejection::bad_signature);
    rejects(both(), bearer(mint(ec2(), R"({"alg":"ES256"})", text(good_claims()))), Rejection::bad_signature);
  }
  TEST_CASE("tampered payload") {
    for (const std::string& t : {ed_token(), ec_token()}) {
      const std::string forged =
          b64url(text(with(good_claims(), "roles", json::array{"platform-admin", "platform-operator"})));
      rejects(both(), bearer(with_part(t, 1, forged)), Rejection::bad_signature);
      rejects(both(), bearer(with_part(t, 1, b64url(text(with(good_claims(), "sub", "root"))))),
              Rejection::bad_signature);
    }
  }
  TEST_CASE("tampered header (kid removed / typ changed) breaks the signature") {
    const std::string t = ed_token(good_claims(), R"({"alg":"EdDSA","typ":"JWT"})");
    rejects(both(), bearer(with_part(t, 0, b64url(R"({"alg":"EdDSA"})"))), Rejection::bad_signature);
  }
  TEST_CASE("tampered signature") {
    for (const std::string& t : {ed_token(), ec_token()}) {
      std::string sig = part(t, 2);
      sig[10] = sig[10] == 'A' ? 'B' : 'A';
      rejects(both(), bearer(with_part(t, 2, sig)), Rejection::bad_signature);
      rejects(both(), bearer(with_part(t, 2, std::string(86, 'A'))), Rejection::bad_signature);  // all zero
    }
  }
  TEST_CASE("a signature of the wrong length") {
    for (const std::string& t : {ed_token(), ec_token()}) {
      rejects(both(), bearer(with_part(t, 2, "")), Rejection::bad_signature);
      rejects(both(), bearer(with_part(t, 2, part(t, 2).substr(0, 84))),
              Rejection::bad_signature);                                                          // 63 bytes
      rejects(both(), bearer(with_part(t, 2, part(t, 2) + "AA")), Rejection::bad_signature);      // 66 bytes
      rejects(both(), bearer(with_part(t, 2, std::string(128, 'A'))), Rejection::bad_signature);  // 96 bytes
    }
    // An ES256 signature left in DER (the usual interop bug) is refused.
    const std::string input = signing_input(R"({"alg":"ES256"})", text(good_claims()));
    rejects(both(), bearer(input + "." + b64url(ec().sign_raw(input, true))), Rejection::bad_signature);
  }
  TEST_CASE("a kid that is no loaded key's thumbprint") {
    rejects(both(), bearer(ed_token(good_claims(), R"({"alg":"EdDSA","kid":"2024-01"})")),
            Rejection::unknown_key);
    // The thumbprint of a P-256 key, on an EdDSA token: no Ed25519 key has it.
    rejects(both(), bearer(ed_token(good_claims(), R"({"alg":"EdDSA","kid":")" + ec().thumbprint() + "\"}")),
            Rejection::unknown_key);
    // The kid names a loaded key, but another key signed: that key alone is tried.
    const TokenVerifier v = verifier({ed().public_pem(), ed2().public_pem()});
    rejects(v,
            bearer(mint(ed(), R"({"alg":"EdDSA","kid":")" + ed2().thumbprint() + "\"}", text(good_claims()))),
            Rejection::bad_signature);
    rejects(both(), bearer(ed_token(good_claims(), R"({"alg":"EdDSA","kid":7})")), Rejection::malformed);
  }
  TEST_CASE("no key of the token's type loaded") {
    rejects(verifier({ec().public_pem()}), bearer(ed_token()), Rejection::unknown_key);
    rejects(verifier({ed().public_pem()}), bearer(ec_token()), Rejection::unknown_key);
  }
}

TEST_SUITE("reject: claims") {
  TEST_CASE("expired beyond the leeway") {
    rejects(both(), bearer(ed_token(with(good_claims(), "exp", kNow - 61))), Rejection::expired);
    rejects(both(), bearer(ed_token(with(good_claims(), "exp", 0))), Rejection::expired);
    rejects(both(), bearer(ed_token(with(good_claims(), "exp", INT64_MIN))),
            Rejection::malformed);  // before 1970
    // The same token, at a later now.
    const std::string t = ed_token();
    accepts(both(), bearer(t), now_tp + std::chrono::seconds(3660));
    rejects(both(), bearer(t), Rejection::expired, now_tp + std::chrono::seconds(3661));
  }
  TEST_CASE(
      "time claims are bounded to 1970..2199 (CONTRACT §10): nothing near INT64_MAX reaches arithmetic") {
    accepts(both(), bearer(ed_token(with(good_claims(), "exp", 7258118399))));  // 2199-12-31T23:59:59Z
    rejects(both(), bearer(ed_token(with(good_claims(), "exp", 7258118400))), Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "exp", INT64_MAX))), Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "exp", INT64_MAX - 30))), Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "exp", -1))), Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "nbf", -1))), Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "iat", INT64_MAX))), Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "iat", -5))), Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "iat", "now"))), Rejection::malformed);
    accepts(both(), bearer(ed_token(with(good_claims(), "iat", kNow))));
    accepts(both(), bearer(ed_token(with(good_claims(), "iat", nullptr))));
  }
  TEST_CASE("nbf beyond the leeway") {
    rejects(both(), bearer(ed_token(with(good_claims(), "nbf", kNow + 61))), Rejection::not_yet_valid);
    rejects(both(), bearer(ed_token(with(good_claims(), "nbf", kNow + 86400 * 365))),
            Rejection::not_yet_valid);
    rejects(both(), bearer(ed_token(with(good_claims(), "nbf", INT64_MAX))), Rejection::malformed);
  }
  TEST_CASE("nbf not an integer") {
    rejects(both(), bearer(ed_token(with(good_claims(), "nbf", "0"))), Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "nbf", 1.5))), Rejection::malformed);
  }
  TEST_CASE("a zero leeway is exact") {
    const TokenVerifier v = verifier(
        {ed().public_pem()}, VerifierConfig{std::string(kIssuer), "gpunode", "", std::chrono::seconds(0)});
    accepts(v, bearer(ed_token(with(good_claims(), "exp", kNow))));
    rejects(v, bearer(ed_token(with(good_claims(), "exp", kNow - 1))), Rejection::expired);
    rejects(v, bearer(ed_token(with(good_claims(), "nbf", kNow + 1))), Rejection::not_yet_valid);
  }
  TEST_CASE("wrong iss") {
    rejects(both(), bearer(ed_token(with(good_claims(), "iss", "https://evil.example"))),
            Rejection::wrong_issuer);
    rejects(both(), bearer(ed_token(with(good_claims(), "iss", "https://central.example/"))),
            Rejection::wrong_issuer);
    rejects(both(), bearer(ed_token(with(good_claims(), "iss", "HTTPS://CENTRAL.EXAMPLE"))),
            Rejection::wrong_issuer);
    rejects(both(), bearer(ed_token(with(good_claims(), "iss", ""))), Rejection::wrong_issuer);
  }
  TEST_CASE("iss missing or not a string") {
    rejects(both(), bearer(ed_token(without(good_claims(), "iss"))), Rejection::missing_claim);
    rejects(both(), bearer(ed_token(with(good_claims(), "iss", json::array{kIssuer}))), Rejection::malformed);
  }
  TEST_CASE("wrong aud") {
    rejects(both(), bearer(ed_token(with(good_claims(), "aud", "other"))), Rejection::wrong_audience);
    rejects(both(), bearer(ed_token(with(good_claims(), "aud", "GPUNODE"))), Rejection::wrong_audience);
    rejects(both(), bearer(ed_token(with(good_claims(), "aud", ""))), Rejection::wrong_audience);
  }
  TEST_CASE("aud array without ours") {
    rejects(both(), bearer(ed_token(with(good_claims(), "aud", json::array{"a", "b"}))),
            Rejection::wrong_audience);
    rejects(both(), bearer(ed_token(with(good_claims(), "aud", json::array{}))), Rejection::wrong_audience);
  }
  TEST_CASE("an empty node id is never an audience") {
    const TokenVerifier v = verifier(
        {ed().public_pem()}, VerifierConfig{std::string(kIssuer), "gpunode", "", std::chrono::seconds(60)});
    rejects(v, bearer(ed_token(with(good_claims(), "aud", ""))), Rejection::wrong_audience);
  }
  TEST_CASE("aud missing or of the wrong type") {
    rejects(both(), bearer(ed_token(without(good_claims(), "aud"))), Rejection::missing_claim);
    rejects(both(), bearer(ed_token(with(good_claims(), "aud", 7))), Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "aud", json::array{"gpunode", 7}))),
            Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "aud", json::object{{"gpunode", true}}))),
            Rejection::malformed);
  }
  TEST_CASE("missing exp") {
    rejects(both(), bearer(ed_token(without(good_claims(), "exp"))), Rejection::missing_claim);
  }
  TEST_CASE("exp as a string, a float, a bool, null, or beyond int64") {
    rejects(both(), bearer(ed_token(with(good_claims(), "exp", json::string(std::to_string(kNow + 100))))),
            Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "exp", static_cast<double>(kNow + 100)))),
            Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "exp", true))), Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "exp", nullptr))), Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "exp", std::uint64_t{1} << 63))),
            Rejection::malformed);
    // 1.8e9 written with an exponent is a double in JSON terms: refused too.
    const std::string payload = R"({"iss":"https://central.example","aud":"gpunode","sub":"u","exp":1.9e9})";
    rejects(both(), bearer(mint(ed(), R"({"alg":"EdDSA"})", payload)), Rejection::malformed);
  }
  TEST_CASE("missing sub") {
    rejects(both(), bearer(ed_token(without(good_claims(), "sub"))), Rejection::missing_claim);
    rejects(both(), bearer(ed_token(with(good_claims(), "sub", ""))), Rejection::missing_claim);
    rejects(both(), bearer(ed_token(with(good_claims(), "sub", 42))), Rejection::malformed);
  }
  TEST_CASE("org not a string") {
    rejects(both(), bearer(ed_token(with(good_claims(), "org", 5))), Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "org", json::array{"org-a"}))), Rejection::malformed);
  }
  TEST_CASE("roles not an array of strings") {
    rejects(both(), bearer(ed_token(with(good_claims(), "roles", "platform-admin"))), Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "roles", json::object{{"platform-admin", true}}))),
            Rejection::malformed);
    rejects(both(), bearer(ed_token(with(good_claims(), "roles", json::array{"platform-admin", 1}))),
            Rejection::malformed);
  }
  TEST_CASE("the claims must be an object nested no deeper than the limit") {
    json::value deep = "x";
    for (int i = 0; i < 40; ++i) deep = json::array{deep};
    rejects(both(), bearer(ed_token(with(good_claims(), "ext", deep))), Rejection::malformed);
  }
}

// ------------------------------------------------------------------------------------------------
TEST_SUITE("key loading") {
  TEST_CASE("PEM texts and files of Ed25519 and P-256 public keys load") {
    TempDir dir;
    const std::string a = dir.write("a.pem", ed().public_pem());
    const std::string b = dir.write("b.pem", ec().public_pem());
    auto v = TokenVerifier::from_files({a, b}, config());
    REQUIRE_MESSAGE(v.has_value(), (v ? "" : v.error().detail));
    CHECK(v->key_ids().size() == 2);
    accepts(*v, bearer(ec_token()));
  }

  TEST_CASE("a missing file is named with the reason") {
    auto v = TokenVerifier::from_files({"/nonexistent/gpunode/key.pem"}, config());
    REQUIRE_FALSE(v.has_value());
    CHECK(v.error().detail == "/nonexistent/gpunode/key.pem: cannot read: No such file or directory");
    CHECK(v.error().code == gpunode::error::Errc::not_found);
  }

  TEST_CASE("a directory instead of a file") {
    TempDir dir;
    auto v = TokenVerifier::from_files({dir.path.string()}, config());
    REQUIRE_FALSE(v.has_value());
    CHECK(v.error().detail.starts_with(dir.path.string() + ": "));
  }

  TEST_CASE("a file that is not PEM") {
    TempDir dir;
    const std::string f = dir.write("junk.pem", "this is not a key\n");
    auto v = TokenVerifier::from_files({f}, config());
    REQUIRE_FALSE(v.has_value());
    CHECK(v.error().detail == f + ": not a PEM public key (no -----BEGIN line)");
    const std::string empty = dir.write("empty.pem", "");
    v = TokenVerifier::from_files({empty}, config());
    REQUIRE_FALSE(v.has_value());
    CHECK(v.error().detail == empty + ": not a PEM public key (no -----BEGIN line)");
  }

  TEST_CASE("a damaged PEM block") {
    std::string pem = ed().public_pem();
    pem.erase(pem.find("-----END"));
    auto v = TokenVerifier::from_pems({pem}, config());
    REQUIRE_FALSE(v.has_value());
    CHECK(v.error().detail.starts_with("key #1: PEM block 1 is damaged"));
    v = TokenVerifier::from_pems({"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"}, config());
    REQUIRE_FALSE(v.has_value());
    CHECK(v.error().detail == "key #1: not a valid public key (bad SubjectPublicKeyInfo)");
  }

  TEST_CASE("an RSA key is refused as unsupported") {
    auto v = TokenVerifier::from_pems({ed().public_pem(), rsa().public_pem()}, config());
    REQUIRE_FALSE(v.has_value());
    CHECK(v.error().detail == "key #2: unsupported key type RSA (only Ed25519 and P-256 are accepted)");
  }

  TEST_CASE("a P-384 key is refused as unsupported") {
    TempDir dir;
    const std::string f = dir.write("p384.pem", p384().public_pem());
    auto v = TokenVerifier::from_files({f}, config());
    REQUIRE_FALSE(v.has_value());
    CHECK(v.error().detail == f + ": unsupported key type: EC curve secp384r1 (only P-256 is accepted)");
  }

  TEST_CASE("a private key PEM is refused: auth.keys takes public keys only") {
    for (const TestKey* k : {&ed(), &ec()}) {
      auto v = TokenVerifier::from_pems({k->private_pem()}, config());
      REQUIRE_FALSE(v.has_value());
      CHECK(v.error().detail ==
            "key #1: holds a private key (PRIVATE KEY); auth.keys takes public keys only");
    }
  }

  TEST_CASE("a certificate or other PEM block is refused") {
    auto v = TokenVerifier::from_pems({"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"},
                                      config());
    REQUIRE_FALSE(v.has_value());
    CHECK(v.error().detail ==
          "key #1: a \"CERTIFICATE\" block, not a PEM public key (-----BEGIN PUBLIC KEY-----)");
  }

  TEST_CASE("several public keys in one file all load; one bad block refuses the file") {
    TempDir dir;
    const std::string f =
        dir.write("bundle.pem", "# rollover\n" + ed().public_pem() + ec().public_pem() + ed2().public_pem());
    auto v = TokenVerifier::from_files({f}, config());
    REQUIRE_MESSAGE(v.has_value(), (v ? "" : v.error().detail));
    CHECK(v->key_ids() == std::vector<std::string>{ed().thumbprint(), ec().thumbprint(), ed2().thumbprint()});
    accepts(*v, bearer(mint(ed2(), R"({"alg":"EdDSA"})", text(good_claims()))));

    const std::string g = dir.write("mixed.pem", ed().public_pem() + rsa().public_pem());
    v = TokenVerifier::from_files({g}, config());
    REQUIRE_FALSE(v.has_value());
    CHECK(v.error().detail ==
          g + " (PEM block 2): unsupported key type RSA (only Ed25519 and P-256 are accepted)");
  }

  TEST_CASE("bad configurations are refused") {
    CHECK_FALSE(TokenVerifier::from_pems({}, config()).has_value());
    CHECK_FALSE(TokenVerifier::from_pems({ed().public_pem()},
                                         VerifierConfig{"", "gpunode", "n", std::chrono::seconds(60)})
                    .has_value());
    CHECK_FALSE(
        TokenVerifier::from_pems({ed().public_pem()}, VerifierConfig{"i", "", "", std::chrono::seconds(60)})
            .has_value());
    CHECK_FALSE(
        TokenVerifier::from_pems({ed().public_pem()}, VerifierConfig{"i", "a", "", std::chrono::seconds(-1)})
            .has_value());
  }
}

// ------------------------------------------------------------------------------------------------
TEST_SUITE("robustness") {
  TEST_CASE("2000 random mutations of a valid token never throw and never verify") {
    std::mt19937 rng(20270115);
    const std::string tokens[] = {ed_token(), ec_token()};
    const std::string alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ ";
    int rejected = 0;
    for (int i = 0; i < 2000; ++i) {
      const std::string& original = tokens[i % 2];
      std::string t = original;
      const auto pick = [&](std::size_t n) {
        return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng);
      };
      const int kind = static_cast<int>(pick(7));
      switch (kind) {
        // Each pick() is its own statement: the order of a call's arguments is unspecified (GCC
        // and clang differ), and the mutations must be the same whatever compiled them.
        case 0: {  // replace by a token-ish char
          const std::size_t at = pick(t.size());
          t[at] = alphabet[pick(alphabet.size())];
          break;
        }
        case 1: {  // replace by any byte
          const std::size_t at = pick(t.size());
          t[at] = static_cast<char>(pick(256));
          break;
        }
        case 2: {  // delete
          const std::size_t at = pick(t.size());
          t.erase(at, 1 + pick(4));
          break;
        }
        case 3: {  // insert
          const std::size_t at = pick(t.size() + 1);
          t.insert(at, 1, alphabet[pick(alphabet.size())]);
          break;
        }
        case 4:
          t.resize(pick(t.size()));
          break;   // truncate
        case 5: {  // flip a bit of a decoded part
          const int which = static_cast<int>(pick(3));
          const std::string_view ab = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
          std::string p = part(t, which);
          // Decode, flip, re-encode canonically: the mutation reaches the JSON parser / verifier.
          std::string bytes;
          std::uint32_t acc = 0;
          int bits = 0;
          for (char c : p) {
            acc = (acc << 6) | static_cast<std::uint32_t>(ab.find(c));
            bits += 6;
            if (bits >= 8) {
              bits -= 8;
              bytes.push_back(static_cast<char>((acc >> bits) & 0xFF));
            }
          }
          if (!bytes.empty()) {
            const std::size_t at = pick(bytes.size());
            bytes[at] = static_cast<char>(bytes[at] ^ (1 << pick(8)));
          }
          t = with_part(t, which, b64url(bytes));
          break;
        }
        default: {  // splice: a slice of the token moved elsewhere
          const std::size_t a = pick(t.size());
          const std::string slice = t.substr(a, 1 + pick(16));
          const std::size_t at = pick(t.size() + 1);
          t.insert(at, slice);
          break;
        }
      }
      // The same token, or the same token after more spaces than "Bearer " has: both verify.
      const auto start = t.find_first_not_of(' ');
      if (t == original || (start != std::string::npos && t.substr(start) == original)) continue;
      std::expected<Claims, AuthError> r;
      CHECK_NOTHROW(r = both().verify(bearer(t), now_tp));
      CHECK_FALSE(r.has_value());
      if (!r.has_value()) ++rejected;
    }
    CHECK(rejected > 1900);
  }

  TEST_CASE("a verifier is copyable and its copies share keys") {
    const TokenVerifier copy = both();  // NOLINT(performance-unnecessary-copy-initialization)
    accepts(copy, bearer(ed_token()));
  }

  TEST_CASE("every rejection has a stable name") {
    CHECK(gpunode::auth::to_string(Rejection::missing) == "missing");
    CHECK(gpunode::auth::to_string(Rejection::malformed) == "malformed");
    CHECK(gpunode::auth::to_string(Rejection::unsupported_alg) == "unsupported_alg");
    CHECK(gpunode::auth::to_string(Rejection::bad_signature) == "bad_signature");
    CHECK(gpunode::auth::to_string(Rejection::expired) == "expired");
    CHECK(gpunode::auth::to_string(Rejection::not_yet_valid) == "not_yet_valid");
    CHECK(gpunode::auth::to_string(Rejection::wrong_issuer) == "wrong_issuer");
    CHECK(gpunode::auth::to_string(Rejection::wrong_audience) == "wrong_audience");
    CHECK(gpunode::auth::to_string(Rejection::unknown_key) == "unknown_key");
    CHECK(gpunode::auth::to_string(Rejection::missing_claim) == "missing_claim");
  }
}
