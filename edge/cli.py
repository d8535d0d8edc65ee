"""`isthmus edge-run MODEL.isth --input x.npy`: run an edge model, print outputs, timings and the
arena size. Inputs are .npy files loaded without pickle; without --input, zeros are used."""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an edge model file (.isth)")
    p.add_argument("--input", action="append", default=[], help="a .npy file per model input, in order")
    p.add_argument("--repeat", type=int, default=20, help="timed runs (median reported)")
    p.add_argument("--save", default=None, help="write the first output to this .npy file")


def run(args) -> int:
    from .interpreter import Interpreter
    t0 = time.perf_counter()
    interp = Interpreter(args.model)
    t_load = time.perf_counter() - t0
    names = list(interp.input_shapes)
    if args.input and len(args.input) != len(names):
        raise SystemExit(f"the model takes {len(names)} inputs ({', '.join(names)}); got {len(args.input)} --input files")
    inputs = [np.load(p, allow_pickle=False) for p in args.input] or \
        [np.zeros(s, np.float32) for s in interp.input_shapes.values()]
    outs = interp.invoke(*inputs)
    times = []
    for _ in range(max(args.repeat, 1)):
        s = time.perf_counter()
        interp.invoke(*inputs)
        times.append(time.perf_counter() - s)
    for name, o in zip(interp.output_shapes, outs):
        flat = np.asarray(o).reshape(-1)
        print(f"output {name}: {o.dtype}{list(o.shape)} first values {np.array2string(flat[:8], precision=4)}")
    print(f"load+prepare {t_load * 1e3:.2f} ms; invoke median {statistics.median(times) * 1e3:.3f} ms over {len(times)} runs")
    print(f"arena {interp.arena_bytes:,} bytes (lower bound {interp.arena_lower_bound:,}; "
          f"all tensors {interp.tensor_bytes:,})")
    if args.save:
        np.save(args.save, outs[0], allow_pickle=False)
    return 0
