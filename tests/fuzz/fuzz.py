#!/usr/bin/env python3
"""Runs the libFuzzer targets of tests/fuzz and replays their reproducers.

  fuzz.py run BINARY --name NAME --corpus DIR [--dict FILE] --seconds N --work DIR
      Fuzzes for N seconds over a copy of the seed corpus (in WORK/corpus: the source tree is
      never written), then prints one line: executions, coverage (cov: edges, ft: features), the
      corpus size. A crash, leak, timeout or broken property fails, naming the saved input
      (WORK/crash-..., to be kept in regressions/NAME once fixed).
  fuzz.py replay BINARY PATH...
      Runs the target once on every file of each PATH (a file or a directory).
  fuzz.py all --build DIR --seconds N [--jobs J]
      `make fuzz`: every target of DIR/tests/fuzz, J at a time, and a table of the figures.
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = ["canonical_json", "token", "config", "sysfs", "domain_xml", "http_request"]
# libFuzzer options of a target beyond the common ones. The entropic schedule's bookkeeping
# (InputCorpus::UpdateFeatureFrequency, per input, growing with the features found) took half the
# time of the two targets that reach most of the agent's code: without it they ran 2-5x as many
# inputs and reached more features in the same time. The smaller targets do as well with it.
OPTIONS = {"http_request": ["-entropic=0"], "sysfs": ["-entropic=0"]}


def files_of(paths):
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(f for f in p.iterdir() if f.is_file()))
        elif p.is_file():
            out.append(p)
    return out


def sanitizer_env():
    env = dict(os.environ)
    # Leaks count as findings; abort on the first report so the input is saved.
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    # Reports with function names and lines: the clang-16 runtime does not find Debian's
    # llvm-symbolizer by itself (llvm-16 is not installed; llvm-14's reads clang-16's -g1 fine).
    for candidate in ["/usr/lib/llvm-16/bin/llvm-symbolizer", shutil.which("llvm-symbolizer-16"),
                      shutil.which("llvm-symbolizer-14"), shutil.which("llvm-symbolizer")]:
        if candidate and Path(candidate).exists():
            env.setdefault("ASAN_SYMBOLIZER_PATH", str(Path(candidate).resolve()))
            break
    return env


def run(binary, name, corpus, dictionary, seconds, work, echo=True):
    work = Path(work).resolve()
    binary = Path(binary).resolve()
    dictionary = Path(dictionary).resolve() if dictionary else None
    shutil.rmtree(work, ignore_errors=True)
    (work / "corpus").mkdir(parents=True)
    for f in files_of([corpus]):
        shutil.copy(f, work / "corpus" / f.name)
    cmd = [str(binary), f"-max_total_time={seconds}", "-print_final_stats=1", "-timeout=30",
           "-rss_limit_mb=4096", "-max_len=16384", f"-artifact_prefix={work}/"] + OPTIONS.get(name, [])
    if dictionary:
        cmd.append(f"-dict={dictionary}")
    cmd.append(str(work / "corpus"))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=sanitizer_env(), cwd=work)
    log = proc.stdout.decode("utf-8", "replace")
    (work / "fuzz.log").write_text(log)
    execs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", log)
    status = re.findall(r"^#(\d+)\s+\S+\s+cov: (\d+) ft: (\d+) corp: (\d+)", log, re.M)
    cov, ft, corp = (status[-1][1], status[-1][2], status[-1][3]) if status else ("?", "?", "?")
    figures = {"name": name, "executions": execs[-1] if execs else "?", "cov": cov, "ft": ft, "corpus": corp,
               "seconds": seconds, "rc": proc.returncode}
    line = (f"FUZZ {name}: executions={figures['executions']} cov={cov} ft={ft} corpus={corp} "
            f"seconds={seconds}")
    crashes = sorted(p.name for p in work.iterdir() if re.match(r"(crash|leak|timeout|oom|slow-unit)-", p.name))
    figures["crashes"] = [str(work / c) for c in crashes]
    if echo:
        if proc.returncode != 0:
            print(log[-20000:])
            print(f"{line} FAILED (exit {proc.returncode}); input saved: {' '.join(figures['crashes']) or 'none'}")
        else:
            print(line)
    return figures


def replay(binary, paths):
    files = files_of(paths)
    if not files:
        print("no inputs to replay")
        return 0
    proc = subprocess.run([str(binary)] + [str(f) for f in files], env=sanitizer_env())
    print(f"replayed {len(files)} inputs: exit {proc.returncode}")
    return proc.returncode


def run_all(build, seconds, jobs):
    build = Path(build)
    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = []
        for name in TARGETS:
            dictionary = HERE / f"{name}.dict"
            futures.append(pool.submit(run, build / "tests/fuzz" / f"fuzz_{name}", name, HERE / "corpus" / name,
                                       dictionary if dictionary.exists() else None, seconds,
                                       build / "fuzz-work" / name, False))
        for f in futures:
            results.append(f.result())
    print(f"{'target':<16}{'executions':>12}{'cov':>8}{'ft':>8}{'corpus':>8}  result")
    failed = False
    for r in results:
        verdict = "ok" if r["rc"] == 0 else f"FAILED: {' '.join(r['crashes']) or 'exit ' + str(r['rc'])}"
        failed |= r["rc"] != 0
        print(f"{r['name']:<16}{r['executions']:>12}{r['cov']:>8}{r['ft']:>8}{r['corpus']:>8}  {verdict}")
    print(f"logs and grown corpora: {build / 'fuzz-work'}")
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("binary")
    r.add_argument("--name", required=True)
    r.add_argument("--corpus", required=True)
    r.add_argument("--dict")
    r.add_argument("--seconds", type=int, default=60)
    r.add_argument("--work", required=True)
    p = sub.add_parser("replay")
    p.add_argument("binary")
    p.add_argument("paths", nargs="+")
    a = sub.add_parser("all")
    a.add_argument("--build", required=True)
    a.add_argument("--seconds", type=int, default=600)
    a.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if args.command == "run":
        return 0 if run(args.binary, args.name, args.corpus, args.dict, args.seconds, args.work)["rc"] == 0 else 1
    if args.command == "replay":
        return replay(args.binary, args.paths)
    return run_all(args.build, args.seconds, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
