#!/usr/bin/env python3
"""Unit health end to end (CONTRACT §13): the real agent on the demo host, reporting to the fake
central API, while this test changes the host's sysfs files under it (health.interval 1s,
health.recovery 3s):
  - counts found at first sight (history since boot) never alarm;
  - a fatal error on a GPU fails its unit; one on a GPU's upstream port fails that GPU's unit:
    not sellable, not reservable, admission and the libvirt hook refuse a new start
    (`not-sellable`), the unit's reservation and its VMs' entitlement untouched;
  - non-fatal errors below the threshold warn, at it fail;
  - a counter that drops (re-enumeration) is a new baseline, and a rise over it counts;
  - a link that goes down fails its unit, and it recovers once back for health.recovery;
  - a GPU in D3cold (link 63, config all ones) is not judged; config all ones in D0, three polls
    in a row, fails it (latched);
  - a restart keeps a latched failure (same since, no new event); a clear over the admin socket
    (404 over HTTPS) is audited and answered with the unit;
  - /metrics, gpunodectl health and units; the unit.health events the central API received, in
    order, each matching the API document.

    health_test.py PATH/TO/gpunode-agent"""
import os
import subprocess
import sys
import time

sys.dont_write_bytecode = True
import lab as L  # noqa: E402
import hook_test  # noqa: E402  (its domain XML)

sys.path.insert(0, L.FIXTURES)
import mkhost  # noqa: E402

U23, U24, U43, U81, UA1 = "u-0000-23-00-0", "u-0000-24-00-0", "u-0000-43-00-0", "u-0000-81-00-0", "u-0000-a1-00-0"
HEALTH = "health:\n  interval: 1s\n  recovery: 3s\n  nonfatal_threshold: 3\n"


