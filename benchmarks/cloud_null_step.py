"""Null-step latency: a step that does nothing but coordinate, across 1, 2, 4 and 8 worker tasks.

    python benchmarks/cloud_null_step.py [--tasks 1,2,4,8] [--reps 200] [--out null_step.json]

Each worker task of a LocalCluster (one process each, on loopback) holds one NoOp; the
step's target groups them, so a step is: the client's RunStep to the master (worker task
0), one RunGraph per task, the control edges between tasks (Send/Recv of a control
token), the answers. The peer is the same graph in an in-process core Session (no tasks),
timed in the same run. Reports median and p90 per task count, and the ratio to the
in-process step.
"""
from __future__ import annotations

import argparse
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


def timed(fn, reps: int, warmup: int = 10):
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    out.sort()
    return statistics.median(out), out[int(0.9 * (len(out) - 1))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", default="1,2,4,8")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import isthmus as ism
    from isthmus.cloud.local_cluster import LocalCluster
    from timing import machine

    results = {"benchmark": "cloud_null_step", "machine": machine(), "load_avg_1m": os.getloadavg()[0],
               "reps": a.reps, "tasks": {}}
    for n in [int(x) for x in a.tasks.split(",")]:
        g, step = null_graph(n)
        local = ism.Session(g)
        loc_med, loc_p90 = timed(lambda: local.run(step), a.reps)
        with LocalCluster({"worker": n}) as lc:
            with ism.Session(g, target=lc.target) as sess:
                med, p90 = timed(lambda: sess.run(step), a.reps)
        results["tasks"][str(n)] = {"distributed_median_ms": med * 1e3, "distributed_p90_ms": p90 * 1e3,
                                    "in_process_median_ms": loc_med * 1e3, "in_process_p90_ms": loc_p90 * 1e3,
                                    "ratio_to_in_process": med / loc_med}
        print(f"{n} task(s): distributed {med * 1e3:7.3f} ms (p90 {p90 * 1e3:7.3f})   "
              f"in-process Session {loc_med * 1e3:7.4f} ms   ratio {med / loc_med:6.0f}x", file=sys.stderr)
    text = json.dumps(results, indent=2)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
