#!/usr/bin/env bash
# Installs, by Debian package name, everything gpunode needs to build, test and run its demo;
# `install-deps.sh bench` also what `make bench` sets beside the agent (nginx). Idempotent: installs
# only what is missing. Run as root on Debian 12 (bookworm).
set -euo pipefail

PACKAGES=(
  # toolchain (clang-format: make format and the check in .ci/run)
  build-essential cmake ninja-build pkg-config clang-format
  # design-card libraries
  libpci-dev pciutils pci.ids
  libvirt-dev libvirt-clients libxml2-dev
  libboost1.81-dev libboost-json1.81-dev libboost-url1.81-dev
  libyaml-cpp-dev libfmt-dev doctest-dev libcli11-dev
  # storage, crypto, service integration
  libsqlite3-dev libssl-dev openssl
  # the asan preset's compiler and the fuzzers (tests/fuzz): clang-16 with its sanitizer runtimes
  # and libFuzzer. Not the clang-14 Debian defaults to: it cannot compile libstdc++ 12's
  # std::expected (conditionally trivial destructors, P0848, came in clang 16).
  clang-16 libclang-rt-16-dev libfuzzer-16-dev
  # tests and tools (the integration tests check every answer against docs/openapi.yaml with
  # python3-jsonschema, JSON Schema 2020-12, and python3-yaml)
  python3 python3-jsonschema python3-yaml curl
  # the Debian package (tests/packaging): cpack's dpkg-shlibdeps (dpkg-dev), lintian, the maintainer
  # scripts' systemd-sysusers, systemd-tmpfiles and deb-systemd-helper (systemd,
  # init-system-helpers: only the tools; nothing is started), systemd-analyze verify and security
  # (systemd), man --warnings for the manual pages (man-db, groff-base)
  dpkg-dev lintian systemd init-system-helpers man-db groff-base
  # tests/packaging/systemd_test.py: the package under a real systemd in a booted Debian 12 container
  # (systemd-nspawn from systemd-container; its root built by mmdebstrap and cached)
  systemd-container mmdebstrap
  # tests/integration/metrics_test.py: `promtool check metrics` on /metrics. Debian ships promtool
  # only in the server's package; on a host that runs systemd it also enables a Prometheus server
  # on :9090 (`systemctl disable --now prometheus` on a test machine that does not want it).
  prometheus
  # tests/integration/libvirtd_test.py: a private libvirtd (libvirt-daemon) with its QEMU driver
  # (libvirt-daemon-driver-qemu) and the emulator (qemu-system-x86, which brings SeaBIOS). Not
  # libvirt-daemon-system: it wants systemd and installs and starts the host's own libvirtd.
  libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86
)

# make bench: the anchors the benchmarks measure beside the agent. lspci (pciutils), virsh
# (libvirt-clients) and SQLite are above already; nginx serves the same bytes as GET units; an
# unscraped prometheus-node-exporter is the idle agent's anchor; valgrind counts both servers'
# instructions per request (api_instructions.py).
if [ "${1:-}" = bench ]; then
  PACKAGES+=(nginx-light prometheus-node-exporter valgrind)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root (or install them) to continue" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
