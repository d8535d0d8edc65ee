"""The long-run fuzz mode, outside CI: up to 10^6 inputs per loader.

    python -m tests.fuzz.run --loader edge_loader --n 1000000 [--chunk 20000] [--seed 0] [--budget-s 3600]
    python -m tests.fuzz.run --loader all --n 1000000 --out fuzz.jsonl

Runs benchmarks/reliability.py's worker for one harness (`--loader`, or `all` in turn) in
chunks of `--chunk` inputs, each chunk a fresh subprocess (address space capped at 1 GiB over
its start, 2 s of CPU time per input) with its own seed, until `--n` inputs or `--budget-s` seconds per
loader. Prints one JSON line per chunk and a summary per loader: inputs actually run, crashes
(undocumented exceptions) by type, hangs, allocations over 1 GiB. `--out` appends the summaries
(with date and commit) to a JSON-lines file. Exit status 1 when anything failed.
The short CI version is tests/fuzz/test_fuzz_harnesses.py (300 inputs per harness).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "reliability.py")


def harnesses() -> list:
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        import reliability
    finally:
        sys.path.pop(0)
    return list(reliability.HARNESSES)


def _commit() -> str:
    out = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def run_loader(name: str, n: int, chunk: int, seed: int, budget_s: float) -> dict:
    total = {"loader": name, "inputs": 0, "reached_deep": 0, "crashes": 0, "hangs": 0, "over_1GiB": 0,
             "undocumented_types": {}, "examples": [], "chunks": 0, "workers_died": 0}
    t0 = time.monotonic()
    k = 0
    while total["inputs"] < n and time.monotonic() - t0 < budget_s:
        m = min(chunk, n - total["inputs"])
        out = subprocess.run([sys.executable, SCRIPT, "--worker", name, "--inputs", str(m),
                              "--seed", str(seed * 1_000_003 + k)], capture_output=True, text=True,
                             timeout=max(600, 2.5 * m))
        k += 1
        if out.returncode != 0:   # counted and reported; the next chunk goes on
            total["workers_died"] += 1
            total["examples"].append(out.stderr[-300:])
            continue
        row = json.loads(out.stdout.strip().splitlines()[-1])
        for key in ("inputs", "reached_deep", "crashes", "hangs", "over_1GiB"):
            total[key] += row[key]
        for t, c in row.get("undocumented_types", {}).items():
            total["undocumented_types"][t] = total["undocumented_types"].get(t, 0) + c
        total["examples"] = (total["examples"] + row["examples"])[:10]
        total["chunks"] = k
        print(json.dumps({"chunk": k, **row}), flush=True)
    total["seconds"] = round(time.monotonic() - t0, 1)
    return total


def markdown(path: str) -> str:
    """The long-run table: one row per loader (the sum of its summaries in `path`, runs with different seeds)."""
    rows: dict = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            got = rows.get(r["loader"])
            if got is None:
                rows[r["loader"]] = dict(r, commits=[r["commit"]])
                continue
            for k in ("inputs", "reached_deep", "hangs", "over_1GiB", "workers_died", "seconds"):
                got[k] += r[k]
            for t, c in r["undocumented_types"].items():
                got["undocumented_types"][t] = got["undocumented_types"].get(t, 0) + c
            got["commits"] += [c for c in [r["commit"]] if c not in got["commits"]]
    out = ["## Long runs", "",
           "`python -m tests.fuzz.run --loader NAME --n 1000000` (chunks of fresh subprocesses, 1 GiB cap, 2 s of CPU "
           "time per input), stopped at the time budget where noted: *inputs* is what actually ran. An undocumented "
           "type is any exception other than the loader's documented errors.", "",
           "| loader | date (UTC) | commit | inputs run | of | past the first check | undocumented types | hangs | "
           "over 1 GiB | workers died | seconds |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        types = ", ".join(f"{t} x{c}" for t, c in r["undocumented_types"].items()) or "none"
        out.append(f"| {name} | {r['date'][:16].replace('T', ' ')} | {', '.join(r['commits'])} | {r['inputs']:,} | "
                   f"{1_000_000:,} | {r['reached_deep']:,} | {types} | {r['hangs']} | {r['over_1GiB']} | "
                   f"{r['workers_died']} | {r['seconds']:.0f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loader", help="a harness of benchmarks/reliability.py, or 'all'")
    p.add_argument("--n", type=int, default=int(os.environ.get("ISTHMUS_FUZZ_N", 1_000_000)))
    p.add_argument("--chunk", type=int, default=20000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=float("inf"), help="stop a loader after this many seconds")
    p.add_argument("--out", help="append the summaries to this JSON-lines file")
    p.add_argument("--markdown", metavar="JSONL", help="print RELIABILITY.md's long-run table from a summaries "
                                                       "file (written by --out) and exit")
    a = p.parse_args(argv)
    if a.markdown:
        print(markdown(a.markdown))
        return 0
    if not a.loader:
        p.error("give --loader NAME (or all)")
    names = harnesses() if a.loader == "all" else [a.loader]
    unknown = [x for x in names if x not in harnesses()]
    if unknown:
        p.error(f"unknown loader {unknown[0]!r}; known: {', '.join(harnesses())}")
    bad = False
    for name in names:
        s = run_loader(name, a.n, a.chunk, a.seed, a.budget_s)
        s.update(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), commit=_commit(),
                 asked=a.n)
        print(json.dumps({"summary": True, **s}), flush=True)
        if a.out:
            with open(a.out, "a", encoding="utf-8") as f:
                f.write(json.dumps(s) + "\n")
        bad |= bool(s["crashes"] or s["hangs"] or s["over_1GiB"] or s["workers_died"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
