"""A device profile of the edge interpreter's own kernels: the partitioner's calibration cases
written as edge models (int8 or fp32) and timed in isthmus's edge interpreter.

    profile = calibrate_edge("phone-int8", int8=True, slowdown=8.0)   # a DeviceProfile
    profile.save("phone-int8.json")        # isthmus split ... --int8 --edge-profile phone-int8.json

An int8 edge part runs the interpreter's int8 kernels (edge/int8_kernels.py: compiled int8 GEMMs,
depthwise loops, requantization), not the core Session's float32 kernels a plain `isthmus profile`
times: issue 27 measured the int8 MobileNetV2-96 at 0.7-0.95x and SqueezeNet's fire modules at up
to 1.6x what the float32 regression said. This times calibrate.py's one-node graphs (the same
shapes, fire-module and bottleneck convolutions among them, the same cost keys by op family: dense,
pointwise and grouped convolutions, the products by row regime, elementwise, pooling) as edge
models, with the node's weights as constants as a deployed model has them, quantized when int8.
Only the node's own kernel is timed: the Quantize/Dequantize steps at its borders are the part's
cost (partitioner/part_cost.py, `isthmus profile --parts`). An op without an int8 kernel keeps its
fp32 kernel inside an int8 model, and is timed as that. Kernels run on one thread, CPU time, each
after the private caches are flushed when it reads weights (calibrate.py's rule); the same fit.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import List, Optional, Sequence, Tuple

import numpy as np

from isthmus.core.session import Session
from isthmus.edge.interpreter import Interpreter
from isthmus.partitioner import calibrate as cal
from isthmus.partitioner.costmodel import cost_key, op_cost
from isthmus.partitioner.devices import EDGE, MEMORY, DeviceProfile
from isthmus.partitioner.threads import limited_blas_threads

from .edge_export import to_edge
from .litert_profile import case_graph
from .quantize import quantize_to_edge

OPS = ("Conv2D", "FusedConv2D", "MatMul", "FusedMatMul", "Add", "MaxPool", "AvgPool", "GlobalAvgPool", "BatchNorm",
       "BiasAdd", "Relu", "Relu6", "Concat")
BORDERS = ("Quantize", "Dequantize")


def _edge_model(g, live, values, node, int8: bool) -> bytes:
    out = [node.outputs[0]]
    if not int8:
        return to_edge(g, out, inputs=live)
    feeds = [{t.node.name: v for t, v in zip(live, values)}]
    data, _ = quantize_to_edge(Session(g, optimize=False), out, feeds)
    return data


def _time(data: bytes, values: Sequence[np.ndarray], op: str, budget_s: float) -> float:
    """Median CPU seconds of the node's own steps (the quantizer's borders left out)."""
    it = Interpreter(data)
    mine = [kind == "op" and name not in BORDERS for kind, name in it.steps_info]
    steps = [s for _, s in it.kernels]
    flush = np.zeros(cal.FLUSH_BYTES // 4 if op in cal.WEIGHT_OPS else 1, np.float32)
    it.invoke(*values)
    t0 = time.perf_counter()
    it.invoke(*values)
    repeats = int(np.clip(budget_s / max(time.perf_counter() - t0, 1e-6), 5, 200))
    samples = []
    for _ in range(repeats):
        it.set_inputs(*values)
        flush += 1.0
        total = 0.0
        for step, m in zip(steps, mine):
            c = time.thread_time()
            step()
            if m:
                total += time.thread_time() - c
        samples.append(total)
    return max(float(np.median(samples)) - cal.clock_floor(time.thread_time, 51) * sum(mine), 1e-9)


def measure_edge(ops: Optional[Sequence[str]] = None, level: str = "quick", int8: bool = True,
                 budget_s: float = 0.03, rounds: int = 3) -> List[cal.Sample]:
    """Samples (cost key, shapes, FLOPs, bytes, seconds) of every case of `ops` run in the edge
    interpreter; each case keeps its fastest median over `rounds` passes over all of them (a burst of
    other work slows one pass; this VM's speed moves 1.5-1.8x for seconds at a time: three passes, as
    the core calibration's, leave a case fewer ways to fall in such a stretch every time)."""
    return [s for s, _ in _measure(ops, level, int8, budget_s, rounds)]


def _build(ops, level: str, int8: bool) -> list:
    """Every calibration case of `ops` as an edge model: (model bytes, input values, op, cost key,
    shapes, FLOPs, bytes, output elements, weight elements)."""
    built = []
    for op in ops or OPS:
        for inputs, build in cal.cases(op, level):
            g, live, values, node = case_graph(op, inputs, build)
            c = op_cost(node)
            weights = int(np.prod(node.inputs[1].shape)) if op in cal.WEIGHT_OPS and len(node.inputs) > 1 else 0
            built.append((_edge_model(g, live, values, node, int8), values, op, cost_key(node),
                          "x".join(str(a.shape) for a in inputs), c.flops, c.bytes_read + c.bytes_written,
                          int(np.prod(node.outputs[0].shape)), weights))
    return built


def _measure(ops, level: str, int8: bool, budget_s: float = 0.03, rounds: int = 3,
             built: Optional[list] = None) -> List[Tuple[cal.Sample, int]]:
    """measure_edge's samples, each with its node's output elements (`built`: _build's, else built here)."""
    built = _build(ops, level, int8) if built is None else built
    best = [float("inf")] * len(built)
    with limited_blas_threads(1):
        for _ in range(rounds):
            for k, (data, values, op, *_rest) in enumerate(built):
                best[k] = min(best[k], _time(data, values, op, budget_s / rounds))
    return [(cal.Sample(key, shape, flops, nbytes, sec), out)
            for (_, _, _, key, shape, flops, nbytes, out, _), sec in zip(built, best)]


def fused_share(profile: DeviceProfile, measured: Sequence[Tuple[cal.Sample, int]], default: float = 1.0) -> float:
    """What a bias and an activation fused into a convolution cost in the interpreter, as a share of
    their own prices (DeviceProfile.fused_steps): the median over the calibration's shapes of (the
    FusedConv2D case less the Conv2D case of the same shapes) / (BiasAdd + Relu6 priced on its
    output), at least 0; `default` unless both convolutions and both steps were timed. The int8
    kernels requantize with the bias and the clamp in one pass: there the fused steps cost about nothing."""
    if not {"BiasAdd", "Relu6"} <= set(profile.op_coeffs):
        return default
    plain = {(s.op.partition(":")[2], s.shape): s for s, _ in measured if s.op.split(":")[0] == "Conv2D"}
    shares = []
    for s, elems in measured:
        base, _, variant = s.op.partition(":")
        p = plain.get((variant, s.shape.rsplit("x", 1)[0])) if base == "FusedConv2D" else None
        if p is None:
            continue
        priced = profile.op_time("BiasAdd", elems, 3 * 4 * elems) + profile.op_time("Relu6", elems, 2 * 4 * elems)
        if priced > 0:
            shares.append(max(s.seconds - p.seconds, 0.0) / priced)
    return float(np.median(shares)) if shares else default


def _stream_chain(int8: bool, convs: int):
    """An edge model of `convs` few-pixel 1x1 convolutions (256 -> 1024 -> 256 ... channels at 2x2, as
    ResNet-shaped's last stage): their time is their weights' reads; and the weight elements of each."""
    import isthmus as ism  # deferred: the graph builders, only for this calibration
    rng = np.random.default_rng(0)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (1, 256, 2, 2), name="x")
        h = x
        for i in range(convs):
            cin, cout = (256, 1024) if i % 2 == 0 else (1024, 256)
            w = (rng.standard_normal((cout, cin, 1, 1)) * np.sqrt(2.0 / cin)).astype(np.float32)
            h = ism.relu(ism.bias_add(ism.conv2d(h, ism.constant(w)), ism.constant(np.zeros(cout, np.float32)), axis=1))
        y = ism.identity(h, name="y")
    values = [rng.standard_normal((1, 256, 2, 2)).astype(np.float32)]
    return _edge_model(g, [x], values, y.node, int8), values, 256 * 1024 + 512


