#!/usr/bin/env bash
# make bench: builds the large synthetic host (tests/bench/large_host.py) and runs the benchmarks.
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR}
top=$(cd "$(dirname "$0")/../.." && pwd)
# The tree lives on tmpfs where there is one: like sysfs, in memory, so the figures measure
# discovery and lspci rather than the disk.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then base=$(mktemp -d /dev/shm/gpunode-bench.XXXXXX); else base=$(mktemp -d); fi
trap 'rm -rf "$base"' EXIT
root="$base/host"
python3 "$top/tests/fixtures/mkhost.py" "$top/tests/bench/large_host.py" "$root"
"$build/tests/bench/discovery_bench" "$root" "$build/gpunode-agent" "${ITERATIONS:-50}"
