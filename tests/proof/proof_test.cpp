// The audit's proof (gpunode/proof): the node key, checkpoints and the check of an export.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>

#include <algorithm>
#include <boost/json.hpp>
#include <fstream>
#include <sstream>

#include "gpunode/auth/jwk.hpp"
#include "gpunode/proof/checkpoint.hpp"
#include "gpunode/proof/node_key.hpp"
#include "gpunode/store/audit_chain.hpp"
#include "temp_dir.hpp"

namespace {
namespace json = boost::json;
using gpunode::proof::NodeKey;

// RFC 8037 Appendix A.1: an Ed25519 key, its public half A.2, its thumbprint A.3 and a signature A.4.
constexpr std::string_view kRfcD = "nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A";
constexpr std::string_view kRfcX = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
constexpr std::string_view kRfcThumbprint = "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k";
constexpr std::string_view kRfcSigningInput = "eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc";
constexpr std::string_view kRfcSignature =
    "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg";

// The RFC's private key as a PKCS#8 PEM, written by OpenSSL from the raw 32 bytes.
std::string rfc_key_pem() {
  const auto d = gpunode::auth::from_base64url(kRfcD);
  REQUIRE(d.has_value());
  EVP_PKEY* k = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr,
                                             reinterpret_cast<const unsigned char*>(d->data()), d->size());
  REQUIRE(k != nullptr);
  BIO* out = BIO_new(BIO_s_mem());
  REQUIRE(PEM_write_bio_PrivateKey(out, k, nullptr, nullptr, 0, nullptr, nullptr) == 1);
  BUF_MEM* mem = nullptr;
  BIO_get_mem_ptr(out, &mem);
  std::string pem(mem->data, mem->length);
  BIO_free(out);
  EVP_PKEY_free(k);
  return pem;
}

// A second route to RFC 7638: the JWK text by hand, SHA-256 and base64url of our own here.
std::string thumbprint_by_hand(const std::string& raw_public) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  const auto b64 = [](std::string_view in) {
    std::string out;
    for (std::size_t i = 0; i < in.size(); i += 3) {
      std::uint32_t n = static_cast<std::uint32_t>(static_cast<unsigned char>(in[i])) << 16;
      if (i + 1 < in.size()) n |= static_cast<std::uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8;
      if (i + 2 < in.size()) n |= static_cast<unsigned char>(in[i + 2]);
      const std::size_t chars = std::min<std::size_t>(4, in.size() - i + 1);
      for (std::size_t c = 0; c < chars; ++c) out.push_back(kAlphabet[(n >> (18 - 6 * c)) & 63]);
    }
    return out;
  };
  const std::string jwk = R"({"crv":"Ed25519","kty":"OKP","x":")" + b64(raw_public) + "\"}";
  unsigned char md[32];
  unsigned int len = 0;
  REQUIRE(EVP_Digest(jwk.data(), jwk.size(), md, &len, EVP_sha256(), nullptr) == 1);
  return b64(std::string_view(reinterpret_cast<const char*>(md), len));
}

std::string raw_public(const std::string& public_pem) {
  BIO* in = BIO_new_mem_buf(public_pem.data(), static_cast<int>(public_pem.size()));
  EVP_PKEY* k = PEM_read_bio_PUBKEY(in, nullptr, nullptr, nullptr);
  BIO_free(in);
  REQUIRE(k != nullptr);
  std::string raw(32, '\0');
  std::size_t n = raw.size();
  REQUIRE(EVP_PKEY_get_raw_public_key(k, reinterpret_cast<unsigned char*>(raw.data()), &n) == 1);
  EVP_PKEY_free(k);
  return raw;
}

