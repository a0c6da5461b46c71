// Emits a chain of varied audit records as "HASH<TAB>RECORD-JSON" lines, HASH being the C++
// audit_hash. audit_hash_check.py --compare runs this and recomputes every hash with Python's
// json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False) + hashlib.sha256.
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "gpunode/store/audit_chain.hpp"

namespace json = boost::json;
using gpunode::store::format_audit_id;

namespace {

std::string all_controls() {
  std::string s;
  for (int c = 0; c < 0x20; ++c) s.push_back(static_cast<char>(c));
  return s;
}

const std::vector<std::string>& details() {
  static const std::vector<std::string> d = {
      "",
      "ok",
      "quote \" backslash \\ slash / done",
      all_controls(),
      "tab\there, newline\nthere, cr\r, bs\b, ff\f, nul\x01\x1f",
      "DEL \x7f stays raw",
      "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 "
      "\xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82",  // café naïve 中文 привет
      "emoji \xf0\x9f\x98\x80 \xf0\x9f\x9a\x80 \xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x94\xac",  // 😀 🚀
                                                                                               // 👩‍🔬
      "line sep \xe2\x80\xa8 para sep \xe2\x80\xa9",
      "edge code points \xef\xbf\xbf \xf4\x8f\xbf\xbf \xc2\x80 \xdf\xbf \xe0\xa0\x80",  // U+FFFF U+10FFFF
                                                                                        // U+0080 U+07FF
                                                                                        // U+0800
      "hypervisor unavailable: virConnectOpen('qemu:///system') failed",
      "{\"looks\":\"like json\"}",
      "   leading and trailing spaces   ",
      "\xef\xbb\xbf BOM first",
  };
  return d;
}

json::object actor(int i) {
  switch (i % 4) {
    case 0:
      return {{"sub", "user-17"}, {"org", "org-a"}, {"roles", json::array{}}, {"via", "https"}};
    case 1:
      return {{"sub", "ops@example.com"},
              {"org", "org-platform"},
              {"roles", json::array{"platform-admin", "platform-operator"}},
              {"via", "https"}};
    case 2:
      return {{"sub", "local:0"},
              {"org", nullptr},
              {"roles", json::array{"platform-admin"}},
              {"via", "admin-socket"}};
    default:
      return {{"sub", "gpunode-agent"}, {"org", nullptr}, {"roles", json::array{}}, {"via", "agent"}};
  }
}

const char* const kActions[] = {"reservation.create",   "reservation.amend",  "reservation.end",
                                "reservation.activate", "reservation.expire", "units.release",
                                "units.reclaim",        "workload.terminate", "unit.absent"};

}  // namespace

int main() {
  std::string prev(gpunode::store::kGenesisPrevHash);
  const int count = 60;
  for (int i = 0; i < count; ++i) {
    const auto& ds = details();
    json::object r;
    // Insertion order deliberately not sorted, and varied: canonical form must not depend on it.
    if (i % 2 == 0) r["result"] = i % 5 == 0 ? "failed" : "ok";
    r["id"] = format_audit_id(static_cast<std::uint64_t>(i + 1));
    r["at"] = "2027-01-31T00:00:" + std::string(i < 10 ? "0" : "") + std::to_string(i) + "Z";
    r["actor"] = actor(i);
    r["action"] = kActions[static_cast<std::size_t>(i) % std::size(kActions)];
    r["nodeId"] = i % 7 == 0 ? "n\xc3\xb6"
                               "de-\xe2\x9c\x93"
                             : "node-a";
    r["reservationId"] = i % 3 == 0 ? json::value(nullptr) : json::value("rsv_" + std::to_string(1000 + i));
    json::array units;
    for (int u = 0; u < i % 4; ++u) units.emplace_back("u-0000-" + std::to_string(41 + u) + "-00-0");
    r["unitIds"] = std::move(units);
    json::array vms;
    if (i % 3 == 1) vms.emplace_back("vm-" + std::to_string(i));
    r["vmIds"] = std::move(vms);
    if (i % 2 == 1) r["result"] = "ok";
    r["detail"] = ds[static_cast<std::size_t>(i) % ds.size()];
    r["requestId"] = i % 4 == 3 ? json::value(nullptr) : json::value("req-" + std::to_string(i * 7919));
    if (i % 6 == 5) {
      // Not in the contract's record, but canonical_json must get nested objects, unicode keys and
      // integers at their limits right too.
      r["extra"] = json::object{
          {"z", 1},
          {"\xc3\xa9", 2},  // é sorts after z (U+00E9 > U+007A)
          {"Z", 3},
          {"\xf0\x9f\x98\x80", json::array{json::object{{"b", true}, {"a", false}}, nullptr}},
          {"\xef\xbf\xbf", 4},  // U+FFFF sorts before U+1F600
          {"", 5},
          {"a\n", 6},
          {"max", INT64_MAX},
          {"min", INT64_MIN},
          {"umax", UINT64_MAX},
          {"neg", -1},
          {"zero", 0},
          {"empty", json::object{}},
          {"nested", json::object{{"y", json::object{{"b", 2}, {"a", 1}}}, {"x", json::array{}}}}};
    }
    if (auto sealed = gpunode::store::seal_audit_record(r, prev); !sealed) {
      std::fprintf(stderr, "record %d: %s\n", i + 1, sealed.error().detail.c_str());
      return 1;
    }
    prev = std::string(r["hash"].get_string());
    std::printf("%s\t%s\n", prev.c_str(), json::serialize(r).c_str());
  }
  return 0;
}
