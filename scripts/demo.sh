#!/usr/bin/env bash
# make demo: run gpunode-agent on the bundled demo host (tests/fixtures/hosts/demo_node.py, an
# 8-GPU server with a mix of classes, written as a sysfs tree) and say what it shows.
set -euo pipefail
agent=${1:?usage: demo.sh PATH/TO/gpunode-agent}
top=$(cd "$(dirname "$0")/.." && pwd)
root="$top/build/demo-host"

rm -rf "$root"
python3 "$top/tests/fixtures/mkhost.py" "$top/tests/fixtures/hosts/demo_node.py" "$root" >/dev/null

cat <<'TXT'
== gpunode demo: discovery on the bundled demo host ==
The demo host is a Supermicro AS-4125GS-TNRT-like server with 8 GPUs, laid out as a Linux sysfs
tree under build/demo-host (the same way the tests model real machines). Discovery turns its
IOMMU groups into units:

TXT
"$agent" discover --host-root "$root"
cat <<'TXT'

What it shows:
- u-0000-23-00-0, u-0000-24-00-0: L40S on vfio-pci, each in its own IOMMU group: VM units.
- u-0000-43-00-0: two L40S behind a switch without ACS share one group: one paired unit that is
  reserved and sold whole (gpuCount 2); the switch ports in the group are bridges.
- u-0000-81-00-0, u-0000-a1-00-0: H100 PCIe on the nvidia driver: device-request units (pods).
- u-0000-c1-00-0: the RTX A6000's GPU is on vfio-pci but its audio function on snd_hda_intel:
  class none, mixed-drivers.
- u-0000-e1-00-0: the A100 has no driver: class none, driver-unbound.
- The ASPEED BMC VGA is the boot display but no GPU vendor's: it makes no unit.

The same as the API's JSON body (GET /v1/nodes/{nodeId}/units), first unit:
TXT
"$agent" discover --host-root "$root" --json | python3 -c '
import json, sys
body = json.load(sys.stdin)
print(json.dumps({"nodeId": body["nodeId"], "units": body["units"][:1]}, indent=2))
print("... and %d more units" % (len(body["units"]) - 1))'
cat <<TXT

Try it yourself:
  $agent discover --host-root $root --json
  $agent discover                      # this machine (needs a readable /sys)
  $agent check-config --config FILE    # validate an agent.yaml
TXT