bool openssl_verifies(const std::string& public_pem, std::string_view sig, std::string_view message) {
  BIO* in = BIO_new_mem_buf(public_pem.data(), static_cast<int>(public_pem.size()));
  EVP_PKEY* k = PEM_read_bio_PUBKEY(in, nullptr, nullptr, nullptr);
  BIO_free(in);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool ok =
      k != nullptr && EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, k) == 1 &&
      EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                       reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(k);
  return ok;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("keyId is RFC 7638's thumbprint: RFC 8037's example key, and a second computation") {
  auto key = NodeKey::from_pem(rfc_key_pem(), "rfc8037.pem");
  REQUIRE(key.has_value());
  CHECK(key->key_id() == kRfcThumbprint);
  CHECK(gpunode::auth::base64url(raw_public(key->public_pem())) == kRfcX);
  auto fresh = NodeKey::generate();
  REQUIRE(fresh.has_value());
  CHECK(fresh->key_id() == thumbprint_by_hand(raw_public(fresh->public_pem())));
  CHECK(fresh->key_id() != key->key_id());
}

TEST_CASE(
    "Ed25519 signatures: RFC 8037's example, and a checkpoint's over NODE_ID\\nSEQ\\nHASH\\nAT exactly") {
  auto key = NodeKey::from_pem(rfc_key_pem(), "rfc8037.pem");
  REQUIRE(key.has_value());
  auto sig = key->sign(kRfcSigningInput);
  REQUIRE(sig.has_value());
  CHECK(gpunode::auth::base64url(*sig) == kRfcSignature);

  const std::string hash(64, 'a');
  auto cp = gpunode::proof::make_checkpoint(*key, "node-7f3a", 42, hash, "2027-01-31T00:00:00Z");
  REQUIRE(cp.has_value());
  CHECK(cp->at("seq").as_int64() == 42);
  CHECK(cp->at("hash").as_string() == hash);
  CHECK(cp->at("at").as_string() == "2027-01-31T00:00:00Z");
  CHECK(cp->at("keyId").as_string() == kRfcThumbprint);
  CHECK(cp->size() == 5);
  const auto raw = gpunode::auth::from_base64url(cp->at("signature").as_string());
  REQUIRE(raw.has_value());
  const std::string message = "node-7f3a\n42\n" + hash + "\n2027-01-31T00:00:00Z";
  CHECK(gpunode::proof::checkpoint_message("node-7f3a", 42, hash, "2027-01-31T00:00:00Z") == message);
  CHECK(openssl_verifies(key->public_pem(), *raw, message));
  CHECK_FALSE(openssl_verifies(key->public_pem(), *raw, message + "\n"));
}

TEST_CASE("the node key: made 0600 when missing, never overwritten, a bad file refused by name") {
  gpunode::test::TempDir dir;
  const std::string path = (dir.path() / "audit-signing.key").string();
  auto made = NodeKey::load_or_create(path);
  REQUIRE(made.has_value());
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(st.st_uid == ::geteuid());
  const std::string bytes = slurp(path);
  CHECK(bytes.starts_with("-----BEGIN PRIVATE KEY-----"));

  auto again = NodeKey::load_or_create(path);
  REQUIRE(again.has_value());
  CHECK(again->key_id() == made->key_id());
  CHECK(slurp(path) == bytes);
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    CHECK(entry.path().filename() == "audit-signing.key");  // no temporary file left behind

  const std::string bad = (dir.path() / "bad.key").string();
  std::ofstream(bad) << "not a key\n";
  auto refused = NodeKey::load_or_create(bad);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().detail.starts_with(bad + ": not a PEM private key"));
  CHECK(slurp(bad) == "not a key\n");

  std::ofstream(bad, std::ios::trunc) << "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
  refused = NodeKey::load_or_create(bad);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().detail.starts_with(bad + ": a damaged PEM private key"));

  EVP_PKEY* ec = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
  REQUIRE(ec != nullptr);
  BIO* out = BIO_new_file(bad.c_str(), "w");
  REQUIRE(PEM_write_bio_PrivateKey(out, ec, nullptr, nullptr, 0, nullptr, nullptr) == 1);
  BIO_free(out);
  EVP_PKEY_free(ec);
  refused = NodeKey::load_or_create(bad);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().detail.find("not Ed25519") != std::string::npos);

  refused = NodeKey::load_or_create((dir.path() / "no-such-dir" / "k").string());
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().detail.find("cannot create the audit signing key") != std::string::npos);
}

