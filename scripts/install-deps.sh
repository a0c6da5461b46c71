#!/usr/bin/env bash
# Installs, by Debian package name, what gpunode needs. Idempotent: installs only what is missing.
# Run as root on Debian 12 (bookworm) or Debian 13 (trixie): the few packages whose names differ
# between the two (Boost's versioned packages, the clang that builds the sanitizers and fuzzers)
# are chosen by the release /etc/os-release names.
#
#   install-deps.sh           everything to build, test and run the demo (make test, make demo, CI)
#   install-deps.sh bench     that and what `make bench` sets beside the agent (nginx)
#   install-deps.sh package   what builds the release preset and runs tests/packaging's checks of
#                             the package (contents, lintian, install): `make packages` installs
#                             this in the build root of each other release (scripts/packages.py)
set -euo pipefail

mode=${1:-all}
case "$mode" in
all | bench | package) ;;
*)
  echo "install-deps: unknown mode '$mode' (want: nothing, bench or package)" >&2
  exit 2
  ;;
esac

release=$(. /etc/os-release && echo "${ID:-}:${VERSION_CODENAME:-}")
case "$release" in
debian:bookworm)
  boost=1.81
  # The asan preset's compiler: clang-16, not the clang-14 Debian 12 defaults to, which cannot
  # compile libstdc++ 12's std::expected (conditionally trivial destructors, P0848, came in clang 16).
  clang=16
  ;;
debian:trixie)
  boost=1.83
  clang=19
  ;;
*)
  echo "install-deps: gpunode builds on Debian 12 (bookworm) or 13 (trixie); /etc/os-release says" \
    "$(. /etc/os-release && echo "${PRETTY_NAME:-$release}")" >&2
  exit 1
  ;;
esac

BUILD=(
  # toolchain
  build-essential cmake ninja-build pkg-config
  # design-card libraries
  libpci-dev pciutils pci.ids
  libvirt-dev libxml2-dev
  "libboost$boost-dev" "libboost-json$boost-dev" "libboost-url$boost-dev"
  libyaml-cpp-dev libfmt-dev doctest-dev libcli11-dev
  # storage, crypto, service integration
  libsqlite3-dev libssl-dev openssl
  # the tests' Python (the integration tests check every answer against docs/openapi.yaml with
  # python3-jsonschema, JSON Schema 2020-12, and python3-yaml)
  python3 python3-jsonschema python3-yaml
  # the Debian package (tests/packaging): cpack's dpkg-shlibdeps (dpkg-dev), lintian, the maintainer
  # scripts' systemd-sysusers, systemd-tmpfiles and deb-systemd-helper (systemd,
  # init-system-helpers: only the tools; nothing is started), systemd-analyze verify and security
  # (systemd), man --warnings for the manual pages (man-db, groff-base)
  dpkg-dev lintian systemd init-system-helpers man-db groff-base
  # package.contents runs `promtool test rules` on the shipped alert rules, and
  # tests/integration/metrics_test.py `promtool check metrics` on /metrics. Debian ships promtool
  # only in the server's package; on a host that runs systemd it also enables a Prometheus server
  # on :9090 (`systemctl disable --now prometheus` on a test machine that does not want it).
  prometheus
)

REST=(
  # make format and the check in .ci/run
  clang-format
  # the asan preset's compiler and the fuzzers (tests/fuzz): clang with its sanitizer runtimes and
  # libFuzzer (the version chosen above)
  "clang-$clang" "libclang-rt-$clang-dev" "libfuzzer-$clang-dev"
  # tests and tools
  libvirt-clients curl
  # tests/packaging/systemd_test.py and make packages: the package under a real systemd in a booted
  # Debian container, the other release's package built in one (systemd-nspawn from
  # systemd-container; their roots built by mmdebstrap and cached)
  systemd-container mmdebstrap
  # make repo: the signed apt repository (reprepro; gpg makes the key for the purpose and exports
  # its public half, gpgv checks the signatures as apt will)
  reprepro gnupg gpgv
  # tests/integration/libvirtd_test.py: a private libvirtd (libvirt-daemon) with its QEMU driver
  # (libvirt-daemon-driver-qemu) and the emulator (qemu-system-x86, which brings SeaBIOS). Not
  # libvirt-daemon-system: it wants systemd and installs and starts the host's own libvirtd.
  libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86
)

PACKAGES=("${BUILD[@]}")
if [ "$mode" != package ]; then
  PACKAGES+=("${REST[@]}")
fi
# make bench: the anchors the benchmarks measure beside the agent. lspci (pciutils), virsh
# (libvirt-clients) and SQLite are above already; nginx serves the same bytes as GET units; an
# unscraped prometheus-node-exporter is the idle agent's anchor; valgrind counts both servers'
# instructions per request (api_instructions.py).
if [ "$mode" = bench ]; then
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
