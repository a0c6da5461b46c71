// gpunode/daemon/config_files.hpp: the files a configuration names, opened as the agent would open
// them (`check-config --files`, the start, a reload; CONTRACT §11 "Checking the files").
//
// The check runs as whoever calls it: the postinst and the README run `check-config --files` as
// the service's user, so that a key only root can read fails there and not at the start.
#pragma once

#include <string>
#include <vector>

#include "gpunode/config/config.hpp"

namespace gpunode::daemon {

// Each file of `loaded.files` the calling process cannot use, as a Problem of `config_file` at the
// value's position, its message "PATH: why":
// - missing, not a regular file (or a directory, for state.dir), permission denied (naming the
//   user the check runs as);
// - a TLS certificate, key or CA file that is not PEM of that kind; a private key that does not
//   belong to its certificate; an auth.keys file that holds no Ed25519 or P-256 public key;
// - a state.dir that exists but cannot be written (a missing one is the unit's StateDirectory= to
//   make); a discovery.host_root without sys/bus/pci.
// Empty when every file is usable.
std::vector<config::Problem> check_named_files(const config::LoadResult& loaded,
                                               const std::string& config_file);

}  // namespace gpunode::daemon
