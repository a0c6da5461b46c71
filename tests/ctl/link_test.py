#!/usr/bin/env python3
"""gpunodectl starts fast: it needs none of the agent's heavy libraries (libvirt, libpci, yaml-cpp,
OpenSSL, SQLite), neither directly (its ELF NEEDED entries) nor through another library (ldd).

    link_test.py PATH/TO/gpunodectl"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))
sys.dont_write_bytecode = True
from checks import Checks  # noqa: E402

CTL = sys.argv[1]
FORBIDDEN = ("libvirt", "libpci", "libssl", "libcrypto", "libsqlite3", "libsystemd")
check = Checks()

needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]",
                    subprocess.run(["readelf", "-d", CTL], capture_output=True, text=True, check=True).stdout)
check("readelf lists NEEDED entries", bool(needed), needed)
mapped = [line.split()[0] for line in
          subprocess.run(["ldd", CTL], capture_output=True, text=True, check=True).stdout.splitlines() if line.strip()]
print("# NEEDED: " + ", ".join(needed))
print("# ldd: " + ", ".join(mapped))
for lib in FORBIDDEN:
    check(f"no {lib} in NEEDED", not any(n.startswith(lib) for n in needed), needed)
    check(f"no {lib} in ldd", not any(os.path.basename(m).startswith(lib) for m in mapped), mapped)
check.finish()