def body(c, lab, fc):
    root = lab.root

    def write(addr, name, text):
        """In place, as sysfs changes (mkhost.write_aer says why)."""
        with open(os.path.join(root, "sys", "bus", "pci", "devices", addr, name), "r+b") as f:
            f.truncate(0)
            f.write(text if isinstance(text, bytes) else text.encode())

    def aer(addr, **bits):
        mkhost.write_aer(root, addr, **bits)

    def units():
        r = lab.get(lab.npath("/units"), unix=True)
        assert r.status == 200, r
        return {u["id"]: u for u in r.json["units"]}

    def health(uid):
        return units()[uid]["health"]

    def codes(uid):
        return [(x["code"], x["pciAddress"]) for x in health(uid)["reasons"]]

    def wait(what, cond, timeout=15):
        ok = fc.wait_for(cond, timeout)
        c.check(what, ok, f"{cond.__name__ if hasattr(cond, '__name__') else ''}; units: "
                          f"{ {u: h['health'] for u, h in units().items()} }")
        return ok

    def read_back(addr, key, value, timeout=10):
        """Waits until a poll has read `key` of `addr` as `value` (GET /v1/admin/health)."""
        def seen():
            r = lab.get("/v1/admin/health", unix=True)
            for u in r.json["units"]:
                for d in u["devices"]:
                    if d["pciAddress"] == addr:
                        got = d["aer"].get(key) if key in ("fatal", "nonfatal", "correctable") and d["aer"] else d.get(key)
                        if got == value:
                            return True
            return False
        return fc.wait_for(seen, timeout)

    clock = [0]

    def polls_after(n):
        """Waits for n more polls: each moves a counter nothing else looks at (the correctable count of
        u-0000-e1-00-0's GPU, far too slow to warn) and waits until a poll has read it."""
        for _ in range(n):
            clock[0] += 1
            aer("0000:e1:00.0", correctable={0: clock[0]})
            if not read_back("0000:e1:00.0", "correctable", clock[0]):
                return False
        return True

    def admission(uid):
        r = lab.call("POST", lab.npath("/admission"), body={"orgId": "org-a", "tier": "on-demand", "unitIds": [uid]},
                     unix=True)
        return r.json

    # Before the agent ever saw it: UA1's GPU has counted 7 fatal errors since boot.
    aer("0000:a1:00.0", fatal={5: 7})
    lab.write_config(lab.config_text(central=lab.central_text(fc.url), health=HEALTH))
    lab.start()
    u = units()
    c.check("at start every unit is ok, counts found at first sight included",
            all(x["health"] == {"state": "ok", "reasons": []} for x in u.values()), {k: v["health"] for k, v in u.items()})
    rsv = lab.create(None, unitIds=[U24], audienceOrgIds=["org-a"], endsAt=L.rfc3339(time.time() + 86400))
    c.status("a reservation holds u-0000-24-00-0", rsv, 201)

    # --- fatal on a GPU, fatal on a GPU's upstream port ---
    aer("0000:23:00.0", fatal={5: 1})
    if wait("a fatal error on GPU 0000:23:00.0 fails u-0000-23-00-0", lambda: health(U23)["state"] == "failing"):
        u23 = units()[U23]
        c.eq("... its reason names the GPU", codes(U23), [("pcie-fatal-error", "0000:23:00.0")])
        c.check("... and the counts", "rose from 0 to 1" in u23["health"]["reasons"][0]["detail"], u23["health"])
        c.check("... not sellable, not reservable, pcie-fatal-error among notReservableReasons",
                not u23["sellable"] and not u23["reservable"]
                and [r["code"] for r in u23["notReservableReasons"]] == ["pcie-fatal-error"], u23)
    a = admission(U23)
    c.check("admission refuses a new start: not-sellable", not a["allowed"] and a["reasons"][0]["code"] == "not-sellable", a)
    xml = hook_test.domain_xml("health-vm", ("org-a", "on-demand"), ["0000:23:00.0"])
    p = subprocess.run([lab.agent, "libvirt-hook", "--config", lab.cfg, "--socket", lab.sock, "--", "health-vm",
                        "prepare", "begin", "-"], input=xml.encode(), capture_output=True, timeout=30)
    c.check("the libvirt hook refuses the start (exit 1, not-sellable)",
            p.returncode == 1 and b"u-0000-23-00-0: not-sellable" in p.stderr, (p.returncode, p.stderr))
    aer("0000:22:01.0", fatal={18: 1})
    if wait("a fatal error on the upstream port 0000:22:01.0 fails u-0000-24-00-0",
            lambda: health(U24)["state"] == "failing"):
        c.eq("... its reason names the port", codes(U24), [("pcie-fatal-error", "0000:22:01.0")])
    r = lab.get(lab.npath(f"/reservations/{rsv.json['id']}"), unix=True)
    c.check("the failing unit's reservation is untouched", r.json["state"] == "active" and r.json["version"] == 1, r)

    # --- non-fatal below and at the threshold ---
    aer("0000:81:00.0", nonfatal={14: 1})
    wait("one non-fatal error: a warning, still sellable", lambda: health(U81)["state"] == "warning"
         and units()[U81]["sellable"])
    c.eq("... pcie-nonfatal-error", codes(U81), [("pcie-nonfatal-error", "0000:81:00.0")])
    aer("0000:81:00.0", nonfatal={14: 2})
    c.check("two: read, still a warning", read_back("0000:81:00.0", "nonfatal", 2) and health(U81)["state"] == "warning",
            health(U81))
    aer("0000:81:00.0", nonfatal={14: 3})
    wait("three within 24 h (health.nonfatal_threshold 3): failing", lambda: health(U81)["state"] == "failing")
    c.eq("... pcie-uncorrectable-errors", codes(U81), [("pcie-uncorrectable-errors", "0000:81:00.0")])

    # --- a counter that drops: re-enumerated ---
    aer("0000:a1:00.0", fatal={})
    c.check("UA1's fatal count drops from 7 to 0 (re-enumerated): read, no alarm",
            read_back("0000:a1:00.0", "fatal", 0) and health(UA1)["state"] == "ok", health(UA1))
    aer("0000:a1:00.0", fatal={5: 1})
    wait("... and a rise over the new baseline fails it", lambda: health(UA1)["state"] == "failing")

    # --- a link down and back ---
    write("0000:42:08.0", "current_link_width", "0\n")
    wait("the link of port 0000:42:08.0 goes down: u-0000-43-00-0 fails (link-degraded, 3 reads)",
         lambda: codes(U43) == [("link-degraded", "0000:42:08.0")])
    write("0000:42:08.0", "current_link_width", "16\n")
    wait("back at x16 for health.recovery (3 s): ok again", lambda: health(U43)["state"] == "ok")

    # --- D3cold is not judged; all ones in D0 is ---
    write("0000:44:00.0", "power_state", "D3cold\n")
    write("0000:44:00.0", "current_link_width", "63\n")
    write("0000:44:00.0", "config", b"\xff" * 64)
    c.check("a GPU in D3cold (link 63, config all ones) for 4 polls: not judged",
            read_back("0000:44:00.0", "powerState", "D3cold") and polls_after(4) and health(U43)["state"] == "ok",
            health(U43))
    write("0000:44:00.0", "power_state", "D0\n")
    write("0000:44:00.0", "current_link_width", "16\n")
    wait("the same in D0, three polls in a row: device-unresponsive",
         lambda: codes(U43) == [("device-unresponsive", "0000:44:00.0")])
    write("0000:44:00.0", "config", b"\xde\x10\xb9\x26" + b"\x00" * 60)
    c.check("it answers again: still failing (latched)", polls_after(2) and health(U43)["state"] == "failing", health(U43))

    # --- metrics ---
    m = lab.get("/metrics", unix=True).body.decode()
    c.check("/metrics: gpunode_unit_failing of a failing and an ok unit",
            f'gpunode_unit_failing{{unit="{U24}"}} 1' in m and 'gpunode_unit_failing{unit="u-0000-e1-00-0"} 0' in m, m[-800:])
    c.check("/metrics: the port's fatal error counted under u-0000-24-00-0",
            f'gpunode_pcie_errors_total{{unit="{U24}",pci_address="0000:22:01.0",severity="fatal"}} 1' in m, m[-800:])

    # --- gpunodectl, when it is built beside the agent ---
    ctl = os.path.join(os.path.dirname(lab.agent), "gpunodectl")
    if os.access(ctl, os.X_OK):
        out = subprocess.run([ctl, "--socket", lab.sock, "health"], capture_output=True, text=True, timeout=30)
        print(out.stdout, flush=True)
        c.check("gpunodectl health: a row per function, the failing units and their reasons",
                out.returncode == 0 and "pcie-fatal-error" in out.stdout and "upstream-port" in out.stdout, out)
        tree = subprocess.run([ctl, "--socket", lab.sock, "units"], capture_output=True, text=True, timeout=30)
        c.check("gpunodectl units marks a failing unit", tree.returncode == 0 and f"{U23}  vfio-group  1 GPU  FAILING"
                in tree.stdout, tree.stdout)

    # --- a restart keeps the latched failure ---
    since = health(U23)["reasons"][0]["since"]
    before = len([e for e in fc.events.values() if e["type"] == "unit.health"])
    lab.stop()
    lab.start()
    c.check("after a restart u-0000-23-00-0 is still failing, its since unchanged",
            health(U23)["state"] == "failing" and health(U23)["reasons"][0]["since"] == since, health(U23))
    c.check("... and no unit.health event came of the restart", polls_after(2) and
            len([e for e in fc.events.values() if e["type"] == "unit.health"]) == before, before)

    # --- the clear ---
    r = lab.call("POST", f"/v1/admin/units/{U23}/health/clear", body={}, unix=True)
    c.problem("a clear without a reason: 400", r, 400, "invalid-request")
    r = lab.call("POST", f"/v1/admin/units/{U23}/health/clear", token=lab.admin(), body={"reason": "x"})
    c.problem("over HTTPS the route is none of the API's: 404", r, 404, "not-found")
    r = lab.call("POST", f"/v1/admin/units/{U23}/health/clear", body={"reason": "reseated the GPU"}, unix=True)
    c.check("the clear over the admin socket answers the unit, ok and sellable again",
            r.status == 200 and r.json["id"] == U23 and r.json["health"]["state"] == "ok" and r.json["sellable"], r)
    rec = lab.audit_all()[-1]
    c.check("... audited as unit.health-clear with the reason",
            rec["action"] == "unit.health-clear" and rec["unitIds"] == [U23] and "reseated the GPU" in rec["detail"], rec)
    c.check("... and stays ok", polls_after(2) and health(U23)["state"] == "ok", health(U23))

    # --- the events the central API received ---
    fc.wait_for(lambda: fc.acked() >= max(fc.events or [0]), 10)
    got = [(e["data"]["unitId"], e["data"]["state"], [x["code"] for x in e["data"]["reasons"]])
           for _, e in sorted(fc.events.items()) if e["type"] == "unit.health"]
    for g in got:
        print(f"# unit.health {g}", flush=True)
    want = [(U23, "failing", ["pcie-fatal-error"]), (U24, "failing", ["pcie-fatal-error"]),
            (U81, "warning", ["pcie-nonfatal-error"]), (U81, "failing", ["pcie-uncorrectable-errors"]),
            (UA1, "failing", ["pcie-fatal-error"]), (U43, "failing", ["link-degraded"]), (U43, "ok", []),
            (U43, "failing", ["device-unresponsive"]), (U23, "ok", [])]
    c.eq("the unit.health events the central API received, in order", got, want)


if __name__ == "__main__":
    sys.exit(L.run_with_central("health", body))
