#!/usr/bin/env bash
# make demo: the agent on the bundled demo host (tests/fixtures/hosts/demo_node.py: an 8-GPU
# server with a mix of classes), with a self-signed TLS certificate, a demo token issuer and a
# throwaway state directory under build/demo. Prints how to call it, then runs it (Ctrl-C stops).
# While a demo agent runs (it holds build/demo/state/lock), a second `make demo` refuses and deletes
# nothing.
set -euo pipefail
agent=$(cd "$(dirname "${1:?usage: demo.sh PATH/TO/gpunode-agent}")" && pwd)/$(basename "$1")
top=$(cd "$(dirname "$0")/.." && pwd)
demo="$top/build/demo"
port=${DEMO_PORT:-8443}
node=demo-node
state="$demo/state"

# One agent per state directory (CONTRACT §7): a demo agent that is still running holds an flock
# on $state/lock (with its pid in the file) and answers on $demo/admin.sock. Its state is live:
# refuse, deleting nothing, and say how to stop it.
refuse_if_running() {
  local why="" rc=0 pid="" running_port=""
  if [[ -e "$state/lock" ]]; then
    flock --nonblock --conflict-exit-code 75 "$state/lock" true 2>/dev/null || rc=$?
    case $rc in
      0) ;;
      75) why="an agent holds $state/lock"
          pid=$(head -c 32 "$state/lock" | tr -dc 0-9) ;;
      *) why="cannot check the lock $state/lock (flock exit $rc)" ;;
    esac
  fi
  if [[ -z $why && -S "$demo/admin.sock" ]] &&
    python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' "$demo/admin.sock" 2>/dev/null; then
    why="an agent answers on $demo/admin.sock"
  fi
  [[ -z $why ]] && return 0
  [[ -r "$demo/agent.yaml" ]] && running_port=$(sed -n 's/^  listen: "127\.0\.0\.1:\([0-9]*\)"$/\1/p' "$demo/agent.yaml")
  {
    echo "make demo: the demo's state directory $state is in use: $why."
    echo "  That agent${pid:+ (pid $pid)} serves https://127.0.0.1:${running_port:-?} and $demo/admin.sock;"
    echo "  starting again would delete its live state, so nothing was touched."
    echo "  Stop it first (Ctrl-C in its terminal${pid:+, or: kill $pid}), then run make demo again."
  } >&2
  exit 1
}
refuse_if_running

rm -rf "$demo"
mkdir -p "$demo"
python3 "$top/tests/fixtures/mkhost.py" "$top/tests/fixtures/hosts/demo_node.py" "$demo/host" >/dev/null
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 7 -subj /CN=localhost \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -keyout "$demo/tls.key" -out "$demo/tls.crt" 2>/dev/null
openssl genpkey -algorithm ed25519 -out "$demo/issuer.pem" 2>/dev/null
openssl pkey -in "$demo/issuer.pem" -pubout -out "$demo/issuer.pub" 2>/dev/null
cat > "$demo/agent.yaml" <<YAML
node:
  id: $node
  owner_org: org-demo-owner
discovery:
  host_root: $demo/host
  rescan_interval: 30s
api:
  listen: "127.0.0.1:$port"
  tls: {cert: $demo/tls.crt, key: $demo/tls.key}
auth:
  issuer: https://central.demo.invalid
  audience: gpunode
  keys: [$demo/issuer.pub]
admin:
  socket: $demo/admin.sock
  allowed_uids: [$(id -u)]
libvirt:
  uri: test://$top/tests/fixtures/libvirt/demo_node.xml
health:
  interval: 5s
state:
  dir: $state
YAML
"$agent" check-config --config "$demo/agent.yaml" >/dev/null

