// problem+json bodies, request ids, Request::header.
#include "gpunode/json/problem.hpp"

#include <fmt/format.h>
#include <openssl/rand.h>

#include <array>
#include <boost/json.hpp>
#include <random>

#include "gpunode/http/server.hpp"

namespace gpunode::http {

std::optional<std::string_view> Request::header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return std::string_view{value};
  }
  return std::nullopt;
}

Response problem(unsigned status, std::string_view code, std::string_view title, std::string_view detail,
                 const std::vector<FieldError>& errors) {
  Response r;
  r.status = status;
  r.headers.emplace_back("Content-Type", "application/problem+json");
  r.body = boost::json::serialize(gpunode::json::problem_body(status, code, title, detail, errors));
  return r;
}

bool sane_request_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// A UUID in version 4's layout from a per-thread generator seeded once from OpenSSL's randomness
// (the kernel's): no system call and no formatting library per request. Unique, not secret.
std::string generate_request_id() {
  thread_local std::mt19937_64 rng = [] {
    std::array<std::uint32_t, 8> seed{};
    if (RAND_bytes(reinterpret_cast<unsigned char*>(seed.data()), static_cast<int>(sizeof seed)) != 1) {
      std::random_device dev;
      for (auto& x : seed) x = dev();
    }
    std::seed_seq seq(seed.begin(), seed.end());
    return std::mt19937_64(seq);
  }();
  std::array<unsigned char, 16> b{};
  for (std::size_t half = 0; half < 2; ++half) {
    const std::uint64_t v = rng();
    for (std::size_t i = 0; i < 8; ++i) b[half * 8 + i] = static_cast<unsigned char>(v >> (8 * i));
  }
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);  // variant 10
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(36);
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s.push_back('-');
    s.push_back(kHex[b[i] >> 4]);
    s.push_back(kHex[b[i] & 0x0f]);
  }
  return s;
}

}  // namespace gpunode::http
