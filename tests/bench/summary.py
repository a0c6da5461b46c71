#!/usr/bin/env python3
"""The one table of `make bench`: every headline figure beside its anchor, measured in the same run.

Each benchmark prints its headline figures as lines

    SUMMARY {"figure": ..., "gpunode": "...", "anchor": "...", "ratio": 0.42, "target": "≥ 0.8", "met": true}

(summary.row() writes one from Python; the C++ benchmarks print the same JSON). run.sh keeps
everything the benchmarks print and ends with

    python3 tests/bench/summary.py LOG

which prints those rows as one table. A figure whose anchor could not run has no ratio and says why.
"""
import json
import sys

PREFIX = "SUMMARY "


def row(figure, gpunode, anchor="", ratio=None, target="", met=None):
    """Prints one summary line (see the module's text); `ratio` is gpunode against the anchor."""
    print(PREFIX + json.dumps({"figure": figure, "gpunode": gpunode, "anchor": anchor, "ratio": ratio,
                               "target": target, "met": met}, ensure_ascii=False), flush=True)


def table(lines):
    rows = []
    for line in lines:
        if not line.startswith(PREFIX):
            continue
        try:
            rows.append(json.loads(line[len(PREFIX):]))
        except json.JSONDecodeError as e:
            rows.append({"figure": f"(unreadable summary line: {e})", "gpunode": line.strip()[:60]})
    head = ("figure", "gpunode", "anchor, same run", "ratio", "target", "met")
    cells = [head]
    for r in rows:
        ratio = r.get("ratio")
        met = r.get("met")
        cells.append((r.get("figure", ""), r.get("gpunode", ""), r.get("anchor", ""),
                      "" if ratio is None else f"{ratio:.2f}", r.get("target", ""),
                      "" if met is None else ("yes" if met else "NO")))
    widths = [max(len(str(c[i])) for c in cells) for i in range(len(head))]
    out = []
    for n, c in enumerate(cells):
        out.append("| " + " | ".join(str(v).ljust(w) for v, w in zip(c, widths)) + " |")
        if n == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def main(argv):
    if len(argv) != 2:
        print(f"usage: {argv[0]} LOG", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8", errors="replace") as f:
        print(table(f.readlines()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