namespace {

struct Chain {
  std::vector<json::object> records;
  std::vector<json::object> checkpoints;
  std::string text() const {
    std::string out;
    for (const auto& r : records) out += json::serialize(r) + "\n";
    for (const auto& c : checkpoints) out += json::serialize(c) + "\n";
    return out;
  }
};

// `n` records; a checkpoint at each of `signed_at`.
Chain chain_of(const NodeKey& key, std::uint64_t n = 5, std::vector<std::uint64_t> signed_at = {3, 5}) {
  Chain c;
  std::string prev(gpunode::store::kGenesisPrevHash);
  for (std::uint64_t i = 1; i <= n; ++i) {
    json::object r{{"id", gpunode::store::format_audit_id(i)},
                   {"at", "2027-01-31T00:00:00Z"},
                   {"action", "reservation.create"},
                   {"nodeId", "node-1"},
                   {"detail", "n\u00e9e \x1b[2J"}};
    REQUIRE(gpunode::store::seal_audit_record(r, prev).has_value());
    prev = std::string(r.at("hash").as_string());
    c.records.push_back(r);
    if (std::find(signed_at.begin(), signed_at.end(), i) != signed_at.end()) {
      auto cp = gpunode::proof::make_checkpoint(key, "node-1", static_cast<std::int64_t>(i), prev,
                                                "2027-01-31T01:00:00Z");
      REQUIRE(cp.has_value());
      c.checkpoints.push_back(*cp);
    }
  }
  return c;
}

// Every record from `from` (an index) sealed again after the one before it: what a forger who
// rewrites records does so that the chain itself holds.
void reseal(Chain& c, std::size_t from = 0) {
  for (std::size_t i = from; i < c.records.size(); ++i) {
    const std::string prev = i == 0 ? std::string(gpunode::store::kGenesisPrevHash)
                                    : std::string(c.records[i - 1].at("hash").as_string());
    REQUIRE(gpunode::store::seal_audit_record(c.records[i], prev).has_value());
  }
}

std::string verdict(const Chain& c, const NodeKey& key) {
  auto v = gpunode::proof::verify_export(c.text(), key.public_pem(), "node.pub");
  if (v) return fmt::format("whole {} {} {}", v->records, v->checkpoints, v->head_id);
  CHECK(v.error().code == gpunode::error::Errc::corrupt);  // every break is of what was written
  return v.error().detail;
}

}  // namespace

