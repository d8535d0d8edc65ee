"""`isthmus bench FILE`: time a model as TFLite's benchmark_model and onnxruntime_perf_test do:
warm-up runs, then the median and p90/p99 of timed runs, a per-op table, peak memory, threads."""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .errors import UsageError, input_file, non_negative_int, positive_int
from .model_source import check_input, load_model, parse_input_shapes, random_inputs, read_inputs

EXAMPLES = """examples:
  isthmus bench cnn.int8.isth --random-input --runs 100 --per-op
  isthmus bench cnn.onnx --input image=x.npy --threads 1
  isthmus bench model.onnx --input-shape image=8,3,224,224 --random-input
An .isth file runs on the edge interpreter; .onnx, .tflite, .graph and file.py:function on the core executor."""


@dataclass
class BenchResult:
    """Timings of one model: per-run seconds after warm-up, per-op seconds, peak memory."""
    file: str
    engine: str
    threads: Optional[int]
    warmup: int
    runs: List[float]
    per_op: List[Tuple[str, str, float]] = field(default_factory=list)  # (name, op, median seconds)
    peak_rss_bytes: int = 0
    arena_bytes: Optional[int] = None
    init_s: float = 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.runs, q))

    def text(self) -> str:
        r = self.runs
        lines = [f"{self.file}: {self.engine}, threads {self.threads or 'default'}, "
                 f"init {self.init_s * 1e3:.1f} ms, {self.warmup} warm-up runs, {len(r)} timed runs",
                 f"  median {statistics.median(r) * 1e3:.3f} ms  mean {statistics.fmean(r) * 1e3:.3f} ms  "
                 f"min {min(r) * 1e3:.3f} ms  p90 {self.percentile(90) * 1e3:.3f} ms  "
                 f"p99 {self.percentile(99) * 1e3:.3f} ms  max {max(r) * 1e3:.3f} ms",
                 f"  peak memory (process RSS) {self.peak_rss_bytes / 2**20:.1f} MiB"
                 + (f"; arena {self.arena_bytes:,} bytes" if self.arena_bytes is not None else "")]
        if self.per_op:
            total = sum(s for _, _, s in self.per_op) or 1.0
            lines.append(f"  {'node':<40} {'op':<18} {'median ms':>10} {'%':>6}")
            for name, op, s in sorted(self.per_op, key=lambda x: -x[2]):
                lines.append(f"  {name[:40]:<40} {op[:18]:<18} {s * 1e3:10.4f} {100 * s / total:6.1f}")
            by_op: Dict[str, float] = {}
            for _, op, s in self.per_op:
                by_op[op] = by_op.get(op, 0.0) + s
            lines.append("  by op type: " + ", ".join(f"{op} {100 * s / total:.1f}%"
                                                      for op, s in sorted(by_op.items(), key=lambda x: -x[1])))
        return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog, p.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    p.add_argument("file", help="an .isth, .onnx, .tflite or .graph file, or file.py:function")
    p.add_argument("--runs", type=positive_int, default=50, help="timed runs (default %(default)s)")
    p.add_argument("--warmup", type=non_negative_int, default=5, help="untimed runs first (default %(default)s)")
    p.add_argument("--threads", type=positive_int, default=None, help="BLAS threads (default: the library's own)")
    p.add_argument("--input", action="append", default=[], metavar="NAME=X.npy",
                   help="an input array (repeatable; or X.npy per input in order, or one .npz)")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=D0,D1,..",
                   help="shape of an input with unknown dims (with --random-input)")
    p.add_argument("--random-input", action="store_true", help="uniform random inputs (seed 0)")
    p.add_argument("--per-op", action="store_true", help="time each op and print the table")


def bench(file: str, inputs: Sequence[str] = (), random_input: bool = False, runs: int = 50, warmup: int = 5,
          threads: Optional[int] = None, per_op: bool = False, input_shapes=None) -> BenchResult:
    """Time `file` on the given inputs (or random ones); see the module docstring."""
    if runs < 1 or warmup < 0:
        raise UsageError(f"--runs {runs} / --warmup {warmup}: need runs >= 1 and warmup >= 0")
    if not inputs and not random_input:
        raise UsageError("give the inputs (--input NAME=X.npy, repeatable) or --random-input")
    if inputs and random_input:
        raise UsageError("--input and --random-input exclude each other")
    shapes = parse_input_shapes(input_shapes or [])
    limiter = _threads(threads)
    try:
        if file.lower().endswith(".isth"):
            return _bench_edge(input_file(file, "FILE"), inputs, shapes, runs, warmup, threads, per_op)
        return _bench_core(file, inputs, shapes, runs, warmup, threads, per_op)
    finally:
        if limiter is not None:
            limiter.restore_original_limits()


def _threads(n: Optional[int]):
    if n is None:
        return None
    from threadpoolctl import threadpool_limits  # deferred: threadpoolctl is a heavy or optional dependency
    return threadpool_limits(n, user_api="blas")


