"""Synchronous replicas with one straggler: step time without and with a backup worker.

    python benchmarks/cloud_backup_workers.py [--steps 20] [--straggle 0.5] [--out backup.json]

A LocalCluster of 1 ps and 5 worker tasks (processes, loopback) trains the digits MLP with
N = 4 synchronous replicas. One replica is a straggler: it sleeps `--straggle` seconds
before each of its steps (a slow disk, a busy machine). With b = 0 every step waits for it;
with b = 1 a fifth replica runs and each step takes the first 4 gradients, dropping the
late one. Issue #4's target: the median step time drops by >= 20% with b = 1. The same
run reports both, with the number of gradients dropped.

On one small machine every task shares the same cores, so the backup replica's compute
slows the others (on a cluster it has its own machine), and a straggler only limits the
step when it is slower than the CPU-bound step itself: the default straggler sleeps
0.5 s. Measured on 2 cores (medians, 20 steps): load ~0.4-3: 0.5 s straggler 531 -> 61 ms
(-89%), 0.15 s straggler 178 -> 58 ms (-67%); at load ~9 the 0.15 s straggler gave only
220 -> 180 ms (-18%): the fifth replica's compute then competes for the busy cores.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BATCH = 32


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--straggle", type=float, default=0.5, help="seconds the straggler sleeps per step")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import isthmus as ism
    from isthmus import nn
    from isthmus.cloud.local_cluster import LocalCluster
    from isthmus.cloud.replicas import ReplicaTrainer
    from sklearn.datasets import load_digits
    from timing import machine

    d = load_digits()
    x_all, y_all = (d.data / 16.0).astype(np.float32), d.target.astype(np.int32)

    def model():
        x = ism.placeholder("float32", (None, 64), name="images")
        y = ism.placeholder("int32", (None,), name="labels")
        net = nn.Sequential([nn.Dense(128, activation="relu", name="fc1"),
                             nn.Dense(64, activation="relu", name="fc2"), nn.Dense(10, name="logits")])
        return nn.sparse_softmax_cross_entropy(y, net(x, training=True)), [x, y]

    straggler = 0  # replica 0 (on worker task 0, the chief's task too) sleeps

    def batch_fn(step, replica):
        if replica == straggler:
            time.sleep(a.straggle)
        idx = np.random.default_rng(step * 16 + replica).integers(0, len(y_all), BATCH)
        return x_all[idx], y_all[idx]

    results = {"benchmark": "cloud_backup_workers", "machine": machine(), "load_avg_1m": os.getloadavg()[0],
               "replicas_to_aggregate": 4, "straggle_s": a.straggle, "steps": a.steps, "runs": {}}
    with LocalCluster({"ps": 1, "worker": 5}) as lc:
        for backup in (0, 1):
            t = ReplicaTrainer(model, lambda: ism.optimizers.SGD(0.1), batch_fn, lc.cluster, mode="sync",
                               replicas=4, backup=backup, step_timeout=60.0)
            t0 = time.perf_counter()
            st = t.train(a.steps)
            wall = time.perf_counter() - t0
            times = st.step_times[1:]   # the first step includes registering the parts
            results["runs"][f"b={backup}"] = {
                "median_step_ms": statistics.median(times) * 1e3,
                "p90_step_ms": sorted(times)[int(0.9 * (len(times) - 1))] * 1e3,
                "wall_s": wall, "accepted": st.accepted, "dropped": st.dropped, "submitted": st.submitted}
            print(f"b={backup}: median step {statistics.median(times) * 1e3:7.1f} ms   "
                  f"dropped {st.dropped} of {st.submitted} gradients", file=sys.stderr)
    m0 = results["runs"]["b=0"]["median_step_ms"]
    m1 = results["runs"]["b=1"]["median_step_ms"]
    results["median_drop"] = 1.0 - m1 / m0
    results["target_median_drop"] = 0.20
    results["meets_target"] = results["median_drop"] >= 0.20
    print(f"median step time drop with one backup worker: {100 * results['median_drop']:.0f}% (target >= 20%)",
          file=sys.stderr)
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