TEST_CASE("verify_export: a whole export, and each kind of tampering caught and named") {
  auto key = NodeKey::generate();
  REQUIRE(key.has_value());
  const Chain whole = chain_of(*key);
  CHECK(verdict(whole, *key) == "whole 5 2 aud_5");

  Chain c = whole;
  c.records[1]["detail"] = "changed";
  CHECK(verdict(c, *key).starts_with("aud_2: hash mismatch: stored "));

  c = whole;
  c.records.erase(c.records.begin() + 1);
  CHECK(verdict(c, *key) == "aud_3: ids jump from aud_1 to aud_3");

  c = whole;
  std::swap(c.records[1], c.records[2]);
  CHECK(verdict(c, *key) == "aud_3: ids jump from aud_1 to aud_3");

  c = whole;
  c.records[1]["prevHash"] = std::string(64, 'a');
  CHECK(verdict(c, *key).starts_with("aud_2: prevHash aaaaaaaaaaaaaaaa... does not link to aud_1"));

  c = whole;
  c.checkpoints[0]["hash"] = std::string(64, 'f');
  CHECK(verdict(c, *key).starts_with("checkpoint seq 3: hash differs from aud_3's"));

  c = whole;
  auto sig = std::string(c.checkpoints[1].at("signature").as_string());
  sig[10] = sig[10] == 'A' ? 'B' : 'A';
  c.checkpoints[1]["signature"] = sig;
  CHECK(verdict(c, *key) ==
        fmt::format("checkpoint seq 5: signature does not verify with key {}", key->key_id()));

  c = whole;
  c.checkpoints[1]["at"] = "2027-01-31T02:00:00Z";  // the signed time changed
  CHECK(verdict(c, *key).starts_with("checkpoint seq 5: signature does not verify"));

  auto other = NodeKey::generate();
  REQUIRE(other.has_value());
  CHECK(verdict(whole, *other) == fmt::format("checkpoint seq 3: signed by key {}, not by the given key {}",
                                              key->key_id(), other->key_id()));
  // A checkpoint forged whole with another key: its keyId is that key's, the given key is the node's.
  c = whole;
  c.checkpoints[1] = *gpunode::proof::make_checkpoint(
      *other, "node-1", 5, std::string(whole.records[4].at("hash").as_string()), "2027-01-31T01:00:00Z");
  CHECK(verdict(c, *key).starts_with("checkpoint seq 5: signed by key "));

  c = whole;
  c.records.pop_back();  // the head dropped: its checkpoint names a record that is not there
  CHECK(verdict(c, *key) == "checkpoint seq 5: no record aud_5 in the export");

  c = whole;
  c.checkpoints.insert(c.checkpoints.begin() + 1, c.checkpoints[1]);  // a checkpoint twice
  CHECK(verdict(c, *key) == "checkpoint seq 5: not after checkpoint seq 5");

  const auto not_json = gpunode::proof::verify_export("{\"id\":1}\nnot json\n", key->public_pem(), "k");
  REQUIRE_FALSE(not_json);
  CHECK(not_json.error().detail.starts_with("line 2: not JSON"));
  CHECK(not_json.error().code == gpunode::error::Errc::invalid);
  const auto junk_key = gpunode::proof::verify_export(whole.text(), "junk", "k.pub");
  REQUIRE_FALSE(junk_key);
  CHECK(junk_key.error().detail.starts_with("k.pub: "));
  CHECK(junk_key.error().code == gpunode::error::Errc::invalid);
}

// The forgeries of issue 37, each of which an earlier verifier passed: every one is refused now,
// naming what is missing. Each is made as an attacker with the node's public key would make it.
TEST_CASE("verify_export fails closed: what is not signed, not whole or not there is refused by name") {
  auto key = NodeKey::generate();
  auto other = NodeKey::generate();
  REQUIRE(key.has_value());
  REQUIRE(other.has_value());
  const Chain whole = chain_of(*key, 6, {3, 6});

  SUBCASE("a record edited (actor and detail), every hash recomputed, the checkpoints deleted") {
    Chain c = whole;
    c.records[2]["actor"] = json::object{{"sub", "someone-else"}};
    c.records[2]["detail"] = "rewritten";
    reseal(c, 2);
    CHECK(verdict(c, *key).starts_with("checkpoint seq 3: hash differs from aud_3's"));
    c.checkpoints.clear();
    CHECK(verdict(c, *key) ==
          "no checkpoint covers aud_1..aud_6: nothing signed says they were written by the agent");
  }
  SUBCASE("one record fabricated from nothing, no checkpoint; and verified with an unrelated key") {
    Chain c = chain_of(*key, 1, {});
    CHECK(verdict(c, *key) ==
          "no checkpoint covers aud_1..aud_1: nothing signed says they were written by the agent");
    CHECK(verdict(c, *other) ==
          "no checkpoint covers aud_1..aud_1: nothing signed says they were written by the agent");
    // ... and with a checkpoint the forger signed with a key of their own.
    c = chain_of(*other, 1, {1});
    CHECK(verdict(c, *key) == fmt::format("checkpoint seq 1: signed by key {}, not by the given key {}",
                                          other->key_id(), key->key_id()));
  }
  SUBCASE("the head cut off (aud_1..aud_3 dropped), the genuine checkpoint of aud_6 kept") {
    Chain c = whole;
    c.records.erase(c.records.begin(), c.records.begin() + 3);
    c.checkpoints.erase(c.checkpoints.begin());
    CHECK(verdict(c, *key) ==
          "the export does not start at aud_1 (its first record is aud_4), and no signed checkpoint at aud_3 "
          "anchors it: an export made with --after starts after a checkpoint's record, and carries that "
          "checkpoint");
  }
  SUBCASE("a record rewritten after the last checkpoint, or one appended") {
    Chain c = chain_of(*key, 6, {3, 5});
    c.records[5]["detail"] = "rewritten";
    reseal(c, 5);
    CHECK(verdict(c, *key) ==
          "no checkpoint covers aud_6..aud_6: nothing signed says they were written by the agent");
    c = whole;
    c.records.push_back(json::object{{"id", "aud_7"}, {"nodeId", "node-1"}, {"detail", "appended"}});
    reseal(c, 6);
    CHECK(verdict(c, *key) ==
          "no checkpoint covers aud_7..aud_7: nothing signed says they were written by the agent");
  }
  SUBCASE("an empty file, and one with checkpoints only") {
    CHECK(verdict(Chain{}, *key) == "no records: the export is empty");
    Chain c = whole;
    c.records.clear();
    CHECK(verdict(c, *key) == "no records: the export holds only checkpoints");
  }
  SUBCASE("ids aud_1, aud_5, aud_9, every hash recomputed and the last one signed") {
    Chain c = chain_of(*key, 3, {});
    c.records[1]["id"] = "aud_5";
    c.records[2]["id"] = "aud_9";
    reseal(c, 1);
    c.checkpoints.push_back(*gpunode::proof::make_checkpoint(
        *key, "node-1", 9, std::string(c.records[2].at("hash").as_string()), "2027-01-31T01:00:00Z"));
    CHECK(verdict(c, *key) == "aud_5: ids jump from aud_1 to aud_5");
  }
  SUBCASE("a checkpoint past the last record") {
    Chain c = whole;
    c.checkpoints.push_back(
        *gpunode::proof::make_checkpoint(*key, "node-1", 7, std::string(64, 'e'), "2027-01-31T01:00:00Z"));
    CHECK(verdict(c, *key) == "checkpoint seq 7: no record aud_7 in the export");
  }
}

