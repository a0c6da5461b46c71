#!/usr/bin/env python3
"""Captures state.json: GET .../state of the demo host (demo_node.py, libvirt's test driver with
demo_node.xml) after gpunodectl made the reservations below; prints the capture's time, which
render_test.cpp takes as `now`.

    capture.py PATH/TO/gpunodectl PATH/TO/gpunode-agent > state.json"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "integration"))
sys.dont_write_bytecode = True
import lab as L  # noqa: E402

CTL, AGENT = map(os.path.abspath, sys.argv[1:3])
XML = os.path.join(L.FIXTURES, "libvirt", "demo_node.xml")

with L.Lab(AGENT) as lab:
    lab.write_config(lab.config_text().replace("uri: test:///default", f"uri: test://{XML}").replace(L.NODE, "demo-node"))
    lab.start()

    def ctl(*args):
        return json.loads(subprocess.run([CTL, "--socket", lab.sock, "--json", *args], check=True, capture_output=True, text=True).stdout)

    a = ctl("reserve", "--units", "u-0000-23-00-0,u-0000-43-00-0", "--audience", "org-acme", "--managers", "org-acme", "--ends", "+30d",
            "--note", "inference fleet")
    ctl("release", a["id"], "--units", "u-0000-23-00-0")
    ctl("reserve", "--units", "u-0000-81-00-0,u-0000-a1-00-0", "--audience", "org-acme", "--starts", "+7d", "--ends", "+21d",
        "--note", "H100s for a training run")
    ctl("reserve", "--units", "u-0000-24-00-0", "--audience", "org-b,org-c", "--managers", "org-b", "--starts", "+10d", "--ends", "+40d")
    gone = ctl("reserve", "--units", "u-0000-24-00-0", "--audience", "org-d", "--starts", "+1d", "--ends", "+3d")
    ctl("end", gone["id"])
    print(f"captured at {L.rfc3339(time.time())}", file=sys.stderr)
    print(json.dumps(lab.get(lab.npath("/state", node="demo-node"), unix=True).json, indent=1))
    lab.stop()
