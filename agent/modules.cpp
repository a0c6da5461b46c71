#include "modules.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <array>

namespace gpunode::agent {

std::string module_beside_executable(const char* module) {
  std::array<char, 4096> buf{};
  const auto n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  std::string dir =
      n > 0 ? std::string(buf.data(), static_cast<std::size_t>(n)) : std::string("/usr/bin/gpunode-agent");
  dir.erase(dir.rfind('/') + 1);  // keeps the slash
  std::string beside = dir + module;
  if (::access(beside.c_str(), R_OK) == 0) return beside;
  return dir + "../lib/gpunode-agent/" + module;
}

error::Result<std::string> module_beside(const void* symbol, const char* module) {
  Dl_info self{};
  // dladdr takes a data pointer; a function's address converts to one on every platform dlopen exists on.
  if (::dladdr(symbol, &self) == 0 || self.dli_fname == nullptr ||
      std::string(self.dli_fname).find('/') == std::string::npos) {
    return error::fail(error::Errc::not_found, std::string("cannot find ") + module +
                                                   ": the calling module does not know its own path");
  }
  std::string path = self.dli_fname;
  path.erase(path.rfind('/') + 1);
  return path + module;
}

error::Result<void*> load_entry(const std::string& path, const char* entry) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return error::fail(error::Errc::unavailable,
                       "cannot load " + path + ": " + (why != nullptr ? why : "unknown error"));
  }
  void* found = ::dlsym(handle, entry);
  if (found == nullptr) return error::fail(error::Errc::not_found, path + " has no " + entry);
  return found;
}

}  // namespace gpunode::agent
