"""Null-step latency: a step that does nothing but coordinate, across 1, 2, 4 and 8 worker tasks.

    python benchmarks/cloud_null_step.py [--tasks 1,2,4,8] [--reps 200] [--out null_step.json]

Each worker task of a LocalCluster (one process each, on loopback) holds one NoOp; the
step's target groups them, so a step is: the client's RunStep to the master (worker task
0), one RunGraph per task, the control tokens of the edges between tasks (carried on the
RunGraph answers: cloud/master.py), the answers. The peer is the same graph in an
in-process core Session (no tasks). All clusters run at once and their steps are timed in
rotation, so every task count sees the same machine load. Reports median and p90 per task
count, the ratio to the in-process step, the growth per added task, and the issue's
baseline for comparison (issue #4 asks for the numbers; it sets no hard target).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def null_graph(n: int):
    import isthmus as ism
    g = ism.Graph()
    with g.as_default():
        ops = []
        for i in range(n):
            with ism.device(f"/job:worker/task:{i}"):
                ops.append(ism.no_op(name=f"noop_{i}"))
        with ism.device("/job:worker/task:0"):
            step = ism.group(*ops, name="null_step")
    return g, step


# issue #4's numbers before the step coordination work (2026-11-23, load ~1.2): median ms per task count
BASELINE_MS = {1: 0.64, 2: 1.90, 4: 4.13, 8: 9.8}


def rotated(fns, reps: int, warmup: int = 10):
    """Median and p90 seconds of each function, one call of each per round, in rotating order."""
    names = list(fns)
    for _ in range(warmup):
        for k in names:
            fns[k]()
    samples = {k: [] for k in names}
    for r in range(reps):
        for k in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            fns[k]()
            samples[k].append(time.perf_counter() - t0)
    out = {}
    for k, v in samples.items():
        v.sort()
        out[k] = (statistics.median(v), v[int(0.9 * (len(v) - 1))])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="1,2,4,8")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import isthmus as ism
    from isthmus.cloud.local_cluster import LocalCluster
    from timing import machine

    counts = [int(x) for x in a.tasks.split(",")]
    results = {"benchmark": "cloud_null_step", "machine": machine(), "load_avg_1m": os.getloadavg()[0],
               "reps": a.reps, "target": "none (issue #4 asks for the numbers); growth per task should shrink "
                                         "from the baseline's", "baseline_median_ms": BASELINE_MS, "tasks": {}}
    graphs = {n: null_graph(n) for n in counts}
    with contextlib.ExitStack() as stack:
        fns = {}
        for n in counts:
            g, step = graphs[n]
            lc = stack.enter_context(LocalCluster({"worker": n}))
            sess = stack.enter_context(ism.Session(g, target=lc.target))
            fns[("dist", n)] = lambda sess=sess, step=step: sess.run(step)
            local = ism.Session(g)
            fns[("local", n)] = lambda local=local, step=step: local.run(step)
        got = rotated(fns, a.reps)
    for n in counts:
        (med, p90), (loc_med, loc_p90) = got[("dist", n)], got[("local", n)]
        row = {"distributed_median_ms": med * 1e3, "distributed_p90_ms": p90 * 1e3,
               "in_process_median_ms": loc_med * 1e3, "in_process_p90_ms": loc_p90 * 1e3,
               "ratio_to_in_process": med / loc_med}
        if n in BASELINE_MS:
            row["baseline_median_ms"] = BASELINE_MS[n]
        results["tasks"][str(n)] = row
        print(f"{n} task(s): distributed {med * 1e3:7.3f} ms (p90 {p90 * 1e3:7.3f})   "
              f"in-process Session {loc_med * 1e3:7.4f} ms   ratio {med / loc_med:6.0f}x", file=sys.stderr)
    if len(counts) > 1:
        lo, hi = min(counts), max(counts)
        per = (got[("dist", hi)][0] - got[("dist", lo)][0]) / (hi - lo) * 1e3
        results["ms_per_added_task"] = per
        if lo in BASELINE_MS and hi in BASELINE_MS:
            results["baseline_ms_per_added_task"] = (BASELINE_MS[hi] - BASELINE_MS[lo]) / (hi - lo)
    results["load_avg_1m_after"] = os.getloadavg()[0]
    text = json.dumps(results, indent=2)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
