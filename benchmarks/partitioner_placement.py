"""Speed of placement: a chain and a random DAG of 1,000 and 10,000 nodes placed by mincut.

Targets (issue 5): 1,000 nodes under 100 ms, 10,000 nodes under 2 s, counting everything a
caller waits for: building the placement problem (costs of every node on both devices and of
every tensor on the link, constraints) and solving the minimum cut.
Usage: python benchmarks/partitioner_placement.py [--sizes 1000 10000]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

import isthmus as ism
from isthmus.partitioner.costmodel import CostModel
from isthmus.partitioner.devices import EDGE
from isthmus.wire.link import LinkModel
from isthmus.partitioner.placement import solve_mincut
from isthmus.partitioner.problem import Problem
from timing import emit

WIDTH = 64


def chain(n: int):
    g = ism.Graph(seed=0)
    rng = np.random.default_rng(0)
    with g.as_default():
        h = ism.placeholder("float32", (None, WIDTH), name="x")
        ops = (ism.relu, ism.tanh, ism.sigmoid)
        while len(g.nodes) < n:
            w = ism.constant(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32))
            h = ops[len(g.nodes) % 3](ism.matmul(h, w))
    return g, [h]


def random_dag(n: int, fan_in: int = 3):
    """Each node reads up to `fan_in` of the previous 50 nodes; sinks are the outputs."""
    g = ism.Graph(seed=0)
    rng = np.random.default_rng(1)
    vals = []
    with g.as_default():
        vals.append(ism.placeholder("float32", (None, WIDTH), name="x"))
        while len(g.nodes) < n:
            k = int(rng.integers(1, fan_in + 1))
            ins = [vals[int(i)] for i in rng.integers(max(0, len(vals) - 50), len(vals), size=k)]
            if k == 1:
                vals.append(ism.matmul(ins[0], ism.constant(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32))))
            else:
                vals.append(ism.tanh(ism.add_n(ins)))
        read = {t for n in g.nodes for t in n.inputs}
    return g, [v for v in vals if v not in read]


def cost_model() -> CostModel:
    """An edge with a matmul accelerator (fast MatMul, slow everything else) on a fast link,
    so that the optimal cut alternates between devices instead of being all-or-nothing."""
    edge = replace(EDGE, op_coeffs={"MatMul": (1e-6, 1 / 100e9, 0.0)})
    return CostModel.edge_cloud(LinkModel.parse("1gbps", "0.01ms"), edge=edge, batch_size=8)


def time_placement(graph, outputs, repeats: int = 5):
    cm = cost_model()
    samples, build, cut = [], [], []
    for _ in range(repeats):
        cm = cm.with_link(cm.link)  # fresh node-cost cache: measure the cost model too
        cm._costs.clear()
        t0 = time.perf_counter()
        p = Problem(graph, cm, outputs)
        t1 = time.perf_counter()
        a = solve_mincut(p)
        t2 = time.perf_counter()
        samples.append(t2 - t0)
        build.append(t1 - t0)
        cut.append(t2 - t1)
    on_edge = int((a == p.edge).sum())
    return {"nodes": len(graph.nodes), "placed": len(p.nodes), "tensors": len(p.flows),
            "transfers_in_cut": len(p.breakdown(a).moves),
            "median_s": float(np.median(samples)), "problem_s": float(np.median(build)),
            "mincut_s": float(np.median(cut)), "on_edge": on_edge}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    args = ap.parse_args()
    results = {}
    for n in args.sizes:
        limit = 0.1 if n <= 1000 else 2.0
        for kind, make in (("chain", chain), ("dag", random_dag)):
            r = time_placement(*make(n), repeats=5 if n <= 1000 else 3)
            r["target_s"] = limit
            r["meets_target"] = r["median_s"] < limit
            results[f"{kind}_{n}"] = r
    emit("partitioner_placement", results)


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    main()
