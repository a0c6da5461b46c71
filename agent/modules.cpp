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

error::Result<LoadedEntry> open_entry(const std::string& path, const char* entry) {
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return error::fail(error::Errc::unavailable,
                       "cannot load " + path + ": " + (why != nullptr ? why : "unknown error"));
  }
  void* found = ::dlsym(handle, entry);
  if (found == nullptr) {
    ::dlclose(handle);
    return error::fail(error::Errc::not_found, path + " has no " + entry);
  }
  return LoadedEntry{handle, found};
}

error::Result<void*> load_entry(const std::string& path, const char* entry) {
  auto found = open_entry(path, entry);
  if (!found) return std::unexpected(std::move(found.error()));
  return found->entry;
}

}  // namespace gpunode::agent