def fit_ramp(points: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    """(lo, hi) weight elements of fraction = clamp((weights - lo) / (hi - lo), 0, 1), least squares
    over (weights, fraction) points, both ends on a grid of 1/64ths of the largest weights."""
    pts = sorted((float(w), float(f)) for w, f in points)
    ws, fs = np.array([w for w, _ in pts]), np.array([f for _, f in pts])
    grid = np.linspace(0.0, ws[-1], 65)
    best = (float("inf"), 0.0, 0.0)
    for i, lo in enumerate(grid[:-1]):
        for hi in grid[i + 1:]:
            sse = float(((np.clip((ws - lo) / (hi - lo), 0.0, 1.0) - fs) ** 2).sum())
            if sse < best[0]:
                best = (sse, float(lo), float(hi))
    return best[1], best[2]


# the cycles measure_weight_streaming times (convolutions of 262K weights each): dense from 12 to 30
# (3.1M-7.9M weights), where the weights stop fitting the cache and a 6.0M-weight network sits, and
# beyond, where every convolution reads its weights from memory (measured here: 45 us each up to 3.1M,
# 62 at 4.2M, 86 at 5.2M, 101 at 6.3M, 100-106 from there to 12.6M)
SIZES = (2, 4, 8, 12, 16, 18, 20, 22, 24, 26, 28, 30, 36, 42, 48)


def measure_weight_streaming(int8: bool = True, convs: int = 48, rounds: int = 7) -> Tuple[float, float]:
    """(DeviceProfile.weight_cache, weight_cache_hi) of the edge interpreter here: a cycle of the first
    P of `convs` weight-bound convolutions (_stream_chain), each P timed hot in a loop (CPU time, one
    thread, the median of `rounds` passes; the cycles of `SIZES`); what a convolution takes beyond its
    time in the smallest cycle (its weights in the shared cache, as the one-node calibration finds
    them), as a fraction of that beyond in the largest cycles (every weight from memory), against the
    cycle's weight elements, fitted as a ramp (fit_ramp). (0, 0) where the largest cycles take under
    5% more than the smallest: no cache edge measured."""
    data, values, per_conv = _stream_chain(int8, convs)
    it = Interpreter(data)
    mine = [k for k, (kind, op) in enumerate(it.steps_info) if kind == "op" and op not in BORDERS]
    steps = [s for _, s in it.kernels]
    it.invoke(*values)
    sizes = sorted({p for p in SIZES + (convs,) if p <= min(convs, len(mine))})
    per: dict = {p: [] for p in sizes}
    with limited_blas_threads(1):
        for _ in range(rounds):
            for p in sizes:
                cycle = [steps[k] for k in mine[:p]]
                for step in cycle:
                    step()
                times = []
                for _ in range(max(3, 96 // p)):
                    c = time.thread_time()
                    for step in cycle:
                        step()
                    times.append(time.thread_time() - c)
                per[p].append(float(np.median(times)) / p)
    # per pass (a pass takes a fraction of a second: one speed state of this VM), the fraction of the
    # largest cycles' extra; then the median pass: what the shared cache holds depends on the neighbours
    largest = sizes[-max(2, len(sizes) // 5):]
    fracs: dict = {p: [] for p in sizes}
    tops = []
    for r in range(rounds):
        base = per[sizes[0]][r]
        top = float(np.median([per[p][r] for p in largest])) - base
        tops.append(top / base)
        for p in sizes:
            fracs[p].append(min(max((per[p][r] - base) / top, 0.0), 1.5) if top > 0 else 0.0)
    if float(np.median(tops)) < 0.05:
        return 0.0, 0.0
    return fit_ramp([(p * per_conv, float(np.median(fracs[p]))) for p in sizes])


# the weight-bound cost keys: few output pixels, so a convolution's time is its weights' read (ResNet-
# shaped's 2x2 and 4x4 stages ran 1.2-2.2x their one-node time inside the whole 6.0M-weight model)
STREAMED_KEYS = ("Conv2D:narrow", "FusedConv2D:narrow")
STREAM_WEIGHTS = 12e6  # weight elements a streamed case's copies hold together: past the cache's edge


def measure_streamed(built: list, rounds: int = 3) -> List[cal.Sample]:
    """Samples "<key>@memory" of _build's cases of STREAMED_KEYS timed with their weights from memory:
    copies of the case's edge model (each interpreter packs its own weights), as many as hold
    STREAM_WEIGHTS elements, run in a cycle; per case the fastest over `rounds` passes over all of
    them of the median cycle's seconds per copy (CPU time, one thread)."""
    cases = [b for b in built if b[3] in STREAMED_KEYS and b[8] > 0]
    best = [float("inf")] * len(cases)
    cycles = []
    for data, values, *_rest in cases:
        copies = max(4, int(np.ceil(STREAM_WEIGHTS / _rest[-1])))
        its = [Interpreter(data) for _ in range(copies)]
        steps = []
        for it in its:
            it.invoke(*values)
            steps += [s for (kind, name), (_, s) in zip(it.steps_info, it.kernels) if kind == "op" and name not in BORDERS]
        cycles.append((steps, copies))
    with limited_blas_threads(1):
        for _ in range(rounds):
            for k, (steps, copies) in enumerate(cycles):
                times = []
                for _ in range(4):
                    c = time.thread_time()
                    for step in steps:
                        step()
                    times.append(time.thread_time() - c)
                best[k] = min(best[k], float(np.median(times[1:])) / copies)  # the first warms the code
    return [cal.Sample(key + MEMORY, shape, flops, nbytes, sec)
            for (_, _, _, key, shape, flops, nbytes, _, _), sec in zip(cases, best)]


def with_weights_from_memory(profile: DeviceProfile, built: list, int8: bool = True) -> DeviceProfile:
    """`profile` with the weights a part reads from memory priced (DeviceProfile.weight_fraction,
    streamed_extra): the cache's edge from measure_weight_streaming, a "<key>@memory" regression per
    STREAMED_KEYS key from measure_streamed on `built`'s cases (_build's). The older whole-part term
    (weight_stream_s) is left at 0."""
    lo, hi = measure_weight_streaming(int8)
    by: dict = {}
    for smp in measure_streamed(built):
        by.setdefault(smp.op, []).append(smp)
    coeffs = {op: cal.fit_coeffs(ss) for op, ss in by.items()}
    return replace(profile, op_coeffs={**profile.op_coeffs, **coeffs}, weight_stream_s=0.0, weight_cache=lo,
                   weight_cache_hi=hi)


def calibrate_edge(device: str = "edge-int8", ops: Optional[Sequence[str]] = None, level: str = "quick",
                   int8: bool = True, slowdown: float = 1.0, base: DeviceProfile = EDGE,
                   path: Optional[str] = None) -> DeviceProfile:
    """The profile of the edge interpreter on this machine (int8 or fp32 models; `slowdown` > 1: a
    device that many times slower), with `base`'s kernel table, memory budget, client and part."""
    built = _build(ops, level, int8)
    measured = _measure(ops, level, int8, built=built)
    profile = replace(cal.fit([s for s, _ in measured], device, base), blas_threads=1)
    profile = replace(profile, fused_steps=fused_share(profile, measured, profile.fused_steps))
    profile = with_weights_from_memory(profile, built, int8)
    if slowdown != 1.0:
        profile = profile.scaled(slowdown, name=device)
    if path:
        profile.save(path)
    return profile


__all__ = ["calibrate_edge", "measure_edge", "fused_share", "fit_ramp", "measure_weight_streaming", "measure_streamed",
           "with_weights_from_memory", "OPS", "STREAMED_KEYS"]
