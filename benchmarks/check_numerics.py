"""What Session(check_numerics=True) costs: an MLP training step with the check on and off (issue 23).

    python benchmarks/check_numerics.py [--batch 64] [--steps 200] [--repeats 5]

Two sessions of one graph (784-256-128-10 MLP, Adam), alternating blocks of `--steps` steps,
median per-step time of each; the overhead is on / off - 1. One BLAS thread. JSON on stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    import isthmus as ism
    from isthmus import nn
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 784), name="x")
        y = ism.placeholder("int32", (None,), name="y")
        logits = nn.Sequential([nn.Dense(256, activation="relu"), nn.Dense(128, activation="relu"), nn.Dense(10)])(x)
        loss = nn.sparse_softmax_cross_entropy(y, logits)
        train = ism.optimizers.Adam(1e-3).minimize(loss)
        init = ism.global_variables_initializer()
    rng = np.random.default_rng(0)
    xb = rng.standard_normal((a.batch, 784)).astype(np.float32)
    yb = rng.integers(0, 10, a.batch).astype(np.int32)
    sessions = {"off": ism.Session(g), "on": ism.Session(g, check_numerics=True)}
    per = {k: [] for k in sessions}
    for s in sessions.values():
        s.run(init)
        f = s.make_callable([loss, train], [x, y])
        for _ in range(10):
            f(xb, yb)
    for _ in range(a.repeats):
        for k, s in sessions.items():
            f = s.make_callable([loss, train], [x, y])
            t0 = time.perf_counter()
            for _ in range(a.steps):
                f(xb, yb)
            per[k].append((time.perf_counter() - t0) / a.steps * 1e3)
    off, on = statistics.median(per["off"]), statistics.median(per["on"])
    print(json.dumps({"benchmark": "check_numerics", "batch": a.batch, "steps": a.steps, "repeats": a.repeats,
                      "nodes": len(g.nodes), "off_ms": off, "on_ms": on, "overhead": on / off - 1,
                      "blocks_off_ms": per["off"], "blocks_on_ms": per["on"]}, indent=1))
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
