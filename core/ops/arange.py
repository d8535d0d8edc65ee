"""Range: start, start + delta, ... up to (not including) limit, from three run-time scalars."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import fmt
from .base import convert, convert_pair, make

__all__ = ["arange"]

MAX_RANGE = 1 << 27  # a larger result (1 GiB of int64) is a malformed model, not a real request


def range_length(start, limit, delta) -> int:
    """How many elements Range(start, limit, delta) has; a 0 delta or an oversized range is an error.
    The ONNX importer folds constant Ranges with it (converters/onnx_shapes.py, onnx_fold.py)."""
    if delta == 0:
        raise ValueError("Range: delta is 0")
    n = max(int(math.ceil((float(limit) - float(start)) / float(delta))), 0)
    if n > MAX_RANGE:
        raise ValueError(f"Range: {start} to {limit} by {delta} has {n} elements (more than {MAX_RANGE})")
    return n


def _infer_range(node):
    ts = node.inputs
    if any(t.shape != () for t in ts) or len({t.dtype for t in ts}) != 1 or ts[0].dtype.kind not in "fiu":
        raise ShapeError("Range needs three numeric scalars of one dtype, got "
                         + ", ".join(f"{t.dtype.name}{fmt(t.shape)}" for t in ts))
    vals = [t.node.attrs["value"] if t.node.op == "Const" else None for t in ts]
    n = range_length(*vals) if all(v is not None for v in vals) else None
    return [(ts[0].dtype, (n,))]


def _kernel_range(node, ctx):
    xp = ctx.xp
    dtype = node.outputs[0].dtype

    def run(start, limit, delta):
        n = range_length(start, limit, delta)
        # ONNX: output[i] = start + i * delta, in the inputs' dtype
        return (xp.arange(n, dtype=dtype) * dtype.type(delta) + dtype.type(start)).astype(dtype, copy=False)
    return run


def range_values(start, limit, delta) -> np.ndarray:
    """Range's result for known scalars, in start's dtype (the importer's constant folding)."""
    start, limit, delta = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    return (np.arange(range_length(start, limit, delta), dtype=start.dtype) * delta + start).astype(start.dtype)


register(OpDef("Range", inputs=("start", "limit", "delta"), infer=_infer_range, kernel=_kernel_range,
               cost=lambda node: Cost(0, 0, 0), doc="start + i * delta for i in [0, ceil((limit - start) / delta))."))


def arange(start, limit, delta=1, name: Optional[str] = None) -> Tensor:
    start, limit = convert_pair(start, limit)
    start, delta = convert_pair(start, delta)
    return make("Range", (start, convert(limit), convert(delta)), name=name).outputs[0]
