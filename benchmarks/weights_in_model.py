"""Do a model's weight-bound kernels stream their weights like the calibration's cycle does (issue 27)?

    python benchmarks/weights_in_model.py [--model resnet50_shaped_64] [--rounds 3] [--out FILE]

converters/edge_profile.measure_weight_streaming prices the weights a part reads beyond the cache
from a tight cycle of weight-bound convolutions and nothing else. Here, for one model's int8 edge
model (CPU time, one BLAS thread, each step timed by itself): its heavy kernels (each holding at
least 200 KB of prepared weights) timed inside the whole model's sequence, as a cycle of only
themselves, and every step repeated alone (its weights hot); and, each round, the weights-from-memory
price that measure_weight_streaming fits then. The model minus its steps alone is what running them
together costs (the weights beyond the cache among it), to set against that price. With --cycles,
the calibration's own cycles of 2.1-8.4M weights measured the same way."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from typing import Callable, Dict, List, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

HEAVY_BYTES = 200_000
RESULTS = os.path.join(HERE, "results", "weights_in_model_{model}.json")


def held_bytes(fn: Callable, skip: Sequence[np.ndarray] = (), depth: int = 6) -> int:
    """Bytes of the distinct arrays a bound kernel's closure holds (its prepared weights), the
    arrays in `skip` (and views of them: the arena) left out."""
    def root(a):
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a
    skipped = {id(root(a)) for a in skip}
    found: Dict[int, int] = {}
    seen: set = set()

    def walk(obj, d):
        if id(obj) in seen or d > depth:
            return
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            r = root(obj)
            if id(r) not in skipped:
                found[id(r)] = r.nbytes
        elif isinstance(obj, types.FunctionType):
            for cell in obj.__closure__ or ():
                try:
                    walk(cell.cell_contents, d + 1)
                except ValueError:  # an empty cell
                    pass
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                walk(x, d + 1)
        elif isinstance(getattr(obj, "__dict__", None), dict) and not isinstance(obj, type):
            for x in obj.__dict__.values():
                walk(x, d + 1)
    walk(fn, 0)
    return sum(found.values())


def step_medians(steps: List[Callable], idx: Sequence[int], reps: int) -> Dict[int, float]:
    """Median CPU seconds of each step of `idx`, the steps run in that order `reps` times."""
    t: Dict[int, List[float]] = {i: [] for i in idx}
    for _ in range(reps):
        for i in idx:
            c = time.thread_time()
            steps[i]()
            t[i].append(time.thread_time() - c)
    return {i: float(np.median(v)) for i, v in t.items()}


def measure(model: str, rounds: int) -> dict:
    from edge_price_breakdown import edge_model
    from split_models import MODELS

    from isthmus.converters.edge_profile import measure_weight_streaming
    from isthmus.edge.interpreter import Interpreter
    from isthmus.partitioner.threads import limited_blas_threads
    g, inputs, y = MODELS[model]()
    weights = sum(int(np.prod(n.outputs[0].shape)) for n in g.nodes if n.op == "Const")
    data, feed = edge_model(g, inputs, y, True)
    it = Interpreter(data)
    it.invoke(*[feed[x.node.name] for x in inputs])
    steps = [s for _, s in it.kernels]
    held = [held_bytes(s, skip=[it.arena]) for s in steps]
    heavy = [i for i, h in enumerate(held) if h >= HEAVY_BYTES]
    runs = []
    with limited_blas_threads(1):
        for _ in range(rounds):
            full = step_medians(steps, range(len(steps)), 40)
            cyc = step_medians(steps, heavy, 40)
            alone: Dict[int, float] = {}
            for i in range(len(steps)):
                alone.update(step_medians(steps, [i], 15))
            s, cache = measure_weight_streaming(True, rounds=5)
            runs.append({"model_ms": round(sum(full.values()) * 1e3, 3),
                         "model_alone_ms": round(sum(alone.values()) * 1e3, 3),
                         "heavy_in_model_ms": round(sum(full[i] for i in heavy) * 1e3, 3),
                         "heavy_cycle_ms": round(sum(cyc.values()) * 1e3, 3),
                         "heavy_alone_ms": round(sum(alone[i] for i in heavy) * 1e3, 3),
                         # what the profile prices the model's weights beyond the cache at, fitted this round
                         "weights_priced_ms": round(s * max(weights - cache, 0.0) * 1e3, 3),
                         "weight_cache": cache})
    return {"model": model, "steps": len(steps), "heavy_steps": len(heavy),
            "heavy_mb": round(sum(held[i] for i in heavy) / 1e6, 2), "held_mb": round(sum(held) / 1e6, 2),
            "rounds": runs}


def measure_cycles(rounds: int, sizes=(8, 16, 20, 24, 28, 32)) -> List[dict]:
    """The calibration's streaming chain (converters/edge_profile) the same way: per round, for each
    cycle of its first P convolutions, the cycle's steps together less each one alone (ms), and the
    weights-from-memory price measure_weight_streaming fits then for the model's weights."""
    from isthmus.converters import edge_profile as ep
    from isthmus.edge.interpreter import Interpreter
    from isthmus.partitioner.threads import limited_blas_threads
    data, values, per_conv = ep._stream_chain(True, max(sizes))
    it = Interpreter(data)
    mine = [k for k, (kind, op) in enumerate(it.steps_info) if kind == "op" and op not in ep.BORDERS]
    steps = [s for _, s in it.kernels]
    it.invoke(*values)
    out = []
    with limited_blas_threads(1):
        for _ in range(rounds):
            alone: Dict[int, float] = {}
            for i in mine:
                alone.update(step_medians(steps, [i], 15))
            row = {}
            for p in sizes:
                together = step_medians(steps, mine[:p], 30)
                row[str(p * per_conv)] = round((sum(together.values()) - sum(alone[i] for i in mine[:p])) * 1e3, 3)
            s, cache = ep.measure_weight_streaming(True, rounds=5)
            out.append({"together_less_alone_ms": row, "weight_stream_s": s, "weight_cache": cache})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet50_shaped_64")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cycles", action="store_true", help="also the calibration's streaming chain, cycles of 2.1-8.4M weights")
    p.add_argument("--out", default=RESULTS, help="JSON file ({model}: the model's name; default %(default)s)")
    a = p.parse_args(argv)
    load = os.getloadavg()[0]
    r = measure(a.model, a.rounds)
    print(f"{r['model']}: {r['heavy_steps']} of {r['steps']} steps hold {r['heavy_mb']} of {r['held_mb']} MB")
    for x in r["rounds"]:
        print(f"  model {x['model_ms']} ms (its steps alone {x['model_alone_ms']}; weights priced "
              f"{x['weights_priced_ms']}, cache {x['weight_cache'] / 1e6:.2f}M); heavy steps in the model "
              f"{x['heavy_in_model_ms']}, as a cycle {x['heavy_cycle_ms']}, each alone {x['heavy_alone_ms']} ms")
    if a.cycles:
        r["cycles"] = measure_cycles(a.rounds)
        for x in r["cycles"]:
            print("  cycle together less alone: " + ", ".join(f"{int(w) / 1e6:.1f}M {v:+.3f}" for w, v in
                  x["together_less_alone_ms"].items()) + f" ms; fit: cache {x['weight_cache'] / 1e6:.2f}M")
    with open(a.out.format(model=a.model), "w") as f:
        json.dump({**r, "load_average_before": round(load, 2), "load_average_after": round(os.getloadavg()[0], 2)},
                  f, indent=1)
    return 0


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
