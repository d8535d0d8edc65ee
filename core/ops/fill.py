"""Tensors made to a shape: Shape (a tensor's shape as a tensor), Fill / zeros / ones, Tile,
BroadcastTo and OneHot (array.py holds the layout ops they build on)."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import ShapeError
from ..graph import Tensor
from ..registry import OpDef, elementwise_cost, register
from ..shapes import as_shape, fmt, fully_defined
from .base import constant, convert
from .array import FREE_COST, _ints, first_output, static_value
from .math import reduce_sum_like

__all__ = ["shape", "fill", "zeros", "ones", "tile", "broadcast_to", "one_hot"]


# ---- Shape, Fill, zeros, ones -------------------------------------------------------------------------
def _infer_shape(node):
    if node.attrs["out_type"].kind not in "iu":
        raise ShapeError(f"shape out_type must be an integer dtype, got {node.attrs['out_type'].name}")
    return [(node.attrs["out_type"], (len(node.inputs[0].shape),))]


register(OpDef("Shape", inputs=("x",), attrs={"out_type": _dt.int32}, infer=_infer_shape,
               kernel=lambda node, ctx: (lambda x, d=node.attrs["out_type"], a=ctx.xp.asarray: a(x.shape, dtype=d)),
               grad=lambda node, dys: [None], cost=FREE_COST, doc="The run-time shape of x as a 1-D int tensor."))


def shape(x, out_type="int32", name=None) -> Tensor:
    return first_output("Shape", (convert(x),), {"out_type": _dt.as_dtype(out_type)}, name=name)


def _infer_fill(node):
    s = node.inputs[0]
    if s.dtype.kind not in "iu" or len(s.shape) != 1 or s.shape[0] is None:
        raise ShapeError(f"fill shape must be a 1-D integer tensor of known length, got {s.dtype.name}{fmt(s.shape)}")
    v = static_value(s) or (None,) * s.shape[0]
    if any(d is not None and d < 0 for d in v):
        raise ShapeError(f"fill shape {v} has a negative dim")
    return [(node.attrs["dtype"], tuple(v))]


def _kernel_fill(node, ctx):
    full, v, d = ctx.xp.full, node.attrs["value"], node.attrs["dtype"]
    out = node.outputs[0].shape
    if fully_defined(out):
        return lambda s: full(out, v, dtype=d)
    return lambda s: full(tuple(s.tolist()), v, dtype=d)


register(OpDef("Fill", inputs=("shape",), attrs={"value": 0, "dtype": _dt.float32}, infer=_infer_fill,
               kernel=_kernel_fill, grad=lambda node, dys: [None], cost=elementwise_cost(0)))


def fill(shape, value, dtype="float32", name=None) -> Tensor:
    """A tensor of `shape` (ints, or a 1-D int tensor such as shape(x)) filled with `value`."""
    if not isinstance(shape, Tensor):
        shape = constant(np.asarray(shape, dtype=np.int32).reshape(-1), dtype="int32")
    return first_output("Fill", (shape,), {"value": value, "dtype": _dt.as_dtype(dtype)}, name=name)


def zeros(shape, dtype="float32", name=None) -> Tensor:
    return fill(shape, 0, dtype, name=name)


def ones(shape, dtype="float32", name=None) -> Tensor:
    return fill(shape, 1, dtype, name=name)


# ---- Tile, BroadcastTo, OneHot --------------------------------------------------------------------------
def _infer_tile(node):
    x = node.inputs[0]
    m = node.attrs["multiples"]
    if len(m) != len(x.shape):
        raise ShapeError(f"{len(m)} multiples for rank {len(x.shape)}")
    if any(k < 0 for k in m):
        raise ShapeError(f"negative multiple in {m}")
    return [(x.dtype, tuple(None if d is None else d * k for d, k in zip(x.shape, m)))]


def _kernel_tile_grad(node, ctx):
    m = node.attrs["multiples"]
    axes = tuple(range(0, 2 * len(m), 2))

    def run(dy, x):  # tile lays copies out as [k0, d0, k1, d1, ...]: sum the k axes
        return dy.reshape([v for kd in zip(m, x.shape) for v in kd]).sum(axis=axes)
    return run


register(OpDef("Tile", inputs=("x",), attrs={"multiples": ()}, infer=_infer_tile,
               kernel=lambda node, ctx: (lambda x, m=node.attrs["multiples"], t=ctx.xp.tile: t(x, m)),
               grad=lambda node, dys: [first_output("TileGrad", (dys[0], node.inputs[0]), {"multiples": node.attrs["multiples"]})],
               cost=elementwise_cost(0)))
register(OpDef("TileGrad", inputs=("dy", "x"), attrs={"multiples": ()},
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[1].shape)], kernel=_kernel_tile_grad,
               cost=elementwise_cost(1)))


def tile(x, multiples, name=None) -> Tensor:
    return first_output("Tile", (convert(x),), {"multiples": _ints(multiples, "multiples")}, name=name)


def _infer_broadcast_to(node):
    x, target = node.inputs[0], node.attrs["shape"]
    if not fully_defined(target):
        raise ShapeError(f"broadcast_to target {fmt(target)} must be fully known")
    lead = len(target) - len(x.shape)
    if lead < 0 or any(d not in (None, 1, t) for d, t in zip(x.shape, target[lead:])):
        raise ShapeError(f"cannot broadcast {fmt(x.shape)} to {fmt(target)}")
    return [(x.dtype, target)]


def _g_broadcast_to(node, dys):
    return [reduce_sum_like(dys[0], node.inputs[0])]


register(OpDef("BroadcastTo", inputs=("x",), attrs={"shape": ()}, infer=_infer_broadcast_to,
               kernel=lambda node, ctx: (lambda x, s=node.attrs["shape"], b=ctx.xp.broadcast_to: b(x, s)),
               grad=_g_broadcast_to, cost=FREE_COST, doc="A read-only broadcast view of x."))


def broadcast_to(x, shape, name=None) -> Tensor:
    return first_output("BroadcastTo", (convert(x),), {"shape": as_shape(shape)}, name=name)


def _infer_one_hot(node):
    idx = node.inputs[0]
    if idx.dtype.kind not in "iu":
        raise ShapeError(f"one_hot indices must be integers, got {idx.dtype.name}")
    if node.attrs["depth"] < 0:
        raise ShapeError(f"one_hot depth {node.attrs['depth']} is negative")
    return [(node.attrs["dtype"], idx.shape + (node.attrs["depth"],))]


def _kernel_one_hot(node, ctx):
    classes, dt = ctx.xp.arange(node.attrs["depth"]), node.attrs["dtype"]
    return lambda idx: (idx[..., None] == classes).astype(dt)


register(OpDef("OneHot", inputs=("indices",), attrs={"depth": 0, "dtype": _dt.float32}, infer=_infer_one_hot,
               kernel=_kernel_one_hot, grad=lambda node, dys: [None], cost=elementwise_cost(1),
               doc="indices[..., None] == arange(depth); an index outside [0, depth) gives a zero row."))


def one_hot(indices, depth: int, dtype="float32", name=None) -> Tensor:
    return first_output("OneHot", (convert(indices),), {"depth": int(depth), "dtype": _dt.as_dtype(dtype)}, name=name)
