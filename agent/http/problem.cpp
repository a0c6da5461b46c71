// problem+json bodies, request ids, Request::header.
#include <openssl/rand.h>

#include <array>
#include <boost/json.hpp>
#include <fmt/format.h>
#include <random>

#include "gpunode/http/server.hpp"
#include "gpunode/json/problem.hpp"

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

std::string generate_request_id() {
  std::array<unsigned char, 16> b{};
  if (RAND_bytes(b.data(), static_cast<int>(b.size())) != 1) {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    for (auto& x : b) x = static_cast<unsigned char>(rng());
  }
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);  // variant 10
  std::string s;
  s.reserve(36);
  for (std::size_t i = 0; i < b.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s.push_back('-');
    s += fmt::format("{:02x}", b[i]);
  }
  return s;
}

}  // namespace gpunode::http
