"""Prediction accuracy of the cost model on held-out graphs.

1. Calibrate this machine (single-op graphs over a range of shapes), with the BLAS thread count
   the held-out graphs then run with (the profile records it; threads.py).
2. Held-out graphs: random MLPs (widths, depths, activations, batch sizes none of the
   calibration graphs had), each split at a random layer (edge: the first layers).
3. Per part: predicted compute vs the measured kernel times of its nodes (target: within 20%).
   Measured like calibration measures: the least disturbed of three medians, taken in rounds,
   each round timing the calibration cases and then all the graphs (the machine is shared: a burst
   of other work must not count as the model's error, and a load that changes during the run must
   reach the calibration and the graphs alike). `part_round_spread_median` says how much the
   rounds of one part disagree (the noise), `part_mean_signed_error` whether the model leans one way.
4. End to end: the parts run together (one Session per part, one thread each) with the link
   emulated by delaying each transfer by bytes / bandwidth + rtt / 2 (target: within 15%).
Both devices are this machine (slowdown 1): only real time can be measured.
The sessions run their graph passes (as every Session does by default: MatMul + BiasAdd +
activation fused into one kernel), and the cost model prices that fused graph; the JSON also
says how far off the same model would be pricing the graph as written (`unfused_model_*`).
--no-passes measures and prices the graphs as written instead.
--blas-threads N calibrates and measures with N BLAS threads (one thread is far less disturbed
by other work on a shared machine: a two-thread GEMM waits for its slower thread).
Usage: python benchmarks/partitioner_accuracy.py [--graphs 12] [--quick] [--no-passes] [--blas-threads N]
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace

import numpy as np

import isthmus as ism
from isthmus.core.profile import time_nodes
from isthmus.core.rendezvous import InProcessRendezvous
from isthmus.partitioner import CLOUD_DEVICE, EDGE_DEVICE, Constraints, CostModel, LinkModel, Problem, partition
from isthmus.partitioner.calibrate import Calibration, fit
from isthmus.partitioner.threads import blas_threads, check_threads, limited_blas_threads
from isthmus.partitioner.runner import SplitSession, emulated_link
from timing import emit

OPS = ["MatMul", "BiasAdd", "Relu", "Tanh", "Sigmoid", "Add"]
LINK = LinkModel.parse("50mbps", "4ms")


def mlp(rng):
    batch = int(rng.choice([1, 4, 16, 48, 100]))
    widths = [int(w) for w in rng.choice([48, 96, 200, 384, 700, 1200], size=int(rng.integers(3, 7)))]
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (batch, widths[0]), name="x")
        h = x
        for i, w in enumerate(widths[1:]):
            W = ism.constant((rng.standard_normal((h.shape[1], w)) / np.sqrt(w)).astype(np.float32))
            b = ism.constant(np.zeros(w, np.float32))
            act = (ism.relu, ism.tanh, ism.sigmoid)[int(rng.integers(3))]
            h = act(ism.bias_add(ism.matmul(h, W), b), name=f"layer{i}")
        y = ism.add(h, 1.0, name="y")
    return g, x, y, len(widths) - 1


def split_at(g, layer: int):
    """The nodes up to layer `layer` on the edge, the rest on the cloud."""
    placement, dev = {}, EDGE_DEVICE
    for n in g.nodes:
        placement[n.name] = dev
        if n.name == f"layer{layer}":
            dev = CLOUD_DEVICE
    return placement


def measured_parts(g, x, y, xv, placement, passes: bool, repeats=10, rounds=3):
    """Kernel seconds per device; a fused node is named after the last node of its group.
    Like calibration, the least disturbed of `rounds` medians (the machine is shared)."""
    sess = ism.Session(g, optimize=passes, parallel=False)
    best = None
    for _ in range(rounds):
        times = time_nodes(sess, y, {x: xv}, repeats=repeats)
        out = {EDGE_DEVICE: 0.0, CLOUD_DEVICE: 0.0}
        for n, s in times.items():
            if n.name not in placement:
                raise KeyError(f"timed node '{n.name}' ({n.op}) has no counterpart in the placement")
            out[placement[n.name]] += s
        best = out if best is None else {d: min(best[d], out[d]) for d in out}
    return best


def measured_end_to_end(g, y, xv, placement, passes: bool, repeats=7, rounds=3):
    P = partition(g, placement, [y], return_to=EDGE_DEVICE)

    rv = InProcessRendezvous(timeout=30, delay=emulated_link(LINK, EDGE_DEVICE))
    with SplitSession(P, rendezvous=rv, optimize=passes) as s:
        s.run({"x": xv})
        medians = []
        for _ in range(rounds):
            samples = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                s.run({"x": xv})
                samples.append(time.perf_counter() - t0)
            medians.append(float(np.median(samples)))
    return min(medians)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphs", type=int, default=12)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-passes", action="store_true", help="run and price the graphs as written (no fusion)")
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="BLAS threads for calibration and measurement alike (default: the process's)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds, each timing the calibration cases and then every graph (least disturbed kept)")
    args = ap.parse_args()
    with limited_blas_threads(args.blas_threads):
        return run(args)


def run(args) -> None:
    passes = not args.no_passes
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    cal = Calibration(OPS, "quick" if args.quick else "full")
    rng = np.random.default_rng(7)
    graphs = []
    for _ in range(args.graphs):
        g, x, y, depth = mlp(rng)
        layer = int(rng.integers(0, depth - 1))
        graphs.append((g, x, y, layer, split_at(g, layer), rng.standard_normal(x.shape).astype(np.float32)))
    # Rounds over the calibration cases and all the graphs, each keeping its least disturbed
    # measurement: a burst of other work on the shared machine then spoils one round of many
    # graphs, not every round of one; and the calibration shares the graphs' rounds, so a load
    # that changes during the run reaches what is predicted and what it is checked against alike.
    parts_rounds = [[] for _ in graphs]
    e2e_best = [np.inf] * len(graphs)
    calib_s = 0.0
    for _ in range(args.rounds):
        tc = time.perf_counter()
        cal.run_round()
        calib_s += time.perf_counter() - tc
        for i, (g, x, y, layer, placement, xv) in enumerate(graphs):
            parts_rounds[i].append(measured_parts(g, x, y, xv, placement, passes, rounds=1))
            e2e_best[i] = min(e2e_best[i], measured_end_to_end(g, y, xv, placement, passes, rounds=1))
    profile = replace(fit(cal.samples(), "here"), blas_threads=blas_threads())
    check_threads(profile, what="this machine")
    cm = CostModel({EDGE_DEVICE: profile, CLOUD_DEVICE: profile}, LINK, EDGE_DEVICE, passes=passes)
    as_written = CostModel({EDGE_DEVICE: profile, CLOUD_DEVICE: profile}, LINK, EDGE_DEVICE, passes=False)
    rows, part_err, part_signed, e2e_err, unfused_err, spread = [], [], [], [], [], []
    for (g, x, y, layer, placement, xv), rounds, e2e in zip(graphs, parts_rounds, e2e_best):
        p = Problem(g, cm, [y], Constraints(edge_memory_budget=None))
        q = Problem(g, as_written, [y], Constraints(edge_memory_budget=None))
        pred = p.breakdown(p.assignment(placement))
        pred_unfused = q.breakdown(q.assignment(placement))
        parts = {d: min(r[d] for r in rounds) for d in rounds[0]}
        for d in parts:
            part_err.append(abs(pred.compute[d] - parts[d]) / parts[d])
            part_signed.append((pred.compute[d] - parts[d]) / parts[d])
            unfused_err.append(abs(pred_unfused.compute[d] - parts[d]) / parts[d])
            spread.append(max(r[d] for r in rounds) / parts[d] - 1)  # how far the rounds disagree
        e2e_err.append(abs(pred.total - e2e) / e2e)
        rows.append({"shape": f"{x.shape[0]}x" + "-".join(str(n.outputs[0].shape[1]) for n in g.nodes
                                                          if n.name.startswith("layer")),
                     "split_after_layer": layer,
                     "edge_pred_ms": pred.compute[EDGE_DEVICE] * 1e3, "edge_meas_ms": parts[EDGE_DEVICE] * 1e3,
                     "cloud_pred_ms": pred.compute[CLOUD_DEVICE] * 1e3, "cloud_meas_ms": parts[CLOUD_DEVICE] * 1e3,
                     "e2e_pred_ms": pred.total * 1e3, "e2e_meas_ms": e2e * 1e3})
    mape = float(np.mean(part_err))
    emit("partitioner_accuracy", {
        "link": str(LINK), "calibration_s": calib_s, "total_s": time.perf_counter() - t0, "calibrated_ops": OPS,
        "passes": passes, "blas_threads": blas_threads(), "rounds": args.rounds,
        "load_average_before": load0, "load_average_after": os.getloadavg()[0],
        "part_mape": mape, "part_median_ape": float(np.median(part_err)), "part_target": 0.20,
        "part_mean_signed_error": float(np.mean(part_signed)),
        "part_round_spread_median": float(np.median(spread)),
        "unfused_model_part_mape": float(np.mean(unfused_err)),
        "end_to_end_mape": float(np.mean(e2e_err)), "end_to_end_target": 0.15,
        "pass": bool(mape <= 0.20 and float(np.mean(e2e_err)) <= 0.15),
        "graphs": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]})


if __name__ == "__main__":
    main()