TEST_CASE("verify_export: an export after a signed record (--after) is anchored by its checkpoint") {
  auto key = NodeKey::generate();
  REQUIRE(key.has_value());
  const Chain whole = chain_of(*key, 6, {3, 6});
  Chain slice = whole;
  slice.records.erase(slice.records.begin(), slice.records.begin() + 3);  // aud_4..aud_6, both checkpoints
  auto v = gpunode::proof::verify_export(slice.text(), key->public_pem(), "node.pub");
  REQUIRE_MESSAGE(v.has_value(), (v ? "" : v.error().detail));
  CHECK(v->anchor == 3u);
  CHECK(v->first_id == "aud_4");
  CHECK(
      gpunode::proof::describe(*v) ==
      fmt::format("whole: 3 records, aud_4 to aud_6 after the signed checkpoint at aud_3 (the records up to "
                  "it are not in this export and were not checked here), every hash recomputed and linked; "
                  "2 checkpoints verified with key {}, the last at the head aud_6 {}",
                  key->key_id(), std::string(whole.records[5].at("hash").as_string())));

  Chain c = slice;  // the first record after a prevHash the anchor did not sign, the rest resealed
  REQUIRE(gpunode::store::seal_audit_record(c.records[0], std::string(64, 'b')).has_value());
  reseal(c, 1);
  CHECK(
      verdict(c, *key).starts_with("aud_4: prevHash bbbbbbbbbbbbbbbb... is not the previous record's hash"));

  c = slice;
  auto sig = std::string(c.checkpoints[0].at("signature").as_string());
  sig[5] = sig[5] == 'A' ? 'B' : 'A';
  c.checkpoints[0]["signature"] = sig;
  CHECK(verdict(c, *key) ==
        fmt::format("checkpoint seq 3: signature does not verify with key {}", key->key_id()));

  const auto from_start = gpunode::proof::verify_export(whole.text(), key->public_pem(), "node.pub");
  REQUIRE(from_start.has_value());
  CHECK_FALSE(from_start->anchor.has_value());
  CHECK(gpunode::proof::describe(*from_start)
            .starts_with("whole: 6 records, aud_1 to aud_6 from the chain's first record, every hash "
                         "recomputed and linked; 2 "
                         "checkpoints verified with key "));
}
