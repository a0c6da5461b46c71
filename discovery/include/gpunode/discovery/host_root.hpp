// gpunode/discovery/host_root.hpp: is this directory a host's root? (CONTRACT §7 "The host root")
//
// Discovery reads <host_root>/sys and <host_root>/proc, and a tree it cannot list reads as a host
// without devices. A mistyped discovery.host_root (or --host-root) must never look like a host
// whose GPUs all went away (every unit `absent`), so `run` refuses to start and `discover` exits 1
// unless <host_root>/sys/bus/pci is a directory. A PCI bus with no GPU on it is fine.
#pragma once

#include <filesystem>

#include "gpunode/error/error.hpp"

namespace gpunode::discovery {

// Ok when <root>/sys/bus/pci is a directory (symlinks followed); else an error whose detail names
// that path and what is wrong with it, e.g.
//   /wrong/sys/bus/pci does not exist: is discovery.host_root (or --host-root) the host's root?
// Its code: not_found (missing), invalid (not a directory), or the errno's (cannot read it).
error::Result<void> check_host_root(const std::filesystem::path& root);

}  // namespace gpunode::discovery
