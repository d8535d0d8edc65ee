"""Where does the edge's price go wrong? Per kernel of a whole int8 (or fp32) edge model: the
profile's price against the interpreter's own measured CPU time (issue 27).

    python benchmarks/edge_price_breakdown.py [--models squeezenet_96 ...] [--fp32] [--runs 11] [--top 12]

For each model of benchmarks/split_models.py, the edge-only model is exported as split_accuracy
exports it (converters/split_export's int8 path) and each interpreter step is timed by CPU time,
one BLAS thread, as the emulated edge runs it (edge/link_emulation.emulated_kernel_seconds at 1x:
per-kernel medians scaled to the whole run's). The cost model prices the same kernels (fused
groups: partitioner/measured.kernel_groups) with the core Session's profile ("core") and with the
edge interpreter's (`isthmus profile --runtime edge-int8`, "interpreter"), both at 1x. Printed and
written to benchmarks/results/edge_price_breakdown.json: per cost key (op family) and per model,
predicted / measured sums and ratios, the worst kernels, and the whole model's (kernels + part).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from typing import Dict, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import isthmus as ism  # noqa: E402
from split_models import MODELS  # noqa: E402

RESULTS = os.path.join(HERE, "results", "edge_price_breakdown.json")


def edge_model(graph, inputs, out, int8: bool) -> bytes:
    """The whole model as the split exporter writes an edge-only cut (seeded calibration feeds)."""
    from isthmus.converters.split_export import _edge_bytes
    rng = np.random.default_rng(1)
    feeds = [{x.node.name: rng.standard_normal(x.shape).astype(np.float32) for x in inputs} for _ in range(4)]
    return _edge_bytes(graph, [out], inputs, int8, feeds, 1), feeds[0]


def kernel_rows(cost, graph, out, kernel_s: Dict[str, float], device: str) -> List[dict]:
    """One row per measured kernel: its cost key, shapes, measured and predicted seconds."""
    from isthmus.partitioner.costmodel import cost_key
    from isthmus.partitioner.executed import ABSORBED
    from isthmus.partitioner.measured import _attach_quantize_steps, kernel_groups
    from isthmus.partitioner.problem import needed_nodes, resolve_outputs
    groups = kernel_groups(cost, graph, [out])
    outs = resolve_outputs(graph, [out])
    roles = cost.roles(needed_nodes(outs), outs)
    rows = []
    frac = cost.profiles[device].weight_fraction(model_weights(graph))
    for name, sec in _attach_quantize_steps(kernel_s, groups).items():
        members = groups.get(name)
        if members is None:
            rows.append({"kernel": name, "key": "(unmatched)", "measured": sec, "predicted": 0.0})
            continue
        head = [m for m in members if roles.of(m) != ABSORBED] or members
        run = roles.runs_as.get(head[0], head[0])
        streamed = frac * sum(cost.streamed_extra(m, device, roles) for m in members)
        shapes = "x".join(str(tuple(t.shape)) for t in run.inputs[:2])
        rows.append({"kernel": name, "key": cost_key(run), "shapes": shapes, "measured": sec,
                     # with what its weights from memory add, as far as the model's weights pass the cache
                     "predicted": sum(cost.model_time(m, device, roles) for m in members) + streamed,
                     "streamed": streamed,
                     "absorbed": [m.op for m in members if roles.of(m) == ABSORBED],
                     "terms": [_terms(cost, m, roles) for m in members]})
    return rows


def _terms(cost, m, roles) -> list:
    """[cost key, FLOPs, bytes, role] of one member of a kernel: enough to price it again offline."""
    from isthmus.partitioner.costmodel import cost_key
    run = roles.runs_as.get(m, m)
    c = cost.cost(run)
    return [cost_key(run), c.flops, c.bytes_read + c.bytes_written, roles.of(m)]


def model_weights(graph) -> int:
    """Elements of the constants the graph's products read (partitioner/plan.edge_weights' count)."""
    from isthmus.partitioner.plan import WEIGHT_OPS
    consts = {t.node for n in graph.nodes if n.op in WEIGHT_OPS for t in n.inputs if t.node.op == "Const"}
    return int(sum(np.prod(c.outputs[0].shape) for c in consts))


def by_key(rows: List[dict]) -> Dict[str, dict]:
    out: Dict[str, dict] = {}
    for r in rows:
        d = out.setdefault(r["key"], {"kernels": 0, "measured_ms": 0.0, "predicted_ms": 0.0})
        d["kernels"] += 1
        d["measured_ms"] += r["measured"] * 1e3
        d["predicted_ms"] += r["predicted"] * 1e3
    for d in out.values():
        d["ratio"] = round(d["predicted_ms"] / d["measured_ms"], 3) if d["measured_ms"] else None
        d["measured_ms"], d["predicted_ms"] = round(d["measured_ms"], 3), round(d["predicted_ms"], 3)
    return out


def profiles(models, int8: bool):
    """(core profile, interpreter profile, its samples) calibrated here on the models' ops, one thread, CPU time."""
    from isthmus.converters.edge_profile import OPS, _build, _measure, fused_share, with_weights_from_memory
    from isthmus.partitioner import calibrate as cal
    from isthmus.partitioner.calibrate import calibrate
    from isthmus.partitioner.devices import EDGE
    ops = {"FusedConv2D", "FusedMatMul"}
    for name in models:
        ops |= {n.op for n in MODELS[name]()[0].nodes}
    core = calibrate("core", sorted(ops), "quick", blas_threads=1, clock="cpu")
    built = _build(sorted(ops & set(OPS)), "quick", int8)
    measured = _measure(sorted(ops & set(OPS)), "quick", int8, built=built)
    samples = [s for s, _ in measured]
    edge = replace(cal.fit(samples, "interpreter", EDGE), blas_threads=1)
    edge = replace(edge, fused_steps=fused_share(edge, measured, edge.fused_steps))  # as calibrate_edge does
    edge = with_weights_from_memory(edge, built, int8)
    return core, replace(edge, op_coeffs={**core.op_coeffs, **edge.op_coeffs}), samples


