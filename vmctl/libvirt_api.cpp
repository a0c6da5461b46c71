// libvirt's C API loaded at run time (see libvirt_api.hpp).
#include "libvirt_api.hpp"

#include <dlfcn.h>

namespace gpunode::vmctl::detail {
namespace {

constexpr const char* kLibrary = "libvirt.so.0";  // the soname: what Debian's libvirt0 ships

error::Result<LibvirtApi> load() {
  void* library = nullptr;  // opened only if the process does not hold libvirt already; never closed
  auto find = [&](const char* name) -> void* {
    if (void* in_process = ::dlsym(RTLD_DEFAULT, name)) return in_process;
    if (library == nullptr) library = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    return library == nullptr ? nullptr : ::dlsym(library, name);
  };
  LibvirtApi api;
#define GPUNODE_LIBVIRT_LOAD(name)                                                                      \
  api.name = reinterpret_cast<decltype(api.name)>(find(#name));                                         \
  if (api.name == nullptr) {                                                                            \
    const char* why = ::dlerror();                                                                      \
    return error::fail(error::Errc::unavailable,                                                        \
                       std::string("libvirt: cannot load ") + (library == nullptr ? kLibrary : #name) + \
                           (why != nullptr ? std::string(": ") + why : std::string()));                 \
  }
  GPUNODE_LIBVIRT_FUNCTIONS(GPUNODE_LIBVIRT_LOAD)
#undef GPUNODE_LIBVIRT_LOAD
  return api;
}

}  // namespace

const error::Result<LibvirtApi>& libvirt_api() {
  static const auto api = load();  // C++ guarantees one initialisation, even from several threads
  return api;
}

}  // namespace gpunode::vmctl::detail
