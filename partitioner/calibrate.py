"""Calibration: time the real kernels through the core executor, fit a cost regression per op type.

For each op type in the table, graphs of one node are built over a range of shapes and
compiled by a Session; the node's kernel is timed alone, in rounds over
all the shapes (the least disturbed median kept). A product (MatMul, Conv2D) is timed after the
private caches were flushed (inside a graph, earlier nodes have evicted its weights); any other
kernel warm, since it reads what the node before it has just written (timed after a flush, a
batch-1 MLP's elementwise steps were priced 20-100% over what they take in the graph). The times are paired with the node's
registered cost (FLOPs, bytes) and fitted, per cost key (the op, or a variant such as
MatMul:vector, see costmodel.cost_key), by non-negative least squares on relative error:
seconds = c0 + c_flops * flops + c_bytes * bytes.
`isthmus calibrate --device NAME` runs this and writes the device profile as JSON.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
from scipy.optimize import nnls

from ..core import gpu, registry
from ..core.graph import Graph
from ..core.registry import REQUIRED
from ..core.session import Session
from .costmodel import WIDE_POOLS, cost_key, op_cost
from .devices import CLOUD, Coeffs, DeviceProfile
from .threads import blas_threads as current_blas_threads
from .threads import limited_blas_threads


@dataclass(frozen=True)
class Sample:
    op: str
    shape: str
    flops: float
    nbytes: float
    seconds: float


# one graph: (input arrays, build(graph, placeholders) -> node under test)
Case = Tuple[List[np.ndarray], Callable]

_SIZES = {"quick": (1024, 65536, 524288), "full": (256, 4096, 32768, 131072, 524288, 2097152)}
_MATMULS = {"quick": ((1, 256, 256), (1, 1024, 1024), (4, 1536, 1536), (8, 256, 512), (2, 512, 1024),
                      (32, 512, 512), (128, 1024, 512)),
            "full": (# many rows: FLOP-bound
                     (32, 784, 512), (64, 256, 1024), (128, 1024, 1024), (256, 256, 256), (512, 128, 64),
                     (100, 512, 256), (48, 96, 384), (32, 1536, 128),
                     # few rows (MatMul:narrow), large weights: bound by packing them, as inference at small
                     # batch is
                     (4, 1536, 1536), (16, 2048, 1024), (4, 256, 512), (8, 1024, 128), (8, 512, 512),
                     (16, 64, 64), (12, 128, 1024), (4, 768, 256), (4, 128, 2048), (8, 256, 1536),
                     (4, 2048, 128),
                     # a row count not a multiple of 4 (MatMul:narrow_odd): the rows left over one by one
                     (2, 512, 2048), (3, 320, 960), (6, 640, 640), (2, 1024, 256), (5, 128, 1024),
                     (7, 256, 256),
                     # one row: BLAS's matrix-vector kernel (MatMul:vector)
                     (1, 256, 256), (1, 1024, 1024), (1, 64, 512), (1, 2048, 512), (1, 512, 64),
                     (1, 1536, 1536))}
# convolutions, NCHW: (batch, in channels, size, out channels, kernel, stride); groups: depthwise
# Fire modules (SqueezeNet: a 1x1 squeeze, 1x1 and 3x3 expands) and bottlenecks (ResNet: 1x1 down,
# 3x3, 1x1 up) on small feature maps with many channels: few output pixels, so the GEMM behind each
# has few rows and large weights, which a regression fitted on large maps priced 1.5-2x too low
# (issue 27: SqueezeNet-96 and a ResNet-50-shaped net at 64x64, fp32 and int8 alike).
_FIRE_AND_BOTTLENECK = ((1, 64, 24, 16, 1, 1), (1, 16, 24, 64, 3, 1), (1, 128, 12, 32, 1, 1), (1, 32, 12, 128, 3, 1),
                        (1, 384, 6, 64, 1, 1), (1, 64, 6, 256, 3, 1), (1, 512, 6, 100, 1, 1), (1, 128, 8, 512, 1, 1),
                        (1, 256, 4, 256, 3, 1), (1, 1024, 2, 256, 1, 1), (1, 256, 2, 1024, 1, 1))
# Mid-size dense 3x3 convolutions (ResNet/VGG stages on 16-56 maps, 0.03-0.3 GFLOP): without them the fit
# extrapolated from small cases and priced the int8 interpreter's 3x3 convolutions of a whole model
# 1.5-1.7x too low (its int8 kernels run these at about 60% of the small cases' FLOP rate here).
_MID_3X3 = ((1, 64, 32, 64, 3, 1), (1, 128, 16, 128, 3, 1), (1, 32, 56, 32, 3, 1), (1, 96, 28, 96, 3, 1))
# Few output pixels (costmodel's "Conv2D:narrow": at most 16), many channels: the last stages of a
# ResNet at 64x64, their strided 3x3s and 1x1 projections. Bound by streaming the weights, not by
# FLOPs: priced with the wide ones, the int8 interpreter's were 2-3x too cheap (issue 27).
_NARROW = ((1, 256, 8, 512, 1, 2), (1, 512, 4, 1024, 1, 2), (1, 128, 8, 128, 3, 2), (1, 256, 4, 256, 3, 2),
           (1, 512, 2, 128, 1, 1), (1, 128, 4, 128, 3, 1))
# Wide 3x3s on 32x32 maps (Inception's and the two-tower's first stages: im2col columns beyond L2, about
# 70 GFLOP/s in the int8 interpreter against 110 on smaller maps) and stems from 3 channels (K = 27 or 147:
# gathering the window dominates), as the split benchmark's models have them.
_WIDE_AND_STEMS = ((1, 64, 32, 96, 3, 1), (1, 32, 32, 64, 3, 1), (1, 3, 32, 64, 3, 1), (1, 3, 64, 32, 7, 2))
_CONVS = {"quick": ((1, 3, 96, 32, 3, 2), (1, 32, 28, 64, 3, 1), (1, 64, 14, 128, 1, 1)) + _FIRE_AND_BOTTLENECK + _MID_3X3
          + _NARROW + _WIDE_AND_STEMS,
          "full": ((1, 3, 224, 32, 3, 2), (1, 16, 56, 24, 1, 1), (1, 32, 28, 64, 3, 1), (1, 64, 14, 128, 3, 2),
                   (1, 96, 14, 96, 1, 1), (1, 128, 7, 256, 3, 1), (1, 256, 7, 64, 1, 1), (1, 8, 112, 16, 3, 1),
                   (4, 32, 28, 32, 3, 1), (1, 160, 7, 960, 1, 1)) + _FIRE_AND_BOTTLENECK + _MID_3X3 + _NARROW
                  + _WIDE_AND_STEMS}
_DEPTHWISE = {"quick": ((1, 32, 56, 3, 1), (1, 144, 14, 3, 2), (1, 96, 28, 3, 1), (1, 64, 56, 3, 2),
                        (1, 192, 14, 3, 1), (1, 16, 112, 3, 1)),
              "full": ((1, 32, 112, 3, 1), (1, 96, 56, 3, 2), (1, 144, 28, 3, 1), (1, 192, 14, 3, 1),
                       (1, 576, 14, 3, 2), (1, 960, 7, 3, 1), (1, 16, 64, 5, 1), (4, 64, 28, 3, 1))}
_FEATURE_MAPS = {"quick": ((1, 32, 56), (1, 96, 14), (4, 64, 28)),
                 "full": ((1, 32, 112), (1, 24, 56), (1, 64, 28), (1, 160, 14), (1, 960, 7), (4, 64, 28))}
# the maps wide pooling windows are calibrated on, NCHW (batch, channels, size): an image's few channels,
# a network's last maps; fewer or more outputs per pass (one level: k^2 passes whatever the level)
_WIDE_POOL_MAPS = ((1, 3, 128), (1, 32, 56), (1, 96, 14), (1, 256, 8), (4, 64, 28))
# channel concatenations, NCHW: (batch, channels of each input, size, inputs): fire and Inception modules'
# joins (int8: a requantization of every input whose scale differs from the output's)
_CONCATS = {"quick": ((1, 64, 24, 2), (1, 128, 12, 2), (1, 48, 16, 4), (1, 256, 6, 2)),
            "full": ((1, 64, 24, 2), (1, 128, 12, 2), (1, 48, 16, 4), (1, 256, 6, 2), (1, 32, 56, 2), (1, 96, 8, 4))}
_NOT_KERNELS = {"Const", "Placeholder", "Variable", "NoOp", "Send", "Recv", "If", "While", "WhileGrad"}


def _data(rng, shape, dtype=np.float32) -> np.ndarray:
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    return rng.uniform(0.5, 2.0, shape).astype(dtype)  # positive: log, sqrt and pow are defined


def placeholder_in(g: Graph, dtype, shape, name: str):
    """A Placeholder of `dtype` and `shape` in `g` (the one-node calibration graphs; litert_profile's too)."""
    # g.add_node, not ops.placeholder(graph=g): an empty Graph is falsy (it has __len__)
    return g.add_node("Placeholder", (), {"dtype": np.dtype(dtype), "shape": tuple(shape)}, name=name).outputs[0]


def _node(op: str, attrs=None):
    return lambda g, phs: g.add_node(op, phs, attrs or {})


def cases(op: str, level: str = "full", rng=None) -> Iterator[Case]:
    """The graphs timed for `op` (none for ops calibration does not know how to build)."""
    rng = rng or np.random.default_rng(0)
    if op in ("MatMul", "FusedMatMul"):
        for m, k, n in _MATMULS[level]:
            ins = [_data(rng, (m, k)), _data(rng, (k, n))]
            if op == "FusedMatMul":
                yield ins + [_data(rng, (n,))], _node(op, {"activation": "relu"})
            else:
                yield ins, _node(op)
        return
    if op in ("Conv2D", "FusedConv2D"):
        yield from _conv_cases(op, level, rng)
        return
    if op in ("MaxPool", "AvgPool", "GlobalAvgPool", "BatchNorm"):
        for n, c, hw in _FEATURE_MAPS[level]:
            x = _data(rng, (n, c, hw, hw))
            if op == "BatchNorm":
                yield [x] + [_data(rng, (c,)) for _ in range(4)], _node(op, {"axis": 1})
            elif op == "GlobalAvgPool":
                yield [x], _node(op)
            else:
                yield [x], _node(op, {"ksize": (3, 3), "strides": (2, 2), "pads": ((1, 1), (1, 1))})
                if op == "MaxPool":  # "MaxPool:2x2" (costmodel.cost_key): one compiled pass on the edge
                    yield [x], _node(op, {"ksize": (2, 2), "strides": (2, 2), "pads": ((0, 0), (0, 0))})
        if op in ("MaxPool", "AvgPool"):  # "AvgPool:8x8"... (costmodel.WIDE_POOLS): k^2 passes, fitted apart
            for k in WIDE_POOLS:
                for n, c, hw in _WIDE_POOL_MAPS:
                    yield [_data(rng, (n, c, hw, hw))], _node(op, {"ksize": (k, k), "strides": (k, k),
                                                                   "pads": ((0, 0), (0, 0))})
        return
    if op == "Concat":
        for n, c, hw, k in _CONCATS[level]:
            # each input its own range: an int8 model gives each its own scale (as the branches of a
            # module have), so its kernel requantizes them, where equal scales make it a copy (10x faster)
            yield [_data(rng, (n, c, hw, hw)) * (1 + i) for i in range(k)], _node(op, {"axis": 1})
        return
    if op == "BiasAdd":
        for size in _SIZES[level]:
            yield [_data(rng, (size // 256, 256)), _data(rng, (256,))], _node(op)
        return
    if op == "AddN":
        for size in _SIZES[level]:
            yield [_data(rng, (size,)) for _ in range(3)], _node(op)
        return
    d = registry.get(op)
    if op in _NOT_KERNELS or d.variadic or any(v is REQUIRED for v in d.attrs.values()):
        return
    arity = len(d.inputs)
    if arity not in (1, 2) or d.ref_inputs:
        return
    for dtype in (np.float32, np.bool_):  # the first dtype the op accepts, and whose kernel runs on it
        try:  # shape inference may accept 1-D inputs that the kernel cannot run (AvgPoolGrad): run it once
            g = Graph()
            phs = [placeholder_in(g, dtype, (4,), f"in{i}") for i in range(arity)]
            node = _node(op)(g, phs)
            Session(g, parallel=False, optimize=False, device="cpu").run(node.outputs[0],
                                                                         {p: _data(rng, (4,), dtype) for p in phs})
        except Exception:
            continue
        for size in _SIZES[level]:
            yield [_data(rng, (size,), dtype) for _ in range(arity)], _node(op)
        return


def _conv_cases(op: str, level: str, rng) -> Iterator[Case]:
    shapes = [(n, c, hw, o, k, st, 1) for n, c, hw, o, k, st in _CONVS[level]]
    shapes += [(n, c, hw, c, k, st, c) for n, c, hw, k, st in _DEPTHWISE[level]]
    for n, c, hw, o, k, st, groups in shapes:
        p = (k - 1) // 2
        attrs = {"strides": (st, st), "pads": ((p, p), (p, p)), "groups": groups}
        ins = [_data(rng, (n, c, hw, hw)), _data(rng, (o, c // groups, k, k))]
        if op == "FusedConv2D":
            ins.append(_data(rng, (o,)))
            attrs["activation"] = "relu6"
        yield ins, _node(op, attrs)


CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def clock_floor(clock=time.perf_counter, n: int = 201) -> float:
    """What an empty interval reads on `clock` (median): thread_time is a system call, not a vDSO
    read like perf_counter, and adds about 1 us to every interval it times (a tenth of a tiny kernel)."""
    samples = []
    for _ in range(n):
        t0 = clock()
        samples.append(clock() - t0)
    return float(np.median(samples))


class Calibration:
    """The single-op graphs of `ops`, built once, timed in rounds (`run_round`), each case keeping
    its least disturbed median. A caller may interleave rounds with other measurements (the
    accuracy benchmark times its held-out graphs between rounds), so that a change in the
    machine's load reaches the calibration and what it predicts alike.

    clock "wall" (perf_counter) measures what a run takes; "cpu" (thread_time) only the time this
    thread ran, which other processes on a shared machine do not inflate. "cpu" is true to wall
    time only when BLAS runs on one thread (its helper threads' time is not this thread's)."""

    def __init__(self, ops: Optional[Sequence[str]] = None, level: str = "full", clock: str = "wall"):
        if level not in _SIZES:
            raise ValueError(f"level must be one of {sorted(_SIZES)}, got {level!r}")
        if clock not in CLOCKS:
            raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
        self.clock = clock
        self.built = []
        for op in ops or registry.registered():
            registry.get(op)  # an unknown op lists the known ones
            self.built.extend(_build_case(op, inputs, build) for inputs, build in cases(op, level))
        self.best = [np.inf] * len(self.built)

    def run_round(self, budget_s: float = 0.05 / 3) -> None:
        self.run_cases(range(len(self.built)), budget_s)

    def run_cases(self, indices, budget_s: float = 0.05 / 3) -> None:
        """Time the cases `indices` once more (a slice of a round: a caller may spread a round over
        its own measurements, so that both see the same load, second by second)."""
        for i in indices:
            case = self.built[i]
            flush = FLUSH_BYTES if case[3] in WEIGHT_OPS else 0
            self.best[i] = min(self.best[i], _time_case(case, budget_s, flush, clock=CLOCKS[self.clock]))

    def samples(self) -> List[Sample]:
        if not all(np.isfinite(self.best)):
            raise RuntimeError("not every calibration case has been timed yet (run_round)")
        return [Sample(key, shape, flops, nbytes, sec) for (_, _, _, _, key, shape, flops, nbytes), sec
                in zip(self.built, self.best)]


def measure(ops: Optional[Sequence[str]] = None, level: str = "full", budget_s: float = 0.05,
            rounds: int = 3, clock: str = "wall") -> List[Sample]:
    """Time every case of every op (default: all registered ops calibration can build).

    The cases are timed in `rounds` passes over all of them, and each case keeps its least
    disturbed median: on a shared machine a burst of other work then slows one round of every
    case, not every round of a few cases (one such burst made a whole op's fit 1.8x too slow here)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    cal = Calibration(ops, level, clock)
    for _ in range(rounds):
        cal.run_round(budget_s / rounds)
    return cal.samples()


def _build_case(op: str, inputs: List[np.ndarray], build: Callable):
    g = Graph(seed=0)
    phs = [placeholder_in(g, a.dtype, a.shape, f"in{i}") for i, a in enumerate(inputs)]
    node = build(g, phs)
    # the CPU's kernels, whatever ISTHMUS_DEVICE says (`isthmus server --device gpu` sets it for its
    # process): a GPU profile is calibrate_gpu's
    sess = Session(g, parallel=False, optimize=False, device="cpu")
    feed = dict(zip(phs, inputs))
    c = op_cost(node)
    return (sess, feed, node, op, cost_key(node), "x".join(str(a.shape) for a in inputs), c.flops,
            c.bytes_read + c.bytes_written)


# Bytes written between two timed calls of a kernel: more than the private caches hold, so a
# kernel starts as it does inside a graph, where the nodes before it have evicted its weights
# from L1/L2 (a one-node graph timed in a loop keeps them there and runs up to 2x faster).
FLUSH_BYTES = 4 << 20
# Only products read weights that earlier nodes may have evicted; every other kernel reads what the
# node before it has just written (warm, as far as it fits the caches), so it is timed warm.
WEIGHT_OPS = frozenset({"MatMul", "FusedMatMul", "Conv2D", "FusedConv2D"})


def _time_case(case, budget_s: float, flush_bytes: int = FLUSH_BYTES, clock=time.perf_counter) -> float:
    """Median seconds of the node's kernel (by `clock`), each call after the private caches were flushed."""
    sess, feed, node, op = case[:4]
    fetch = node.outputs[0]
    sess.run(fetch, feed)  # compile and warm up
    plan = sess.plan_for(fetch, feed)
    (n,) = [m for m in plan.nodes if m.op == op]  # the node under test, not the feeds
    kernel = plan.kernels[n]
    values = {t.node.name: v for t, v in feed.items()}
    args = [values[t.node.name] if t.node.name in values else plan.constants[t] for t in n.inputs]
    flush = np.zeros(max(1, flush_bytes // 4), np.float32)
    t0 = time.perf_counter()
    if flush_bytes:
        flush += 1.0
    t1 = time.perf_counter()
    kernel(*args)
    t2 = time.perf_counter()
    repeats = int(np.clip(budget_s / max(t2 - t0, 1e-6), 5, 200))  # the budget pays for the flushes too
    samples = []
    for _ in range(repeats):
        if flush_bytes:
            flush += 1.0
        t0 = clock()
        kernel(*args)
        samples.append(clock() - t0)
    return max(float(np.median(samples)) - clock_floor(clock, 51), 1e-9)


def fit_coeffs(samples: Sequence[Sample]) -> Coeffs:
    """c0, c_flops, c_bytes >= 0 minimising the squared relative error."""
    t = np.array([s.seconds for s in samples])
    A = np.array([[1.0, s.flops, s.nbytes] for s in samples]) / t[:, None]
    scale = A.max(axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls(A / scale, np.ones(len(samples)))
    x = x / scale
    return (float(x[0]), float(x[1]), float(x[2]))


def fit(samples: Sequence[Sample], name: str, base: DeviceProfile = CLOUD) -> DeviceProfile:
    """A profile with one regression per measured op type and one over all of them."""
    by_op: Dict[str, List[Sample]] = {}
    for s in samples:
        by_op.setdefault(s.op, []).append(s)
    coeffs = {op: fit_coeffs(ss) for op, ss in by_op.items()}
    mm = [s.flops / s.seconds for s in samples if s.op == "MatMul"]
    mem = [s.nbytes / s.seconds for s in samples if s.flops <= s.nbytes]
    small = sorted(s.seconds for s in samples)[: max(1, len(samples) // 10)]
    return replace(base, name=name, op_coeffs=coeffs, default_coeffs=fit_coeffs(samples) if samples else None,
                   peak_flops=max(mm) if mm else base.peak_flops,
                   mem_bandwidth=max(mem) if mem else base.mem_bandwidth,
                   op_overhead=float(np.median(small)) if samples else base.op_overhead)


def errors(profile: DeviceProfile, samples: Sequence[Sample]) -> Dict[str, float]:
    """Mean absolute percentage error of the profile's predictions, per op type."""
    out: Dict[str, List[float]] = {}
    for s in samples:
        pred = profile.op_time(s.op, s.flops, s.nbytes)
        out.setdefault(s.op, []).append(abs(pred - s.seconds) / s.seconds)
    return {op: float(np.mean(v)) for op, v in out.items()}


def calibrate(device: str = "cloud", ops: Optional[Sequence[str]] = None, level: str = "full",
              slowdown: float = 1.0, path: Optional[str] = None, base: DeviceProfile = CLOUD,
              blas_threads: Optional[int] = None, clock: str = "wall") -> DeviceProfile:
    """Measure this machine and return (and optionally write) the device profile `device`.

    `slowdown` > 1 emulates a slower device (an edge 8x slower than this machine).
    `blas_threads` runs the kernels on that many BLAS threads (default: as the process has it);
    the profile records the count, and holds only for runs with the same (threads.py).
    """
    with limited_blas_threads(blas_threads):
        if clock == "cpu" and current_blas_threads() not in (1, None):
            raise ValueError("calibrate(clock='cpu') needs one BLAS thread (blas_threads=1): other BLAS "
                             "threads' time is not this thread's CPU time")
        profile = replace(fit(measure(ops, level, clock=clock), device, base), blas_threads=current_blas_threads())
    if slowdown != 1.0:
        profile = profile.scaled(slowdown, name=device)
    if path:
        profile.save(path)
    return profile


# ---- the `isthmus calibrate` command ------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cloud", help="name of the profile to write (default: cloud)")
    p.add_argument("--out", default=None, help="JSON file to write (default: <device>.json)")
    p.add_argument("--ops", nargs="*", default=None, help="op types to calibrate (default: all it can build)")
    p.add_argument("--quick", action="store_true", help="fewer shapes (a few seconds)")
    p.add_argument("--slowdown", type=float, default=1.0, help="emulate a device this many times slower")
    p.add_argument("--blas-threads", type=int, default=None,
                   help="BLAS threads while timing (default: the process's; ISTHMUS_BLAS_THREADS sets that). The "
                        "profile records it: predict runs with the same count")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="wall time, or this thread's CPU time (steadier on a shared machine; one BLAS thread only)")
    p.add_argument("--from-trace", nargs="+", default=None, metavar="TRACE",
                   help="refit from Chrome traces of real runs (RunMetadata.write_chrome_trace) instead of timing "
                        "kernels; see partitioner/trace_fit.py")
    p.add_argument("--base", default=None, help="with --from-trace: the profile JSON to refit (default: the built-in "
                                                 "cloud profile)")


def _run_from_trace(args) -> int:
    # cycle: partitioner.calibrate <-> partitioner.trace_fit
    from .trace_fit import TraceError, refit, report, samples_from_trace
    try:
        samples = samples_from_trace(args.from_trace)
        base = DeviceProfile.load(args.base) if args.base else CLOUD
    except (TraceError, OSError, ValueError) as e:
        print(f"isthmus profile: error: --from-trace: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if not samples:
        print("isthmus profile: error: --from-trace: the traces hold no node events with costs (trace with "
              "RunOptions(trace=True) and write them with RunMetadata.write_chrome_trace)", file=sys.stderr)
        return 2
    profile, how = refit(base, samples, name=args.device)
    out = args.out or f"{args.device}.json"
    profile.save(out)
    for op, r in report(base, profile, samples).items():
        print(f"  {op:28s} {r['events']:6d} events  {how[op]:14s} error {r['before']:8.1%} -> {r['after']:7.1%}")
    print(f"wrote {out}: refitted {len(how)} op types from {len(samples)} traced node events")
    return 0


def run(args) -> int:
    if args.from_trace:
        return _run_from_trace(args)
    if args.device.lower() == "gpu":
        if not gpu.gpu_available():
            raise SystemExit(f"isthmus calibrate --device gpu: no GPU available ({gpu.unavailable_reason()})")
        # cycle: partitioner.calibrate <-> partitioner.calibrate_gpu
        from .calibrate_gpu import calibrate_gpu  # the GPU's kernels and its host<->device copies
        profile = calibrate_gpu(args.device, args.ops, "quick" if args.quick else "full")
        out = args.out or f"{args.device}.json"
        profile.save(out)
        print(f"wrote {out}: GPU profile, {len(profile.op_coeffs)} op types")
        return 0
    with limited_blas_threads(args.blas_threads):
        if args.clock == "cpu" and current_blas_threads() not in (1, None):
            raise SystemExit("isthmus calibrate --clock cpu needs --blas-threads 1 (other BLAS threads' time "
                             "is not this thread's CPU time)")
        samples = measure(args.ops, "quick" if args.quick else "full", clock=args.clock)
        profile = replace(fit(samples, args.device), blas_threads=current_blas_threads())
    if args.slowdown != 1.0:
        profile = profile.scaled(args.slowdown, name=args.device)
    out = args.out or f"{args.device}.json"
    profile.save(out)
    err = errors(fit(samples, args.device), samples)
    print(f"wrote {out}: {len(profile.op_coeffs)} op types from {len(samples)} measurements; "
          f"mean abs error on them {np.mean(list(err.values())):.1%}")
    return 0
