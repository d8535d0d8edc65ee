"""Optimality: mincut against exhaustive search on random DAGs of up to 16 placed nodes, and
the gaps of greedy and of the best single layer split to the optimum.

Each case draws a random DAG (matmuls, elementwise ops, fan-in up to 3, several outputs),
random per-op speeds on edge and cloud, random pins and a random link; exhaustive tries
all 2^k assignments (vectorised). The test suite runs a few hundred smaller cases through
hypothesis; this runs thousands. (Slow: about 20 ms per 16-node case; --cases 200 for a look.)
Each case is also solved under an edge memory budget that binds (drawn between the least edge
memory the constraints allow and what the unconstrained optimum keeps on the edge): mincut's
Lagrangian + branch and bound (forced: by default mincut searches graphs of up to 16 free
nodes exhaustively) against exhaustive search within the budget.
Usage: python benchmarks/partitioner_optimality.py [--cases 2000] [--max-nodes 16]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

import isthmus as ism
from isthmus.partitioner import CLOUD, EDGE, Constraints, CostModel, LinkModel, Problem
from isthmus.partitioner.placement import (solve_exhaustive, solve_greedy, solve_layer_split,
                                           solve_least_edge_memory, solve_mincut)
from timing import emit

OPS = ("MatMul", "Tanh", "Relu", "Add", "Mul")


def random_case(rng, max_nodes: int):
    n = int(rng.integers(2, max_nodes + 1))
    g = ism.Graph(seed=0)
    vals = []
    with g.as_default():
        vals.append(ism.placeholder("float32", (None, 32), name="x"))
        while len([m for m in g.nodes if m.op != "Const"]) < n:
            k = int(rng.integers(1, 4))
            ins = [vals[int(i)] for i in rng.integers(0, len(vals), size=k)]
            if k == 1:
                op = rng.integers(3)
                if op == 0:
                    w = rng.standard_normal((32, 32)).astype(np.float32)
                    vals.append(ism.matmul(ins[0], ism.constant(w)))
                else:
                    vals.append((ism.tanh, ism.relu)[op - 1](ins[0]))
            else:
                vals.append(ism.add_n(ins) if k == 3 else (ism.add, ism.mul)[int(rng.integers(2))](*ins))
        for m in g.nodes:
            if m.op not in ("Const", "Placeholder") and rng.random() < 0.1:
                m.device = "/job:edge" if rng.random() < 0.5 else "/job:cloud"
    read = {t for m in g.nodes for t in m.inputs}
    outs = [v for v in vals if v not in read]

    def profile(base, name):
        coeffs = {op: (rng.uniform(1e-6, 1e-3), rng.uniform(0, 1e-9), rng.uniform(0, 1e-8))
                  for op in OPS if rng.random() < 0.7}
        return replace(base, name=name, op_coeffs=coeffs, memory_budget=None)
    link = LinkModel(10 ** rng.uniform(5, 9), 10 ** rng.uniform(5, 9), rng.uniform(0, 2e-3))
    cm = CostModel.edge_cloud(link, profile(EDGE, "edge"), profile(CLOUD, "cloud"), batch_size=int(rng.integers(1, 64)))
    return Problem(g, cm, outs, Constraints(edge_memory_budget=None))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--max-nodes", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    worst_gap, mismatches, mixed, greedy_gaps, layer_gaps, sizes = 0.0, 0, 0, [], [], []
    binding, budget_mismatches, budget_worst = 0, 0, 0.0
    t0 = time.perf_counter()
    for _ in range(args.cases):
        p = random_case(rng, args.max_nodes)
        a, b, c = solve_mincut(p), solve_exhaustive(p), solve_greedy(p)
        ca, cb, cc = p.total(a), p.total(b), p.total(c)
        gap = (ca - cb) / cb if cb > 0 else 0.0
        worst_gap = max(worst_gap, gap)
        mismatches += gap > 1e-6
        mixed += len(set(b.tolist())) > 1
        greedy_gaps.append((cc - cb) / cb if cb > 0 else 0.0)
        layer_gaps.append((p.total(solve_layer_split(p)) - cb) / cb if cb > 0 else 0.0)
        sizes.append(len(p.nodes))
        m_free, m_least = p.edge_memory(a)[0], p.edge_memory(solve_least_edge_memory(p))[0]
        if m_free > m_least:
            budget = m_least + rng.uniform(0, 0.999) * (m_free - m_least)
            q = Problem(p.graph, p.cost, p.outputs, replace(p.constraints, edge_memory_budget=budget))
            qa, qb = solve_mincut(q, exhaustive_up_to=0), solve_exhaustive(q)
            assert q.feasible(qa)[0], "mincut broke the memory budget"
            qgap = (q.total(qa) - q.total(qb)) / q.total(qb) if q.total(qb) > 0 else 0.0
            binding += 1
            budget_mismatches += qgap > 1e-6
            budget_worst = max(budget_worst, qgap)
    emit("partitioner_optimality", {
        "cases": args.cases, "placed_nodes_max": int(max(sizes)), "placed_nodes_mean": float(np.mean(sizes)),
        "optimum_splits_the_graph": mixed, "mincut_not_optimal": mismatches,
        "mincut_worst_relative_gap": worst_gap,
        "greedy_mean_gap": float(np.mean(greedy_gaps)), "greedy_worst_gap": float(np.max(greedy_gaps)),
        "greedy_optimal_fraction": float(np.mean(np.array(greedy_gaps) <= 1e-6)),
        "layer_split_mean_gap": float(np.mean(layer_gaps)), "layer_split_worst_gap": float(np.max(layer_gaps)),
        "layer_split_optimal_fraction": float(np.mean(np.array(layer_gaps) <= 1e-6)),
        "budget_binding_cases": binding, "budget_mincut_not_optimal": budget_mismatches,
        "budget_mincut_worst_relative_gap": budget_worst,
        "seconds": time.perf_counter() - t0})


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    main()
