// Loading gpunode-agent's modules (module_abi.hpp says why the commands live in modules and what
// crosses into them).
//
// Always by full path, never by a bare name left to dlopen's search: that search reads the
// RUNPATH of dlopen's caller, which under the sanitizers is their interceptor, not the agent. The
// modules are found beside the executable (the build tree) or in the package's private
// directory (/usr/bin/../lib/gpunode-agent).
#pragma once

#include <string>

#include "gpunode/error/error.hpp"

namespace gpunode::agent {

// Where `module` is for the executable: beside /proc/self/exe, else ../lib/gpunode-agent/ from it.
std::string module_beside_executable(const char* module);

// A module's entry, and the module's handle (for dlclose).
struct LoadedEntry {
  void* module = nullptr;
  void* entry = nullptr;
};

// Loads the module at `path` (RTLD_NOW, RTLD_LOCAL) and finds `entry` in it. The error names both
// and says why: a module that cannot be loaded is unavailable, one without `entry` not_found.
// (Made with error.hpp's inline parts alone: gpunode-agent links no library for it.)
error::Result<LoadedEntry> open_entry(const std::string& path, const char* entry);

// open_entry's entry alone, for a module never closed: the process ends with its command.
error::Result<void*> load_entry(const std::string& path, const char* entry);

}  // namespace gpunode::agent