echo "== gpunode demo: node $node on https://127.0.0.1:$port =="
"$agent" discover --config "$demo/agent.yaml"
ends=$(date -u -d '+30 days' +%Y-%m-%dT%H:%M:%SZ)
# gpunodectl is built beside the agent; printed relative to the checkout when it is in it.
ctl=$(dirname "$agent")/gpunodectl
ctl=${ctl#"$top"/}
cat <<TXT

The agent starts below (Ctrl-C stops it; its state is thrown away with build/demo). In another
terminal, from $top:

  # tokens for each role (EdDSA JWTs from the demo issuer, valid one hour)
  ADMIN=\$(scripts/demo-token --org org-platform --role platform-admin)
  OPER=\$(scripts/demo-token --org org-platform --role platform-operator)
  OWNER=\$(scripts/demo-token --org org-demo-owner)
  ACME=\$(scripts/demo-token --org org-acme)
  OUTSIDER=\$(scripts/demo-token --org org-outsider)
  api() { tok=\$1; shift; curl -s --cacert build/demo/tls.crt -H "Authorization: Bearer \$tok" "\$@"; echo; }
  N=https://127.0.0.1:$port/v1/nodes/$node

  # the node's units and the VMs on them (libvirt's test driver) as the owner
  api \$OWNER \$N/units
  api \$OWNER \$N/workloads

  # reserve two units for org-acme (which also manages the reservation) as the platform admin:
  # the spot VM on u-0000-23-00-0 is allowed (listed in spotWorkloads), org-acme's own VM on
  # u-0000-43-00-0 too; u-0000-24-00-0 would be refused (409 unit-not-reservable: it is failing, below)
  api \$ADMIN -X POST \$N/reservations -H 'Content-Type: application/json' \\
      -d '{"unitIds": ["u-0000-23-00-0", "u-0000-43-00-0"], "audienceOrgIds": ["org-acme"], "managingOrgIds": ["org-acme"], "endsAt": "$ends"}'

  # org-acme sees its reservation and its reserved capacity; an outsider gets 404, as for a node that does not exist
  api \$ACME \$N/reservations
  api \$ACME https://127.0.0.1:$port/v1/orgs/org-acme/reserved-capacity
  api \$OUTSIDER \$N/units -i

  # the spot market: org-acme lends u-0000-23-00-0 to spot (any org may now place spot VMs
  # there), then takes it back, terminating the spot VM on it (capacity reclaim, audited)
  RID=\$(api \$ACME \$N/reservations | python3 -c 'import json, sys; print(json.load(sys.stdin)["reservations"][0]["id"])')
  api \$ACME -X POST \$N/reservations/\$RID/release -H 'Content-Type: application/json' -d '{"unitIds": ["u-0000-23-00-0"]}'
  api \$OPER "\$N/capacity?org=org-outsider"
  api \$ACME -X POST \$N/reservations/\$RID/reclaim -H 'Content-Type: application/json' \\
      -d '{"unitIds": ["u-0000-23-00-0"], "terminateSpot": true}'
  api \$OWNER \$N/workloads

  # operators: the admin socket needs no token, and the audit log is hash-chained
  curl -s --unix-socket build/demo/admin.sock http://localhost/v1/nodes/$node/audit; echo

  # operators, with gpunodectl over the admin socket (the node id comes from the agent;
  # --json prints a route's body exactly; exit 1 a problem, 2 usage, 3 the socket)
  ctl() { $ctl --socket build/demo/admin.sock "\$@"; }
  ctl status                                   # the node at a glance
  ctl units                                    # the node as a tree: NUMA node, unit, devices, reservations, VMs
  ctl reserve --units u-0000-81-00-0,u-0000-a1-00-0 --audience org-acme --starts +7d --ends +21d --note "H100s for a training run"
  ctl timeline                                 # reservations per unit over the coming weeks
  ctl reservations
  ctl workloads
  ctl audit --limit 5
  ctl --json units | python3 -m json.tool | head -20

  # unit health: a few seconds after start the demo makes u-0000-24-00-0's GPU throw a fatal PCIe
  # error (its AER counter in build/demo/host rises): the unit is failing, no longer sold, and
  # new starts on it are refused; its running VM (legacy-vm) is left alone
  ctl health                                   # each unit's state, reasons and links
  ctl units                                    # u-0000-24-00-0 is marked FAILING
  ctl capacity org-acme                        # it is not offered
  ctl health clear u-0000-24-00-0 --reason "reseated the GPU"   # audited; sold again
  # another one, by hand: python3 -B -c 'import sys; sys.path.insert(0, "tests/fixtures"); import mkhost;
  #   mkhost.write_aer("build/demo/host", "0000:23:00.0", fatal={5: 1})'

TXT
# Unit health (CONTRACT §13): once the agent answers (its first poll took the counters it found as
# the baseline), the demo raises the fatal AER count of u-0000-24-00-0's GPU; the next poll (5 s)
# finds it failing. The shell's pid becomes the agent's: when it is gone, so is this.
inject_fatal_error() {
  local i
  for i in $(seq 150); do
    kill -0 "$1" 2>/dev/null || return 0
    if python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' "$demo/admin.sock"; then
      python3 -B -c 'import sys; sys.path.insert(0, sys.argv[1]); import mkhost; mkhost.write_aer(sys.argv[2], "0000:24:00.0", fatal={5: 1})' \
        "$top/tests/fixtures" "$demo/host"
      return 0
    fi
    sleep 0.2
  done
}
inject_fatal_error $$ </dev/null >/dev/null 2>&1 &
exec "$agent" run --config "$demo/agent.yaml"
