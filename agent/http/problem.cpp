// Request ids.
#include "gpunode/json/problem.hpp"

#include <fmt/format.h>
#include <openssl/rand.h>

#include <array>
#include <boost/json.hpp>
#include <boost/uuid/random_generator.hpp>
#include <boost/uuid/uuid_io.hpp>
#include <random>

#include "gpunode/http/server.hpp"

namespace gpunode::http {

bool sane_request_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// A version 4 UUID (Boost.UUID) from a per-thread generator seeded once from OpenSSL's randomness
// (the kernel's): no system call per request. Unique, not secret.
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
  thread_local boost::uuids::basic_random_generator<std::mt19937_64> generate(&rng);
  return boost::uuids::to_string(generate());
}

}  // namespace gpunode::http
