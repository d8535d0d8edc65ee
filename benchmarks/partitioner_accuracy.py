"""Prediction accuracy of the cost model on held-out graphs.

1. Calibrate this machine (single-op graphs over a range of shapes).
2. Held-out graphs: random MLPs (widths, depths, activations, batch sizes none of the
   calibration graphs had), each split at a random layer (edge: the first layers).
3. Per part: predicted compute vs the measured kernel times of its nodes (target: within 20%).
4. End to end: the parts run together (one Session per part, one thread each) with the link
   emulated by delaying each transfer by bytes / bandwidth + rtt / 2 (target: within 15%).
Both devices are this machine (slowdown 1): only real time can be measured.
Usage: python benchmarks/partitioner_accuracy.py [--graphs 12] [--quick]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import isthmus as ism
from isthmus.core.profile import time_nodes
from isthmus.core.rendezvous import InProcessRendezvous
from isthmus.partitioner import CLOUD_DEVICE, EDGE_DEVICE, Constraints, CostModel, LinkModel, Problem, partition
from isthmus.partitioner.calibrate import calibrate
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


def measured_parts(g, x, y, xv, placement, repeats=20):
    times = time_nodes(ism.Session(g, optimize=False, parallel=False), y, {x: xv}, repeats=repeats)
    out = {EDGE_DEVICE: 0.0, CLOUD_DEVICE: 0.0}
    for n, s in times.items():
        out[placement[n.name]] += s
    return out


def measured_end_to_end(g, y, xv, placement, repeats=15):
    P = partition(g, placement, [y], return_to=EDGE_DEVICE)

    rv = InProcessRendezvous(timeout=30, delay=emulated_link(LINK, EDGE_DEVICE))
    with SplitSession(P, rendezvous=rv, optimize=False) as s:
        s.run({"x": xv})
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            s.run({"x": xv})
            samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphs", type=int, default=12)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    profile = calibrate("here", OPS, "quick" if args.quick else "full")
    calib_s = time.perf_counter() - t0
    cm = CostModel({EDGE_DEVICE: profile, CLOUD_DEVICE: profile}, LINK, EDGE_DEVICE)
    rng = np.random.default_rng(7)
    rows, part_err, e2e_err = [], [], []
    for _ in range(args.graphs):
        g, x, y, depth = mlp(rng)
        layer = int(rng.integers(0, depth - 1))
        placement = split_at(g, layer)
        p = Problem(g, cm, [y], Constraints(edge_memory_budget=None))
        pred = p.breakdown(p.assignment(placement))
        xv = rng.standard_normal(x.shape).astype(np.float32)
        parts = measured_parts(g, x, y, xv, placement)
        e2e = measured_end_to_end(g, y, xv, placement)
        for d in parts:
            part_err.append(abs(pred.compute[d] - parts[d]) / parts[d])
        e2e_err.append(abs(pred.total - e2e) / e2e)
        rows.append({"shape": f"{x.shape[0]}x" + "-".join(str(n.outputs[0].shape[1]) for n in g.nodes
                                                          if n.name.startswith("layer")),
                     "split_after_layer": layer,
                     "edge_pred_ms": pred.compute[EDGE_DEVICE] * 1e3, "edge_meas_ms": parts[EDGE_DEVICE] * 1e3,
                     "cloud_pred_ms": pred.compute[CLOUD_DEVICE] * 1e3, "cloud_meas_ms": parts[CLOUD_DEVICE] * 1e3,
                     "e2e_pred_ms": pred.total * 1e3, "e2e_meas_ms": e2e * 1e3})
    emit("partitioner_accuracy", {
        "link": str(LINK), "calibration_s": calib_s, "calibrated_ops": OPS,
        "part_mape": float(np.mean(part_err)), "part_target": 0.20,
        "end_to_end_mape": float(np.mean(e2e_err)), "end_to_end_target": 0.15,
        "graphs": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in rows]})


if __name__ == "__main__":
    main()
