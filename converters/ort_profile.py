"""A device profile for onnxruntime: the partitioner's calibration cases timed as isthmus's ONNX edge parts.

    profile = calibrate_ort("phone-ort", slowdown=4.0)      # a DeviceProfile
    profile.save("phone-ort.json")     # isthmus split ... --edge-format onnx --edge-profile phone-ort.json

The counterpart of litert_profile.py for an edge part that ONNX Runtime runs (split --edge-format
onnx): the same one-node graphs (same shapes, cost keys and fit, the node's weights as constants),
each written the way the edge part is written (converters/edge_export.to_edge, then
onnx_edge.edge_to_onnx) and timed in an onnxruntime CPU session on `threads` intra-op threads, less
what one run() of an empty model costs (paid once per part, not once per node).
The profile keeps the edge's kernel table; only its prices change. Needs onnxruntime.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import List, Optional, Sequence

import numpy as np

from isthmus.partitioner import calibrate as cal
from isthmus.partitioner.costmodel import cost_key, op_cost
from isthmus.partitioner.devices import EDGE, DeviceProfile

from .edge_export import to_edge
from .litert_profile import OPS, case_graph
from .onnx_edge import edge_to_onnx


def run_floor(threads: int = 1, budget_s: float = 0.05) -> float:
    """What one session.run of a one-Identity model costs (onnxruntime's per-call cost from Python, ~9 us
    here): paid once per edge part, not per node, so it is taken off every case's time."""
    from onnx import TensorProto, helper  # deferred: onnx is heavy
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "y")]
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "floor", info[:1], info[1:])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return _time(m.SerializeToString(), [np.zeros(1, np.float32)], budget_s, threads)


def _time(model: bytes, values: Sequence[np.ndarray], budget_s: float, threads: int) -> float:
    import onnxruntime as ort  # deferred: onnxruntime is heavy and optional
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: v for i, v in zip(sess.get_inputs(), values)}
    sess.run(None, feeds)
    t0 = time.perf_counter()
    sess.run(None, feeds)
    once = time.perf_counter() - t0
    samples = []
    for _ in range(int(np.clip(budget_s / max(once, 1e-6), 5, 200))):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        samples.append(time.perf_counter() - t0)
    return max(float(np.median(samples)) - cal.clock_floor(time.perf_counter, 51), 1e-9)


def measure_ort(ops: Optional[Sequence[str]] = None, level: str = "quick", budget_s: float = 0.03,
                rounds: int = 2, threads: int = 1) -> List[cal.Sample]:
    """Samples of every case of `ops` run in onnxruntime; each keeps its fastest median over `rounds`."""
    built = []
    for op in ops or OPS:
        for inputs, build in cal.cases(op, level):
            g, live, values, node = case_graph(op, inputs, build)
            c = op_cost(node)
            model = edge_to_onnx(to_edge(g, [node.outputs[0]], inputs=live)).SerializeToString()
            built.append((model, values, cost_key(node), "x".join(str(a.shape) for a in inputs), c.flops,
                          c.bytes_read + c.bytes_written))
    best = [float("inf")] * len(built)
    floor = float("inf")
    for _ in range(rounds):
        floor = min(floor, run_floor(threads))
        for k, b in enumerate(built):
            best[k] = min(best[k], _time(b[0], b[1], budget_s / rounds, threads))
    best = [max(t - floor, 1e-9) for t in best]
    return [cal.Sample(key, shape, flops, nbytes, sec) for (_, _, key, shape, flops, nbytes), sec in zip(built, best)]


def calibrate_ort(device: str = "edge-ort", ops: Optional[Sequence[str]] = None, level: str = "quick",
                  slowdown: float = 1.0, threads: int = 1, base: DeviceProfile = EDGE,
                  path: Optional[str] = None) -> DeviceProfile:
    """The profile of onnxruntime on this machine (`slowdown` > 1: a device that many times slower)."""
    profile = replace(cal.fit(measure_ort(ops, level, threads=threads), device, base), blas_threads=threads)
    if slowdown != 1.0:
        profile = profile.scaled(slowdown, name=device)
    if path:
        profile.save(path)
    return profile


__all__ = ["calibrate_ort", "measure_ort", "run_floor"]
