"""What an edge part loses to cold caches after an idle, per model and per weight footprint (issue 27).

    python benchmarks/cold_by_model.py [--models resnet50_shaped_64 ...] [--reps 9] [--out FILE]

The split-accuracy benchmark prices one cold curve for every part (PartCost.cold, fitted by
apps/part_measure.cold_samples on the calibration CNNs). This asks whether the curve depends on
the part: the three calibration CNNs' edge-only parts and the benchmark models' (int8, through the
real OffloadClient at 1x, one BLAS thread, link at zero) and cycles of the first P weight-bound 1x1
convolutions of converters/edge_profile's streaming chain (0.5-6.3M weights), each timed by CPU time
right after a warm request and after 5, 23 and 60 ms of sleep (23 / 60 ms: ResNet-shaped's idle
before a request at 8x / 20x), the idles in a random order per pass. Printed and written as JSON:
per part, its weights, hot CPU time and cold (median after the idle less median hot)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from typing import Dict, List, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

IDLES = (0.0, 0.005, 0.023, 0.06)
RESULTS = os.path.join(HERE, "results", "cold_by_model.json")


def cold_table(times: Dict[Tuple[str, float], List[float]], weights: Dict[str, int]) -> Dict[str, dict]:
    """{part: {"weights", "hot_ms", "cold_ms": {idle ms: median after it less the hot median}}} from CPU
    seconds per (part, idle); idle 0 is the hot request."""
    out = {}
    for name, w in weights.items():
        hot = float(np.median(times[(name, 0.0)]))
        cold = {f"{i * 1e3:g}": round((float(np.median(v)) - hot) * 1e3, 3)
                for (n, i), v in sorted(times.items()) if n == name and i > 0}
        out[name] = {"weights": int(w), "hot_ms": round(hot * 1e3, 3), "cold_ms": cold}
    return out


def _timed(run, idle: float) -> float:
    run()
    run()
    time.sleep(idle)
    c = time.thread_time()
    run()
    return time.thread_time() - c


def _parts(names):
    """(name, split, args, weight elements) of the calibration CNNs and `names`, edge-only and cloud-only cuts."""
    from isthmus.apps import part_measure as pm
    from isthmus.converters.split_export import export_split
    from isthmus.partitioner.pinned import PinnedPlans
    from split_models import MODELS
    graphs = [(f"calibration_{k}", g, [x], y) for k, (g, x, y) in zip(("chain", "fire", "wide", "big"), pm._graphs())]
    graphs += [(n, *MODELS[n]()) for n in names]
    out = []
    for name, g, inputs, y in graphs:
        plans, _ = pm._plans(g, y, 2)
        rng = np.random.default_rng(0)
        feeds = [{x.node.name: rng.standard_normal(x.shape).astype(np.float32) for x in inputs} for _ in range(4)]
        sp = export_split(g, [y], PinnedPlans(plans), int8=True, calibration=feeds, model_name=name)
        w = sum(int(np.prod(n.outputs[0].shape)) for n in g.nodes if n.op == "Const")
        out.append((name, sp, [feeds[0][x.node.name] for x in inputs], w))
    return out


def _cycles(sizes=(2, 8, 16, 24)):
    """(name, step runner, weight elements) of cycles of the first P convolutions of the streaming chain."""
    from isthmus.converters import edge_profile as ep
    from isthmus.edge.interpreter import Interpreter
    data, values, per_conv = ep._stream_chain(True, max(sizes))
    it = Interpreter(data)
    mine = [k for k, (kind, op) in enumerate(it.steps_info) if kind == "op" and op not in ep.BORDERS]
    steps = [s for _, s in it.kernels]
    it.invoke(*values)

    def cycle(p):
        chosen = [steps[k] for k in mine[:p]]

        def run():
            for s in chosen:
                s()
        return run
    return [(f"cycle_{p}", cycle(p), p * per_conv) for p in sizes]


def measure(names, reps: int, seed: int = 0) -> dict:
    from isthmus.apps import part_measure as pm
    from isthmus.partitioner.threads import limited_blas_threads
    parts, cycles = _parts(names), _cycles()
    rng = np.random.default_rng(seed)
    times: Dict[Tuple[str, float], List[float]] = {}
    with tempfile.TemporaryDirectory() as d, ExitStack() as st, limited_blas_threads(1):
        clients = [st.enter_context(pm._part_client(sp, os.path.join(d, f"m{i}"), 1.0, 0.0))
                   for i, (_, sp, _, _) in enumerate(parts)]
        for c, (_, sp, args, _) in zip(clients, parts):
            c.link.set(1e9, 0.0)
            c.selector.switch(len(sp.cuts) - 1)  # edge-only
        runs = [(n, (lambda c=c, a=args: c.invoke(*a))) for c, (n, _, args, _) in zip(clients, parts)]
        runs += [(n, run) for n, run, _ in cycles]
        for _ in range(reps):
            for name, run in runs:
                for idle in rng.permutation(IDLES):
                    times.setdefault((name, float(idle)), []).append(_timed(run, float(idle)))
    weights = {n: w for n, _, _, w in parts} | {n: w for n, _, w in cycles}
    return cold_table(times, weights)


def main(argv=None) -> int:
    from split_models import MODELS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=["resnet50_shaped_64", "squeezenet_96", "two_tower"],
                   choices=list(MODELS))
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--out", default=RESULTS)
    a = p.parse_args(argv)
    load = os.getloadavg()[0]
    table = measure(a.models, a.reps)
    for name, r in table.items():
        print(f"{name:24s} weights {r['weights'] / 1e6:5.2f}M hot {r['hot_ms']:6.3f} ms cold after "
              + ", ".join(f"{k} ms {v:+.3f}" for k, v in r["cold_ms"].items()))
    with open(a.out, "w") as f:
        json.dump({"benchmark": "cold_by_model", "reps": a.reps, "idles_ms": [i * 1e3 for i in IDLES],
                   "load_average_before": round(load, 2), "load_average_after": round(os.getloadavg()[0], 2),
                   "parts": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
