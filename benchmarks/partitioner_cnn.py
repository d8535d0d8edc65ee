"""Splitting real CNNs: a MobileNetV2-style and a ResNet-18-style network (224x224, batch 1).

1. Calibrate this machine on the ops these networks use; the cloud is this machine, the edge
   the same profile 8x slower.
2. Benefit: uplinks of 1, 5, 20, 100 Mbit/s (downlink the same), 40 ms RTT: predicted
   latency of edge-only, cloud-only and the mincut split; the split must never be slower than
   the better of the two, and should be strictly faster somewhere. The same at 40 uplinks from 1
   to 1000 Mbit/s says where the split wins and by how much (`fine_sweep_1_to_1000_mbps`).
3. Optimality: mincut against greedy and the best single layer split at every link.
4. Sanity of the prediction on the whole network: predicted vs measured compute on this machine\n   (the graph a Session runs, after its passes; also priced as written, for comparison).
--blas-threads N calibrates and measures with N BLAS threads (one is far less disturbed by other
work on a shared machine).
Usage: python benchmarks/partitioner_cnn.py [--quick] [--nets mobilenet_v2 resnet18] [--blas-threads N]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import isthmus as ism
from isthmus.core.profile import time_nodes
from isthmus.partitioner import CLOUD_DEVICE, EDGE_DEVICE, Constraints, CostModel, LinkModel, Problem
from isthmus.partitioner.calibrate import calibrate
from isthmus.partitioner.costmodel import cost_key
from isthmus.partitioner.placement import solve_greedy, solve_layer_split, solve_mincut, solve_preferring
from timing import emit

OPS = ["Conv2D", "BatchNorm", "Relu6", "Relu", "Add", "MaxPool", "GlobalAvgPool", "MatMul", "BiasAdd"]
UPLINKS_MBPS = (1, 5, 20, 100)
RTT = "40ms"


class _Builder:
    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    def conv_bn(self, x, out, k=3, stride=1, groups=1, act=ism.relu6, name=None):
        cin = x.shape[1]
        w = self.rng.standard_normal((out, cin // groups, k, k)).astype(np.float32)
        w *= np.sqrt(2.0 / (cin // groups * k * k))
        y = ism.conv2d(x, ism.constant(w), strides=stride, padding="SAME", groups=groups)
        ones, zeros = np.ones(out, np.float32), np.zeros(out, np.float32)
        y = ism.batch_norm(y, ones, zeros, zeros, ones, axis=1)
        return act(y, name=name) if act is not None else ism.identity(y, name=name)

    def classifier(self, x, classes=1000):
        h = ism.global_avg_pool(x, name="pool")
        w = (self.rng.standard_normal((h.shape[1], classes)) * 0.01).astype(np.float32)
        return ism.bias_add(ism.matmul(h, ism.constant(w)), ism.constant(np.zeros(classes, np.float32)), name="logits")


def mobilenet_v2(size=224):
    g, b = ism.Graph(seed=0), _Builder()
    with g.as_default():
        x = ism.placeholder("float32", (1, 3, size, size), name="image")
        h = b.conv_bn(x, 32, 3, 2, name="stem")
        cin = 32
        for i, (t, c, n, s) in enumerate([(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                                          (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]):
            for j in range(n):
                stride = s if j == 0 else 1
                with ism.name_scope(f"block{i}_{j}"):
                    y = b.conv_bn(h, cin * t, 1) if t != 1 else h
                    y = b.conv_bn(y, cin * t, 3, stride, groups=cin * t)
                    y = b.conv_bn(y, c, 1, act=None)
                    h = ism.add(h, y, name="out") if stride == 1 and cin == c else ism.identity(y, name="out")
                cin = c
        h = b.conv_bn(h, 1280, 1, name="head")
        y = b.classifier(h)
    return g, x, y


def resnet18(size=224):
    g, b = ism.Graph(seed=0), _Builder(1)
    with g.as_default():
        x = ism.placeholder("float32", (1, 3, size, size), name="image")
        h = ism.max_pool(b.conv_bn(x, 64, 7, 2, act=ism.relu, name="stem"), ksize=3, strides=2, padding="SAME")
        cin = 64
        for i, c in enumerate((64, 128, 256, 512)):
            for j in range(2):
                stride = 2 if (j == 0 and i > 0) else 1
                with ism.name_scope(f"stage{i}_{j}"):
                    y = b.conv_bn(h, c, 3, stride, act=ism.relu)
                    y = b.conv_bn(y, c, 3, 1, act=None)
                    skip = b.conv_bn(h, c, 1, stride, act=None) if (stride != 1 or cin != c) else h
                    h = ism.relu(ism.add(y, skip), name="out")
                cin = c
        y = b.classifier(h)
    return g, x, y


NETS = {"mobilenet_v2": mobilenet_v2, "resnet18": resnet18}


def _problem(g, y, cloud_profile, mbps: float) -> Problem:
    """Placing g: the edge 8x slower than `cloud_profile`, up- and downlink `mbps` Mbit/s, RTT."""
    link = LinkModel.parse("1mbps", RTT).with_uplink(mbps * 1e6)
    cm = CostModel.edge_cloud(link, cloud_profile.scaled(8.0, name="edge"), cloud_profile)
    return Problem(g, cm, [y], Constraints(edge_memory_budget=None))


def sweep(g, y, cloud_profile, quick_check: bool):
    rows = []
    for mbps in UPLINKS_MBPS:
        p = _problem(g, y, cloud_profile, mbps)
        res = {"uplink_mbps": mbps}
        for name, solve in (("edge_only", lambda q: solve_preferring(q, q.edge)),
                            ("cloud_only", lambda q: solve_preferring(q, q.role("cloud"))),
                            ("mincut", solve_mincut), ("greedy", solve_greedy), ("layer_split", solve_layer_split)):
            t0 = time.perf_counter()
            a = solve(p)
            res[f"{name}_ms"] = round(p.total(a) * 1e3, 3)
            if name == "mincut":
                res["mincut_place_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
                bd = p.breakdown(a)
                res["mincut_nodes_on_edge"] = int((a == p.edge).sum())
                res["mincut_transfers"] = [f"{m.tensor} {m.nbytes // 1000} KB" for m in bd.moves]
        best_single = min(res["edge_only_ms"], res["cloud_only_ms"])
        res["split_not_slower"] = res["mincut_ms"] <= best_single + 1e-9
        res["split_speedup_vs_best_single"] = round(best_single / res["mincut_ms"], 3)
        rows.append(res)
    return rows


def fine_sweep(g, y, cloud_profile, points: int = 40) -> dict:
    """The same comparison at `points` uplinks from 1 to 1000 Mbit/s (geometric): where the split
    beats both single devices, and by how much. It wins only near the crossover of edge-only and
    cloud-only, a window narrower than the four-point sweep's spacing (20 -> 100 Mbit/s), so
    whether one of the four points lands in it depends on this machine's speed."""
    rows, window = [], []
    for mbps in np.geomspace(1, 1000, points):
        p = _problem(g, y, cloud_profile, mbps)
        e, c = p.total(solve_preferring(p, p.edge)), p.total(solve_preferring(p, p.role("cloud")))
        m = p.total(solve_mincut(p))
        rows.append((float(mbps), min(e, c) / m, m <= min(e, c) + 1e-9))
        if m < min(e, c) * (1 - 1e-3):
            window.append(float(mbps))
    best = max(rows, key=lambda r: r[1])
    return {"points": points, "never_slower": all(r[2] for r in rows),
            "best_speedup_vs_best_single": round(best[1], 3), "best_at_mbps": round(best[0], 1),
            "split_beats_both_mbps": [round(window[0], 1), round(window[-1], 1)] if window else None}