def _feeds(names_specs: Dict[str, Tuple[Sequence[Optional[int]], object]], inputs, shapes) -> Dict[str, np.ndarray]:
    unknown = sorted(set(shapes) - set(names_specs))
    if unknown:
        raise UsageError(f"--input-shape {unknown[0]}: the model has no input of that name "
                         f"(its inputs: {', '.join(names_specs)})")
    if inputs:
        got = read_inputs(inputs, list(names_specs))
        missing = [n for n in names_specs if n not in got]
        if missing:
            raise UsageError(f"--input: no array for input '{missing[0]}' (the model takes {', '.join(names_specs)})")
        return {n: check_input(n, got[n], s, dt) for n, (s, dt) in names_specs.items()}
    specs = {}
    for n, (s, dt) in names_specs.items():
        shape = list(shapes.get(n, s))
        if n in shapes and len(shape) != len(s):
            raise UsageError(f"--input-shape {n}: {len(shape)} dims, the model's input has {len(s)}")
        if any(d in (None, -1) for d in shape):
            if shape and shape[0] in (None, -1) and all(d not in (None, -1) for d in shape[1:]):
                shape[0] = 1
            else:
                raise UsageError(f"input '{n}' has unknown dims {['?' if d in (None, -1) else d for d in shape]}: "
                                 f"give them with --input-shape {n}=D0,D1,...")
        specs[n] = (tuple(shape), dt)
    return random_inputs(specs)


def _time(fn, runs: int, warmup: int) -> List[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def _bench_edge(path, inputs, shapes, runs, warmup, threads, per_op) -> BenchResult:
    # deferred: the edge runtime, loaded only by the commands that need it
    from isthmus.edge.format import EdgeModelError
    # deferred: the edge interpreter, loaded only by the commands that need it
    from isthmus.edge.interpreter import Interpreter
    from isthmus.edge.loader import load  # deferred: the edge runtime, loaded only by the commands that need it
    t0 = time.perf_counter()
    try:
        model = load(path)
    except EdgeModelError as e:
        if "subgraph" not in str(e):
            raise UsageError(f"FILE {path}: not a valid edge model: {e}") from None
        # deferred: the edge runtime, loaded only by the commands that need it
        from isthmus.edge.split_model import load_split
        model = load_split(path).full
        if model is None:
            raise UsageError(f"FILE {path}: a split model without a full copy; bench its parts with --cloud runs "
                             "(isthmus edge-run --cloud)") from None
    t = model.tensors
    specs = {t[i].name: (t[i].shape, t[i].dtype) for i in model.inputs}
    feeds = _feeds(specs, inputs, shapes)
    run_shapes = {n: a.shape for n, a in feeds.items() if tuple(a.shape) != tuple(specs[n][0])}
    try:
        interp = Interpreter(model, input_shapes=run_shapes or None)
    except (EdgeModelError, ValueError) as e:
        raise UsageError(f"FILE {path}: {e}") from None
    init = time.perf_counter() - t0
    args = [feeds[n] for n in specs]
    times = _time(lambda: interp.invoke(*args), runs, warmup)
    ops = []
    if per_op:
        kernels = interp.kernels
        by_name = {t[o.outputs[0]].name: o.op for o in model.operators if o.outputs}
        samples: Dict[int, List[float]] = {k: [] for k in range(len(kernels))}
        for _ in range(min(runs, 20)):
            interp.set_inputs(*args)
            for k, (_, step) in enumerate(kernels):
                s = time.perf_counter()
                step()
                samples[k].append(time.perf_counter() - s)
        ops = [(name, by_name.get(name, "?"), statistics.median(samples[k])) for k, (name, _) in enumerate(kernels)]
    return BenchResult(path, "edge interpreter", threads, warmup, times, ops, _peak_rss(), interp.arena_bytes, init)


def _bench_core(spec, inputs, shapes, runs, warmup, threads, per_op) -> BenchResult:
    t0 = time.perf_counter()
    m = load_model(spec, shapes if spec.lower().endswith(".onnx") else None)
    sess = m.session()
    specs = {n: (tuple(t.shape), t.dtype) for n, t in m.inputs.items()}
    feeds = _feeds(specs, inputs, {} if spec.lower().endswith(".onnx") else shapes)
    outs = list(m.outputs.values())
    fd = {m.inputs[n]: v for n, v in feeds.items()}
    sess.run(outs, fd)
    init = time.perf_counter() - t0
    times = _time(lambda: sess.run(outs, fd), runs, warmup)
    ops = []
    if per_op:
        # deferred: the graph machinery (isthmus.core), loaded only by the commands that need it
        from isthmus.core.profile import time_nodes
        ops = [(n.name, n.op, s) for n, s in time_nodes(sess, outs, fd, repeats=min(runs, 20)).items()]
    return BenchResult(spec, "core executor", threads, warmup, times, ops, _peak_rss(), None, init)


def _peak_rss() -> int:
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb if sys.platform == "darwin" else kb * 1024


def run(args) -> int:
    r = bench(args.file, args.input, args.random_input, args.runs, args.warmup, args.threads, args.per_op,
              args.input_shape)
    print(r.text())
    return 0


__all__ = ["bench", "BenchResult"]
