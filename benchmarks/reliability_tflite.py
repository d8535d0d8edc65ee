"""Fuzz the TFLite importer, in the style of benchmarks/reliability.py (whose table it can join).

    python benchmarks/reliability_tflite.py [--inputs 2000] [--seed 0]

Seeds are .tflite files written with the tests' TFLiteWriter (a CNN with convolutions, pools,
padding, concatenation, a mean and a classifier; a quantized fully-connected model). Inputs are
byte-level mutations (bit flips, overwrites, truncations, spliced runs: reliability.py's mutator)
and structure-aware ones: valid flatbuffers whose contents lie (tensor and buffer indices out of
range, negative or huge dims, buffers of the wrong size, bogus opcodes, zero strides, wrong
quantization vectors). Each input is imported and, when the import succeeds, run once on zeros.
The worker runs in a subprocess with its address space capped at 1 GiB above its start; any
exception other than TFLiteImportError (or the executor's documented errors when running what
was imported), any input over 2 s, or a MemoryError counts as a failure. The loop and its
bounds are benchmarks/reliability.py's (harness "tflite_importer"); this module provides the
seeds, the runner and the structure-aware mutator. Prints one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _writer():
    from tests.converters.tflite_writer import TFLiteWriter
    return TFLiteWriter


def _cnn(w, rng, perturb=None):
    """The seed CNN; `perturb(kind, value)` may replace any field as it is written."""
    p = perturb or (lambda kind, v: v)
    f32 = np.float32
    x = w.tensor("image", p("shape", [1, 8, 8, 3]))
    k1 = w.const("k1", p("data", (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(f32)))
    b1 = w.const("b1", rng.standard_normal(4).astype(f32))
    c1 = w.tensor("c1", p("shape", [1, 8, 8, 4]))
    w.op("CONV_2D", p("inputs", [x, k1, b1]), [c1], p("options", dict(Padding=0, StrideW=1, StrideH=1,
                                                                       FusedActivationFunction=1)), "Conv2DOptions")
    k2 = w.const("k2", (rng.standard_normal((1, 3, 3, 4)) * 0.3).astype(f32))
    c2 = w.tensor("c2", p("shape", [1, 3, 3, 4]))
    w.op("DEPTHWISE_CONV_2D", p("inputs", [c1, k2, -1]), [c2],
         p("options", dict(Padding=1, StrideW=2, StrideH=2, DepthMultiplier=1, FusedActivationFunction=3)),
         "DepthwiseConv2DOptions")
    pool = w.tensor("pool", p("shape", [1, 2, 2, 4]))
    w.op("MAX_POOL_2D", [c2], [pool], p("options", dict(Padding=1, StrideW=1, StrideH=1, FilterWidth=2,
                                                        FilterHeight=2)), "Pool2DOptions")
    padded = w.tensor("padded", p("shape", [1, 4, 4, 4]))
    w.op("PAD", [pool, w.const("pads", p("data", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32)))], [padded])
    mean = w.tensor("mean", p("shape", [1, 4]))
    w.op("MEAN", [padded, w.const("axes", p("data", np.array([1, 2], np.int32)))], [mean], dict(KeepDims=False),
         "ReducerOptions")
    wq = w.const("fc", rng.integers(-127, 128, (5, 4)).astype(np.int8), scale=p("scale", [0.02]),
                 zero_point=p("zero_point", [0]))
    y = w.tensor("y", p("shape", [1, 5]))
    w.op("FULLY_CONNECTED", p("inputs", [mean, wq, -1]), [y], dict(FusedActivationFunction=0), "FullyConnectedOptions")
    out = w.tensor("prob", [1, 5])
    w.op(p("opname", "SOFTMAX"), [y], [out], dict(Beta=1.0), "SoftmaxOptions")
    return [x], [out]


def _seeds():
    rng = np.random.default_rng(0)
    w = _writer()()
    ins, outs = _cnn(w, rng)
    return [w.finish(ins, outs)]


def _structured(rng) -> bytes:
    """A well-formed flatbuffer whose contents lie somewhere."""
    w = _writer()()
    target = int(rng.integers(0, 12))
    count = [0]

    def perturb(kind, v):
        count[0] += 1
        if count[0] != target and rng.random() > 0.1:
            return v
        if kind == "shape":
            v = list(v)
            v[int(rng.integers(0, len(v)))] = int(rng.choice([-7, -1, 0, 1 << 20, 2 ** 31 - 1, 3]))
        elif kind == "inputs":
            v = list(v)
            v[int(rng.integers(0, len(v)))] = int(rng.choice([-5, -1, 999, 2 ** 31 - 1, 0]))
        elif kind == "options":
            v = dict(v)
            key = list(v)[int(rng.integers(0, len(v)))]
            v[key] = int(rng.choice([0, -1, 7, 1 << 15]))
        elif kind == "data":
            v = v.reshape(-1)[:max(v.size - int(rng.integers(0, 3)), 0)] if rng.random() < 0.5 else \
                (v * rng.choice([-3, 100, 0])).astype(v.dtype)
        elif kind == "scale":
            v = [[0.0], [-1.0], [float("nan")], [0.1, 0.2], None][int(rng.integers(0, 5))]
        elif kind == "zero_point":
            v = [1, 2, 3]
        elif kind == "opname":
            v = str(rng.choice(["SOFTMAX", "FLOOR", "WHILE", "CUSTOM"]))
        return v
    ins, outs = _cnn(w, rng, perturb)
    if rng.random() < 0.2:
        w.ops[int(rng.integers(0, len(w.ops)))]["code"] = int(rng.choice([-1, 50, 1000]))
    if rng.random() < 0.2:
        w.tensors[int(rng.integers(0, len(w.tensors)))]["buffer"] = int(rng.choice([-1, 999, 2 ** 31 - 1]))
    try:
        return w.finish(ins, outs)
    except Exception:  # the builder itself refused (e.g. a negative unsigned field): mutate bytes instead
        return _seeds()[0]


def _run(data: bytes) -> bool:
    """True when the import succeeded (the graph was then run once on zeros)."""
    import isthmus as ism
    from isthmus.converters.tflite_import import TFLiteImportError, from_tflite
    try:
        g, ins, outs = from_tflite(data)
    except TFLiteImportError:
        return False
    feed = {t: np.zeros([1 if d is None else d for d in t.shape], t.dtype) for t in ins.values()}
    if sum(int(np.prod(v.shape)) for v in feed.values()) > (1 << 24):
        return True  # a model this large would be refused by a real caller's memory budget, not run here
    try:
        ism.Session(g).run(outs, feed)
    except (ism.IsthmusError, ValueError):
        pass
    return True


def main(argv=None) -> int:
    """The harness run by benchmarks/reliability.py's worker (seeds, this module's mutator, 2 s and
    1 GiB bounds), in a subprocess: one JSON line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--inputs", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reliability.py")
    out = subprocess.run([sys.executable, script, "--worker", "tflite_importer", "--inputs", str(args.inputs),
                          "--seed", str(args.seed)], capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        print(out.stderr[-2000:], file=sys.stderr)
        return 1
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps(row))
    return 0 if row["crashes"] == 0 and row["hangs"] == 0 and row["over_1GiB"] == 0 else 1


if __name__ == "__main__":
    from blas_env import unpin_openblas  # measured without this workplace's OpenBLAS pins (NOTES.md)
    unpin_openblas()
    sys.exit(main())
