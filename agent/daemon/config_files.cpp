#include "gpunode/daemon/config_files.hpp"

#include <fmt/format.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <system_error>
#include <tuple>

#include "gpunode/auth/token_verifier.hpp"
#include "gpunode/discovery/host_root.hpp"
#include "gpunode/error/error.hpp"
#include "gpunode/http/tls_files.hpp"

namespace gpunode::daemon {
namespace {

using Kind = config::NamedFile::Kind;

// "gpunode (uid 999)": who the check runs as, for a permission problem.
std::string who_am_i() {
  const uid_t uid = ::geteuid();
  passwd pw{};
  passwd* found = nullptr;
  std::array<char, 4096> buf{};
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr)
    return fmt::format("{} (uid {})", pw.pw_name, uid);
  return fmt::format("uid {}", uid);
}

// The errno's Error, in the words check-config has always used: "missing", who may not read it.
std::unexpected<error::Error> system_reason(int err) {
  if (err == ENOENT || err == ENOTDIR) return std::unexpected(error::os_error(err, "missing"));
  if (err == EACCES || err == EPERM)
    return std::unexpected(
        error::os_error(err, fmt::format("permission denied: {} cannot read it", who_am_i())));
  return std::unexpected(error::os_error(err, std::generic_category().message(err)));
}

// A regular file this process can open for reading.
error::Result<void> readable_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return system_reason(errno);
  if (!S_ISREG(st.st_mode))
    return error::fail(error::Errc::invalid,
                       S_ISDIR(st.st_mode) ? "a directory, not a file" : "not a regular file");
  if (::access(path.c_str(), R_OK) != 0) return system_reason(errno);
  return {};
}

error::Result<void> usable_state_directory(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return {};  // made at the start (the unit's StateDirectory=, or the agent)
    return system_reason(errno);
  }
  if (!S_ISDIR(st.st_mode)) return error::fail(error::Errc::invalid, "not a directory");
  if (::access(path.c_str(), R_OK | W_OK | X_OK) != 0) {
    const int err = errno;
    if (err == EACCES || err == EPERM)
      return std::unexpected(
          error::os_error(err, fmt::format("permission denied: {} cannot write in it", who_am_i())));
    return std::unexpected(error::os_error(err, std::generic_category().message(err)));
  }
  return {};
}

// What the agent would make of the file, as the agent loads it.
error::Result<void> usable(const config::NamedFile& f, const std::string& issuer,
                           const std::string& audience) {
  switch (f.kind) {
    case Kind::state_directory:
      return usable_state_directory(f.path);
    case Kind::host_root:
      return discovery::check_host_root(f.path);
    case Kind::certificate_chain:
    case Kind::private_key:
    case Kind::ca_certificates: {
      if (auto r = readable_file(f.path); !r) return r;
      const auto kind = f.kind == Kind::certificate_chain ? http::TlsFileKind::certificate_chain
                        : f.kind == Kind::private_key     ? http::TlsFileKind::private_key
                                                          : http::TlsFileKind::ca_certificates;
      return http::check_tls_file(f.path, kind);
    }
    case Kind::public_keys: {
      if (auto r = readable_file(f.path); !r) return r;
      auto v =
          auth::TokenVerifier::from_files({f.path}, {issuer, audience, "node", std::chrono::seconds(60)});
      if (!v) {
        // Its errors start with the file's name: keep the reason only.
        error::Error why = std::move(v.error());
        if (why.detail.starts_with(f.path + ": ")) why.detail.erase(0, f.path.size() + 2);
        return std::unexpected(std::move(why));
      }
      return {};
    }
  }
  return {};
}

// The certificate a private key must belong to, by key.
const config::NamedFile* certificate_of(const config::NamedFile& key,
                                        const std::vector<config::NamedFile>& files) {
  const std::string cert_key = key.key == "api.tls.key"          ? "api.tls.cert"
                               : key.key == "central.client_key" ? "central.client_cert"
                                                                 : "";
  for (const auto& f : files) {
    if (f.key == cert_key) return &f;
  }
  return nullptr;
}

}  // namespace

std::vector<config::Problem> check_named_files(const config::LoadResult& loaded,
                                               const std::string& config_file) {
  std::vector<config::Problem> problems;
  std::vector<const config::NamedFile*> usable_files;
  const auto& auth = loaded.config.auth;
  for (const auto& f : loaded.files) {
    if (auto ok = usable(f, auth.issuer, auth.audience); !ok) {
      problems.push_back({config_file, f.line, f.column, fmt::format("{}: {}", f.path, ok.error().detail)});
    } else {
      usable_files.push_back(&f);
    }
  }
  const auto is_usable = [&](const config::NamedFile* f) {
    return std::find(usable_files.begin(), usable_files.end(), f) != usable_files.end();
  };
  for (const auto* key : usable_files) {
    if (key->kind != Kind::private_key) continue;
    const auto* cert = certificate_of(*key, loaded.files);
    if (cert == nullptr || !is_usable(cert)) continue;
    if (auto pair = http::check_key_pair(cert->path, key->path); !pair) {
      problems.push_back(
          {config_file, key->line, key->column, fmt::format("{}: {}", key->path, pair.error().detail)});
    }
  }
  std::stable_sort(problems.begin(), problems.end(), [](const config::Problem& a, const config::Problem& b) {
    return std::tuple(a.line == 0, a.line, a.column) < std::tuple(b.line == 0, b.line, b.column);
  });
  return problems;
}

}  // namespace gpunode::daemon