def run_model(name: str, priced: Dict[str, object], int8: bool, runs: int, slowdown: float = 1.0) -> dict:
    from isthmus.edge.interpreter import Interpreter
    from isthmus.edge.link_emulation import emulated_kernel_seconds
    from isthmus.partitioner import CostModel, LinkModel
    from isthmus.partitioner.devices import CLOUD_DEVICE, EDGE_DEVICE
    from isthmus.partitioner.threads import limited_blas_threads
    graph, inputs, out = MODELS[name]()
    data, feed = edge_model(graph, inputs, out, int8)
    args = [feed[x.node.name] for x in inputs]
    with limited_blas_threads(1):
        ks = emulated_kernel_seconds(Interpreter(data), *args, slowdown=slowdown, runs=runs)
    ks = {k: v / slowdown for k, v in ks.items()}  # CPU seconds here
    weights = model_weights(graph)
    res = {"measured_ms": round(sum(ks.values()) * 1e3, 3), "weights": weights, "prices": {}}
    for label, prof in priced.items():
        edge = replace(prof, kernel_table="edge")
        cost = CostModel({EDGE_DEVICE: edge, CLOUD_DEVICE: prof}, LinkModel(1e7, 1e7, 0.04), EDGE_DEVICE)
        rows = kernel_rows(cost, graph, out, ks, EDGE_DEVICE)
        worst = sorted(rows, key=lambda r: -abs(r["predicted"] - r["measured"]))
        res["prices"][label] = {
            "predicted_ms": round((sum(r["predicted"] for r in rows) + prof.weight_streaming(weights)) * 1e3, 3),
            # of predicted_ms: the kernels' weights read from memory (plan.weights_from_memory's terms)
            "weights_from_memory_ms": round((prof.weight_streaming(weights) + sum(
                r.get("streamed", 0.0) for r in rows)) * 1e3, 3),
            "by_key": by_key(rows),
            "worst": [{**r, "measured": round(r["measured"] * 1e6, 1), "predicted": round(r["predicted"] * 1e6, 1)}
                      for r in worst[:12]]}
        res["kernels"] = [{k: r[k] for k in ("kernel", "key", "shapes", "measured", "predicted", "terms") if k in r}
                          for r in rows]
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--fp32", action="store_true")
    p.add_argument("--runs", type=int, default=11)
    p.add_argument("--slowdown", type=float, default=1.0,
                   help="run the kernels as an edge this many times slower is emulated (CPU time, then a sleep), "
                        "so that each run finds the caches as the emulated edge's requests do; prices at 1x")
    p.add_argument("--out", default=RESULTS)
    opts = p.parse_args(argv)
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    core, interp, samples = profiles(opts.models, not opts.fp32)
    doc = {"edge": "fp32" if opts.fp32 else "int8", "slowdown": opts.slowdown, "models": {},
           "calibration": [s.__dict__ for s in samples]}
    for name in opts.models:
        r = doc["models"][name] = run_model(name, {"core": core, "interpreter": interp}, not opts.fp32, opts.runs,
                                               opts.slowdown)
        print(f"{name}: measured {r['measured_ms']} ms; " + "; ".join(
            f"{k} predicts {v['predicted_ms']} ms ({v['weights_from_memory_ms']} ms of it weights from memory)"
            for k, v in r["prices"].items()), file=sys.stderr)
        for label, v in r["prices"].items():
            for key, d in sorted(v["by_key"].items(), key=lambda kv: -kv[1]["measured_ms"]):
                print(f"   {label:11s} {key:24s} n={d['kernels']:3d} measured {d['measured_ms']:8.3f} "
                      f"predicted {d['predicted_ms']:8.3f} ratio {d['ratio']}", file=sys.stderr)
    doc.update(load_average_before=round(load0, 2), load_average_after=round(os.getloadavg()[0], 2),
               seconds=round(time.perf_counter() - t0, 1))
    if opts.out:
        with open(opts.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
