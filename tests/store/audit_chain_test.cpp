// The audit hash (a known record's hash as Python computes it), sealing, and verify_chain over
// valid, tampered, reordered and truncated chains.
#include "gpunode/store/audit_chain.hpp"

#include <doctest/doctest.h>

#include <boost/json/object.hpp>
#include <cctype>
#include <cstdint>
#include <string>
#include <vector>

namespace json = boost::json;
using namespace gpunode::store;

namespace {

json::object agent_record(int n, std::string detail) {
  return json::object{
      {"id", format_audit_id(static_cast<std::uint64_t>(n))},
      {"at", "2027-01-31T00:00:00Z"},
      {"actor",
       json::object{{"sub", "gpunode-agent"}, {"org", nullptr}, {"roles", json::array{}}, {"via", "agent"}}},
      {"action", "reservation.activate"},
      {"nodeId", "node-a"},
      {"reservationId", "rsv_1"},
      {"unitIds", json::array{"u-0000-41-00-0"}},
      {"vmIds", json::array{}},
      {"result", "ok"},
      {"detail", std::move(detail)},
      {"requestId", nullptr}};
}

std::vector<json::object> make_chain(int n) {
  std::vector<json::object> chain;
  std::string prev(kGenesisPrevHash);
  for (int i = 1; i <= n; ++i) {
    auto r = agent_record(i, "record " + std::to_string(i));
    REQUIRE(seal_audit_record(r, prev).has_value());
    prev = std::string(r["hash"].get_string());
    chain.push_back(std::move(r));
  }
  return chain;
}

}  // namespace

TEST_CASE("sha256_hex: the standard test vectors") {
  CHECK(sha256_hex("").value() == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc").value() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("audit_hash of a known record equals Python's") {
  // python3: hashlib.sha256(json.dumps(r, sort_keys=True, separators=(",", ":"),
  //          ensure_ascii=False).encode()).hexdigest()
  auto r = agent_record(1, "term started: caf\xc3\xa9 \xf0\x9f\x98\x80");
  r["prevHash"] = kGenesisPrevHash;
  CHECK(audit_hash(r).value() == "76aecfa1e6251f88f7746fe846f38d99a171c82c9bb72c2ef6e606e15a7ca89d");
  // A "hash" key is not part of what is hashed.
  r["hash"] = "anything";
  CHECK(audit_hash(r).value() == "76aecfa1e6251f88f7746fe846f38d99a171c82c9bb72c2ef6e606e15a7ca89d");
  // prevHash is.
  r["prevHash"] = std::string(64, '1');
  CHECK(audit_hash(r).value() != "76aecfa1e6251f88f7746fe846f38d99a171c82c9bb72c2ef6e606e15a7ca89d");
}

TEST_CASE("audit_hash refuses what canonical_json refuses") {
  auto r = agent_record(1, "x");
  r["detail"] = 0.5;
  auto h = audit_hash(r);
  REQUIRE_FALSE(h.has_value());
  CHECK(h.error().detail.find("$.detail") == 0);
}

TEST_CASE("kGenesisPrevHash is 64 zeros") {
  CHECK(kGenesisPrevHash == std::string(64, '0'));
}

TEST_CASE("audit ids") {
  CHECK(parse_audit_id("aud_1").value() == 1);
  CHECK(parse_audit_id("aud_42").value() == 42);
  CHECK(parse_audit_id("aud_18446744073709551615").value() == UINT64_MAX);
  for (const char* bad : {"", "aud_", "aud_0", "aud_007", "aud_-1", "aud_+1", "aud_1x", "aud_ 1", "AUD_1",
                          "rsv_1", "aud_18446744073709551616"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_audit_id(bad).has_value());
  }
  CHECK(format_audit_id(7) == "aud_7");
}

TEST_CASE("verify_chain accepts a valid chain and an empty one") {
  CHECK(verify_chain({}).has_value());
  auto chain = make_chain(6);
  CHECK(std::string(chain[0]["prevHash"].get_string()) == kGenesisPrevHash);
  CHECK(chain[1]["prevHash"] == chain[0]["hash"]);
  CHECK(verify_chain(chain).has_value());
}

TEST_CASE("verify_chain checks a slice from the hash before it") {
  auto chain = make_chain(6);
  const std::vector<json::object> tail(chain.begin() + 3, chain.end());
  CHECK(verify_chain(tail, chain[2]["hash"].get_string()).has_value());
  auto from_genesis = verify_chain(tail);  // the slice is not a whole chain
  REQUIRE_FALSE(from_genesis.has_value());
  CHECK(from_genesis.error().index == 0);
  CHECK(from_genesis.error().record_id == "aud_4");
}

TEST_CASE("verify_chain: a changed field is a hash mismatch at that record") {
  auto chain = make_chain(5);
  chain[2]["detail"] = "rewritten";
  auto r = verify_chain(chain);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().index == 2);
  CHECK(r.error().record_id == "aud_3");
  CHECK(r.error().reason.find("hash mismatch") == 0);
}

