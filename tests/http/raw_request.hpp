// The text of an HTTP/1.1 request as a client writes it, for the server's and the session's tests.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace gpunode::http::testing {

// METHOD TARGET HTTP/1.1 with Host, the `extra` header lines, and Content-Length when there is a
// body or the method is POST.
inline std::string request(std::string_view method, std::string_view target, std::string_view body = {},
                           const std::vector<std::string>& extra = {}) {
  std::string r = std::string(method) + " " + std::string(target) + " HTTP/1.1\r\nHost: test\r\n";
  for (const auto& h : extra) r += h + "\r\n";
  if (!body.empty() || method == "POST") r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  r += "\r\n";
  r += body;
  return r;
}

}  // namespace gpunode::http::testing
