"""A device profile for LiteRT: the partitioner's calibration cases timed as .tflite files in LiteRT.

    profile = calibrate_litert("phone-litert", level="quick", slowdown=4.0)   # a DeviceProfile
    profile.save("phone-litert.json")        # isthmus split ... --edge-profile phone-litert.json

A split whose edge part runs in LiteRT should be priced by LiteRT's speed, not by isthmus's
interpreter's (LiteRT ran the W2 CNN's int8 file in half the interpreter's time here). This times
partitioner/calibrate.py's one-node graphs (same shapes, same cost keys, same fit) written by
tflite_write_graph.graph_to_tflite, with the node's weights as constants as a deployed model has
them, each invoke on `threads` LiteRT threads, and fits the same regression (calibrate.fit). The
profile keeps the edge's kernel table (what isthmus can export for the edge), only its prices change.
Needs ai-edge-litert. `isthmus profile --runtime litert` (apps/cmd_profile.py) calls this.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import List, Optional, Sequence

import numpy as np

from isthmus.core.graph import Graph
from isthmus.partitioner import calibrate as cal
from isthmus.partitioner.costmodel import cost_key, op_cost
from isthmus.partitioner.devices import EDGE, DeviceProfile

from .tflite_write import read_metadata
from .tflite_write_graph import graph_to_tflite

OPS = ("MatMul", "FusedMatMul", "Conv2D", "FusedConv2D", "MaxPool", "AvgPool", "GlobalAvgPool", "BatchNorm",
       "BiasAdd", "Add", "Sub", "Mul", "Relu", "Relu6", "Tanh", "Sigmoid")
WEIGHTS = {"MatMul": 1, "FusedMatMul": 1, "Conv2D": 1, "FusedConv2D": 1, "BatchNorm": 1, "BiasAdd": 1}


def case_graph(op: str, inputs: List[np.ndarray], build):
    """(graph, live placeholders, their values, node): inputs from WEIGHTS[op] on are constants."""
    g = Graph(seed=0)
    first_const = WEIGHTS.get(op, len(inputs))
    ins, live, values = [], [], []
    for i, a in enumerate(inputs):
        if i >= first_const:
            ins.append(g.add_node("Const", (), {"value": a}, name=f"w{i}").outputs[0])
        else:
            t = cal.placeholder_in(g, a.dtype, a.shape, f"in{i}")
            ins.append(t)
            live.append(t)
            values.append(a)
    return g, live, values, build(g, ins)


def _time(data: bytes, values: Sequence[np.ndarray], budget_s: float, threads: int) -> float:
    from ai_edge_litert.interpreter import Interpreter  # deferred: ai_edge_litert is a heavy or optional dependency
    it = Interpreter(model_content=data, num_threads=threads)
    it.allocate_tensors()
    for d, v, m in zip(it.get_input_details(), values, read_metadata(data)["inputs"]):
        it.set_tensor(d["index"], np.ascontiguousarray(v.transpose(0, 2, 3, 1) if m["layout"] == "NHWC" else v))
    it.invoke()
    t0 = time.perf_counter()
    it.invoke()
    once = time.perf_counter() - t0
    samples = []
    for _ in range(int(np.clip(budget_s / max(once, 1e-6), 5, 200))):
        t0 = time.perf_counter()
        it.invoke()
        samples.append(time.perf_counter() - t0)
    return max(float(np.median(samples)) - cal.clock_floor(time.perf_counter, 51), 1e-9)


def measure_litert(ops: Optional[Sequence[str]] = None, level: str = "quick", budget_s: float = 0.03,
                   rounds: int = 2, threads: int = 1) -> List[cal.Sample]:
    """Samples (cost key, shapes, FLOPs, bytes, seconds) of every case of `ops` run in LiteRT; each
    case keeps its fastest median over `rounds` passes (a burst of other work slows one round)."""
    built = []
    for op in ops or OPS:
        for inputs, build in cal.cases(op, level):
            g, live, values, node = case_graph(op, inputs, build)
            c = op_cost(node)
            built.append((op, graph_to_tflite(g, [node.outputs[0]]), values, cost_key(node),
                          "x".join(str(a.shape) for a in inputs), c.flops, c.bytes_read + c.bytes_written))
    best = [float("inf")] * len(built)
    for _ in range(rounds):
        for k, b in enumerate(built):
            best[k] = min(best[k], _time(b[1], b[2], budget_s / rounds, threads))
    return [cal.Sample(key, shape, flops, nbytes, sec) for (_, _, _, key, shape, flops, nbytes), sec in zip(built, best)]


def calibrate_litert(device: str = "edge-litert", ops: Optional[Sequence[str]] = None, level: str = "quick",
                     slowdown: float = 1.0, threads: int = 1, base: DeviceProfile = EDGE,
                     path: Optional[str] = None) -> DeviceProfile:
    """The profile of LiteRT on this machine (`slowdown` > 1: a device that many times slower),
    with `base`'s kernel table and memory budget."""
    profile = cal.fit(measure_litert(ops, level, threads=threads), device, base)
    profile = replace(profile, blas_threads=threads)
    if slowdown != 1.0:
        profile = profile.scaled(slowdown, name=device)
    if path:
        profile.save(path)
    return profile


__all__ = ["calibrate_litert", "measure_litert", "case_graph", "OPS"]