TEST_CASE("verify_chain: a changed nested field or a changed key order") {
  auto chain = make_chain(3);
  chain[1]["actor"].as_object()["roles"].as_array().emplace_back("platform-admin");
  auto r = verify_chain(chain);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().record_id == "aud_2");

  // Reinserting the same keys in another order changes nothing: the hash is over sorted keys.
  auto again = make_chain(3);
  json::object reordered;
  const auto& orig = again[1];
  for (auto it = orig.end(); it != orig.begin();) {
    --it;
    reordered[it->key()] = it->value();
  }
  again[1] = reordered;
  CHECK(verify_chain(again).has_value());
}

TEST_CASE("verify_chain: a record rewritten with a fresh hash breaks the next link") {
  auto chain = make_chain(5);
  chain[2]["detail"] = "rewritten";
  REQUIRE(seal_audit_record(chain[2], chain[1]["hash"].get_string()).has_value());
  auto r = verify_chain(chain);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().index == 3);
  CHECK(r.error().record_id == "aud_4");
  CHECK(r.error().reason.find("prevHash") == 0);
}

TEST_CASE("verify_chain: reordered, removed and duplicated records") {
  SUBCASE("two records swapped") {
    auto chain = make_chain(5);
    std::swap(chain[1], chain[2]);
    auto r = verify_chain(chain);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().index == 1);
    CHECK(r.error().record_id == "aud_3");
  }
  SUBCASE("a middle record removed") {
    auto chain = make_chain(5);
    chain.erase(chain.begin() + 2);
    auto r = verify_chain(chain);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().index == 2);
    CHECK(r.error().record_id == "aud_4");
    CHECK(r.error().reason == "ids jump from aud_2 to aud_4");
  }
  SUBCASE("a middle record removed, the later ones renumbered and their hashes redone") {
    auto chain = make_chain(5);
    chain.erase(chain.begin() + 2);
    for (std::size_t i = 2; i < chain.size(); ++i) {
      chain[i]["id"] = format_audit_id(i + 1);
      REQUIRE(seal_audit_record(chain[i], chain[i - 1]["hash"].get_string()).has_value());
    }
    CHECK(verify_chain(chain).has_value());  // a consistent chain: only a signed head can tell (proof)
  }
  SUBCASE("ids with gaps, every hash redone (aud_1, aud_5, aud_9)") {
    auto chain = make_chain(3);
    for (std::size_t i = 1; i < chain.size(); ++i) {
      chain[i]["id"] = format_audit_id(4 * i + 1);
      REQUIRE(seal_audit_record(chain[i], chain[i - 1]["hash"].get_string()).has_value());
    }
    auto r = verify_chain(chain);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().index == 1);
    CHECK(r.error().reason == "ids jump from aud_1 to aud_5");
  }
  SUBCASE("the first record removed") {
    auto chain = make_chain(3);
    chain.erase(chain.begin());
    auto r = verify_chain(chain);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().index == 0);
    CHECK(r.error().reason.find("prevHash") == 0);
  }
  SUBCASE("a record repeated") {
    auto chain = make_chain(3);
    chain.insert(chain.begin() + 2, chain[1]);
    auto r = verify_chain(chain);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().index == 2);
    CHECK(r.error().reason == "ids jump from aud_2 to aud_2");
  }
  SUBCASE("ids renumbered down, hashes redone: still refused as a jump") {
    auto chain = make_chain(3);
    chain[2]["id"] = "aud_2";
    REQUIRE(seal_audit_record(chain[2], chain[1]["hash"].get_string()).has_value());
    auto r = verify_chain(chain);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().index == 2);
    CHECK(r.error().reason == "ids jump from aud_2 to aud_2");
  }
}

TEST_CASE("verify_chain: malformed records") {
  SUBCASE("no id") {
    auto chain = make_chain(2);
    chain[1].erase("id");
    auto r = verify_chain(chain);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().index == 1);
    CHECK(r.error().record_id.empty());
    CHECK(r.error().reason.find("\"id\"") != std::string::npos);
  }
  SUBCASE("id not a string") {
    auto chain = make_chain(2);
    chain[0]["id"] = 1;
    CHECK(verify_chain(chain).error().index == 0);
  }
  SUBCASE("id not aud_N") {
    auto chain = make_chain(2);
    chain[0]["id"] = "aud_01";
    auto r = verify_chain(chain);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().record_id == "aud_01");
    CHECK(r.error().reason.find("aud_N") != std::string::npos);
  }
  SUBCASE("no hash") {
    auto chain = make_chain(2);
    chain[1].erase("hash");
    auto r = verify_chain(chain);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().reason == "record has no string \"hash\"");
  }
  SUBCASE("prevHash null") {
    auto chain = make_chain(2);
    chain[1]["prevHash"] = nullptr;
    auto r = verify_chain(chain);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().reason == "record has no string \"prevHash\"");
  }
  SUBCASE("upper-case hex is not the hash") {
    auto chain = make_chain(1);
    std::string h(chain[0]["hash"].get_string());
    for (auto& c : h) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    chain[0]["hash"] = h;
    auto r = verify_chain(chain);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().reason.find("hash mismatch") == 0);
  }
  SUBCASE("a double smuggled into a record") {
    auto chain = make_chain(2);
    chain[1]["detail"] = 2.5;
    auto r = verify_chain(chain);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().reason.find("cannot hash the record: $.detail") == 0);
  }
}