def measured_vs_predicted(g, x, y, profile, repeats=5):
    """Per-kernel times in steady state (the first runs pay page faults growing the heap), of the
    graph a Session runs (its passes fold batch norm and fuse conv + bias + relu6), against the
    cost model pricing that graph, and pricing the graph as written (`predicted_as_written_ms`)."""
    xv = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    sess = ism.Session(g, parallel=False)
    time_nodes(sess, y, {x: xv}, repeats=3)
    times = time_nodes(sess, y, {x: xv}, repeats=repeats)
    cons = Constraints(edge_memory_budget=None)
    p = Problem(g, CostModel.edge_cloud(LinkModel(), profile, profile), [y], cons)
    written = Problem(g, CostModel.edge_cloud(LinkModel(), profile, profile, passes=False), [y], cons)
    c = p.devices.index(CLOUD_DEVICE)
    by_op: dict = {}
    for n, t in times.items():
        row = by_op.setdefault(cost_key(n), [0, 0.0])
        row[0] += 1
        row[1] += t * 1e3
    pred, pred_written = p.times[:, c].sum() * 1e3, written.times[:, c].sum() * 1e3
    meas = sum(r[1] for r in by_op.values())
    return {"predicted_ms": round(pred, 2), "measured_ms": round(meas, 2), "error": round(abs(pred - meas) / meas, 3),
            "predicted_as_written_ms": round(pred_written, 2),
            "error_as_written": round(abs(pred_written - meas) / meas, 3),
            "measured_by_kernel": {k: {"kernels": c, "measured_ms": round(m, 2)}
                                   for k, (c, m) in sorted(by_op.items(), key=lambda kv: -kv[1][1])}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="quick calibration")
    ap.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    ap.add_argument("--blas-threads", type=int, default=None, help="BLAS threads (default: the library's)")
    args = ap.parse_args()
    if args.blas_threads:
        from threadpoolctl import threadpool_limits
        with threadpool_limits(args.blas_threads):
            return run(args)
    return run(args)


def run(args) -> None:
    t0 = time.perf_counter()
    profile = calibrate("this-machine", OPS, "quick" if args.quick else "full")
    out = {"calibration_s": round(time.perf_counter() - t0, 2), "rtt": RTT, "edge": "this machine 8x slower",
           "cloud": "this machine", "blas_threads": args.blas_threads or "default"}
    for name in args.nets:
        g, x, y = NETS[name]()
        out[name] = {"nodes": len(g.nodes), "sweep": sweep(g, y, profile, args.quick),
                     "fine_sweep_1_to_1000_mbps": fine_sweep(g, y, profile),
                     "whole_network_on_this_machine": measured_vs_predicted(g, x, y, profile)}
        out[name]["split_strictly_faster_somewhere"] = any(r["split_speedup_vs_best_single"] > 1.0 + 1e-9
                                                          for r in out[name]["sweep"])
    emit("partitioner_cnn", out)


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    main()
