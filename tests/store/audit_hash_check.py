#!/usr/bin/env python3
"""The audit hash as CONTRACT §4 defines it, computed by Python itself, to check the C++ one.

  audit_hash_check.py < records.jsonl
      one JSON record per line on stdin; prints its hash per line (the record's "hash" key, if
      any, is left out, as the contract says).
  audit_hash_check.py --compare EMITTER
      runs EMITTER, which prints lines "HASH<TAB>RECORD-JSON" (tests/store/audit_hash_emit.cpp),
      and checks every HASH against Python's; exits 1 naming each record that differs.
"""
import hashlib
import json
import subprocess
import sys

MIN_RECORDS = 50


def canonical(record):
    r = {k: v for k, v in record.items() if k != "hash"}
    return json.dumps(r, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def audit_hash(record):
    return hashlib.sha256(canonical(record).encode("utf-8")).hexdigest()


def hash_stdin():
    for line in sys.stdin:
        if line.strip():
            print(audit_hash(json.loads(line)))
    return 0


def compare(emitter):
    proc = subprocess.run([emitter], capture_output=True, check=False)
    if proc.returncode != 0:
        print(f"{emitter} exited {proc.returncode}: {proc.stderr.decode(errors='replace')}", file=sys.stderr)
        return 1
    lines = [l for l in proc.stdout.decode("utf-8").split("\n") if l]
    bad = 0
    prev = "0" * 64
    for n, line in enumerate(lines, 1):
        cpp_hash, _, text = line.partition("\t")
        record = json.loads(text)
        py_hash = audit_hash(record)
        if cpp_hash != py_hash:
            bad += 1
            print(f"record {n} ({record.get('id')}): C++ {cpp_hash} != Python {py_hash}\n"
                  f"  Python's canonical form: {canonical(record)!r}", file=sys.stderr)
        if record.get("hash") is not None and record["hash"] != cpp_hash:
            bad += 1
            print(f"record {n}: its \"hash\" key {record['hash']} is not the hash emitted beside it", file=sys.stderr)
        if "prevHash" in record and str(record.get("id", "")).startswith("aud_"):
            if record["prevHash"] != prev:
                bad += 1
                print(f"record {n}: prevHash is not the previous chained record's hash", file=sys.stderr)
            prev = py_hash
    if len(lines) < MIN_RECORDS:
        print(f"only {len(lines)} records emitted, expected at least {MIN_RECORDS}", file=sys.stderr)
        return 1
    if bad:
        print(f"{bad} problem(s) in {len(lines)} records", file=sys.stderr)
        return 1
    print(f"{len(lines)} records: C++ and Python hashes agree")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2]))
    if len(sys.argv) == 1:
        sys.exit(hash_stdin())
    print(__doc__, file=sys.stderr)
    sys.exit(2)
