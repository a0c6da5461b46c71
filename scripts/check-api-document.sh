#!/usr/bin/env bash
# docs/openapi.yaml as the scheduler teams' tools read it: Stoplight Spectral's OpenAPI rules
# (`spectral:oas`, .spectral.yaml) must find nothing, not even a hint, and Stoplight Prism's
# validator (the code its validating proxy runs on every request and answer) must find no
# violation in the integration tests' traffic. `make api-document` runs it; not part of CI (it
# needs Node.js and the npm registry).
#
#   check-api-document.sh [TRAFFIC.jsonl]
#
# The tools (@stoplight/prism-cli 5.16.0, @stoplight/spectral-cli 6.16.3) are installed with npm
# once into $GPUNODE_API_TOOLS (default /var/cache/gpunode-tests/api-tools). Without TRAFFIC, the
# integration tests run (`ctest --preset release -L integration`, the release build must exist)
# with GPUNODE_API_TRAFFIC set, lab.py appending every exchange they make to a temporary file;
# tests/integration/prism_check.js then has Prism route and validate each one.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools=${GPUNODE_API_TOOLS:-/var/cache/gpunode-tests/api-tools}
prism_version=5.16.0
spectral_version=6.16.3

command -v node >/dev/null && command -v npm >/dev/null || {
  echo "check-api-document: needs node and npm (apt-get install nodejs npm)" >&2
  exit 1
}
installed() { # PACKAGE VERSION
  [ "$(node -p "require('$tools/node_modules/$1/package.json').version" 2>/dev/null)" = "$2" ]
}
if ! installed @stoplight/prism-cli "$prism_version" || ! installed @stoplight/spectral-cli "$spectral_version"; then
  mkdir -p "$tools"
  [ -f "$tools/package.json" ] || echo '{"private": true}' >"$tools/package.json"
  echo "check-api-document: installing Prism $prism_version and Spectral $spectral_version into $tools" >&2
  npm install --prefix "$tools" --no-audit --no-fund --loglevel=error \
    "@stoplight/prism-cli@$prism_version" "@stoplight/spectral-cli@$spectral_version" >&2
fi

cd "$root"
echo "== Spectral $spectral_version (spectral:oas) on docs/openapi.yaml"
"$tools/node_modules/.bin/spectral" lint --ruleset .spectral.yaml --fail-severity=hint docs/openapi.yaml

traffic=${1:-}
if [ -z "$traffic" ]; then
  [ -x build/release/gpunode-agent ] || {
    echo "check-api-document: build/release/gpunode-agent is missing (make build)" >&2
    exit 1
  }
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  traffic=$tmp/traffic.jsonl
  : >"$traffic"
  echo "== the integration tests, every exchange recorded"
  GPUNODE_API_TRAFFIC=$traffic ctest --preset release -L integration \
    -j "${TEST_JOBS:-$(nproc)}" --output-on-failure
fi
echo "== Prism $prism_version's validator over that traffic"
NODE_PATH=$tools/node_modules node tests/integration/prism_check.js docs/openapi.yaml "$traffic"
