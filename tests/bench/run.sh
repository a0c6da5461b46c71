#!/usr/bin/env bash
# make bench: builds the large synthetic host (tests/bench/large_host.py) and runs the benchmarks.
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR}
top=$(cd "$(dirname "$0")/../.." && pwd)
# The tree lives on tmpfs where there is one: like sysfs, in memory, so the figures measure
# discovery and lspci rather than the disk.
if [ -d /dev/shm ] && [ -w /dev/shm ]; then base=$(mktemp -d /dev/shm/gpunode-bench.XXXXXX); else base=$(mktemp -d); fi
trap 'rm -rf "$base"' EXIT
# Everything the benchmarks print goes to the terminal and to $base/bench.log; their SUMMARY lines
# become the table at the end (tests/bench/summary.py).
exec > >(tee "$base/bench.log") 2>&1
root="$base/host"
python3 "$top/tests/fixtures/mkhost.py" "$top/tests/bench/large_host.py" "$root"
"$build/tests/bench/discovery_bench" "$root" "$build/gpunode-agent" "${ITERATIONS:-50}"
# One unit health poll (tests/bench/health_bench.cpp): on the demo host (8 GPUs, what the idle
# figure below runs with) and on the large host (64 GPUs).
echo
python3 "$top/tests/fixtures/mkhost.py" "$top/tests/fixtures/hosts/demo_node.py" "$base/demo" >/dev/null
"$build/tests/bench/health_bench" "$base/demo" "${HEALTH_ITERATIONS:-200}"
"$build/tests/bench/health_bench" "$root" "${HEALTH_ITERATIONS:-200}" | grep -v '^SUMMARY' 
# Whole processes (tests/bench/process_bench.py): `version` beside /bin/true, `discover --json`
# beside lspci on the same tree, an idle agent (the demo host's 8 GPUs, health on at its default
# 30 s) beside an idle prometheus-node-exporter.
echo
python3 "$top/tests/bench/process_bench.py" "$build" "$root"
# The API bench (tests/bench/api_bench.py): the agent's HTTPS API on loopback, a create beside a
# bare SQLite FULL-sync commit, its idle RSS, and nginx for context. Its state dir is under
# $TMPDIR (or /tmp), on a real filesystem, so that a create pays for its fsync as in production.
echo
python3 "$top/tests/bench/api_bench.py" "$build"
# The same GET units counted in instructions per request (tests/bench/api_instructions.py, under
# Valgrind's callgrind), beside nginx serving the same bytes: a figure the machine's drift does not move.
echo
python3 "$top/tests/bench/api_instructions.py" "$build"
# Hiding includes time (tests/bench/hiding_bench.py, CONTRACT §10): an outsider's GET units for
# this node beside a made-up node id, and a hidden reservation beside a missing id, 2,000 pairs each
# on one connection with 400 reservations on the node: the paired medians beside the 5 µs bound.
echo
python3 "$top/tests/bench/hiding_bench.py" "$build"
# The spot termination bench (tests/bench/terminate_bench.cpp): terminate_spot_all of 64 spot VMs
# on libvirt's test driver, beside one virsh process destroying (and writing the same metadata
# into) the same node. TERMINATE_ITERATIONS (default 20); --per-process adds 64 virsh processes.
echo
"$build/tests/bench/terminate_bench" --iterations "${TERMINATE_ITERATIONS:-20}" --steps
# The libvirt hook bench (tests/bench/hook_bench.py): an allowed start's hook beside /bin/true and
# beside a domain without hostdevs, RUNS (default 200) each, against the agent on the demo host.
echo
python3 "$top/tests/bench/hook_bench.py" "$build"
# The flood at full size (tests/integration/flood_test.py, CONTRACT §10): 10,000 idle connections
# and 1,000 stalled TLS handshakes from one address while the hook (beside /bin/true), gpunodectl
# status and a scheduler on another address are timed.
echo
FLOOD_IDLE=10000 FLOOD_HANDSHAKES=1000 FLOOD_HOOK_RUNS=200 python3 "$top/tests/integration/flood_test.py" "$build/gpunode-agent" "$build/gpunodectl"
# The reporting and polling bench (tests/bench/metrics_bench.py): a 10,000-event backlog drained to
# the fake central API (events/s, RSS while draining vs idle), and a 304 state poll beside a full one.
echo
python3 "$top/tests/bench/metrics_bench.py" "$build"
# History stays on disk (tests/bench/history_bench.py, CONTRACT §11): start-up, RSS, GET state,
# GET units and a create without history, then with 100,000 ended reservations and 1,000,000
# audit records written into the same state.db.
echo
python3 "$top/tests/bench/history_bench.py" "$build"
echo
echo "== make bench: every figure beside its anchor, this run =="
python3 "$top/tests/bench/summary.py" "$base/bench.log"
