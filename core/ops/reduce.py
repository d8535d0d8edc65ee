"""Reductions: sum, mean, max, min over axes (with keepdims), and argmax/argmin.

Gradients: sum broadcasts dy back; mean also divides by the reduced count (taken at run time
when a reduced dim is unknown); max and min send dy to the positions holding the extreme value,
split evenly between ties (as TensorFlow does), so the gradient still sums to dy.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .. import dtypes as _dt
from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import normalize_axis, num_elements_est
from .base import constant, convert, make
from .math import broadcast_like, mul

__all__ = ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "argmax", "argmin"]


def _axes(node) -> tuple:
    """The normalised, sorted axes of a reduction (all axes when the attribute is None)."""
    rank = len(node.inputs[0].shape)
    axis = node.attrs["axis"]
    if axis is None:
        return tuple(range(rank))
    return tuple(sorted({normalize_axis(a, rank) for a in axis}))


def _infer_reduce(node):
    x = node.inputs[0]
    if x.dtype == _dt.bool_:
        raise ShapeError("cannot reduce a bool tensor; cast it first")
    if not x.shape and node.attrs["axis"]:
        raise ShapeError(f"cannot reduce a scalar over axes {node.attrs['axis']}")
    axes = _axes(node)
    if node.op in ("ReduceMax", "ReduceMin") and any(x.shape[a] == 0 for a in axes):
        raise ShapeError(f"{node.op} over an empty axis of {x.shape} has no value")
    keep = node.attrs["keepdims"]
    return [(x.dtype, tuple((1 if i in axes else d) for i, d in enumerate(x.shape) if keep or i not in axes))]


def _kernel_reduce(node, ctx):
    xp = ctx.xp
    axes, keep, dt = _axes(node), node.attrs["keepdims"], node.outputs[0].dtype
    if node.op == "ReduceSum":  # dtype=: numpy would sum int32 into int64
        run = (lambda x, f=xp.sum: f(x, axis=axes, keepdims=keep, dtype=dt))
    elif node.op == "ReduceMean" and xp is np and dt.kind == "f" and node.inputs[0].dtype == dt:
        run = _float_mean(axes, keep)
    elif node.op == "ReduceMean":  # integer means truncate, as in TensorFlow
        run = (lambda x, f=xp.mean: f(x, axis=axes, keepdims=keep).astype(dt, copy=False))
    else:
        f = xp.max if node.op == "ReduceMax" else xp.min
        run = (lambda x: f(x, axis=axes, keepdims=keep))
    if node.outputs[0].shape == ():  # numpy returns a scalar, not a 0-d array, for a full reduction
        return lambda x, a=xp.asarray: a(run(x))
    return run


def _float_mean(axes, keep):
    """numpy's mean of a float array without its Python wrapper (a few microseconds a call): the
    same float sum, then the same division by the count, so the same bits."""
    def run(x):
        total = np.add.reduce(x, axis=axes, keepdims=keep)
        count = 1
        for a in axes:
            count *= x.shape[a]
        if not isinstance(total, np.ndarray):  # a full reduction gives a numpy scalar
            return x.dtype.type(total / count) if count else x.dtype.type(np.nan)
        return np.true_divide(total, count, out=total, casting="unsafe")
    return run


def _expand(dy, node):
    """dy with the reduced axes put back as size 1, so it broadcasts against the input."""
    if node.attrs["keepdims"] or not _axes(node):
        return dy
    return make("ExpandAxes", (dy,), {"axes": _axes(node)}).outputs[0]


def _g_sum(node, dys):
    return [broadcast_like(_expand(dys[0], node), node.inputs[0])]


def _g_mean(node, dys):
    x = node.inputs[0]
    g = broadcast_like(_expand(dys[0], node), x)
    axes = _axes(node)
    dims = [x.shape[a] for a in axes]
    if all(d is not None for d in dims):
        return [mul(g, constant(1.0 / max(int(np.prod(dims)), 1), x.dtype))]
    return [make("DivByReducedCount", (g, x), {"axes": axes}).outputs[0]]


def _g_extreme(node, dys):
    return [make("ReduceExtremeGrad", (node.inputs[0], node.outputs[0], dys[0]),
                 {"axes": _axes(node), "keepdims": node.attrs["keepdims"]}).outputs[0]]


def _reduce_cost(node):
    x = node.inputs[0]
    n = num_elements_est(x.shape)
    return Cost(n, n * x.dtype.itemsize, num_elements_est(node.outputs[0].shape) * node.outputs[0].dtype.itemsize)


for _name, _grad in [("ReduceSum", _g_sum), ("ReduceMean", _g_mean), ("ReduceMax", _g_extreme), ("ReduceMin", _g_extreme)]:
    register(OpDef(_name, inputs=("x",), attrs={"axis": None, "keepdims": False}, infer=_infer_reduce,
                   kernel=_kernel_reduce, grad=_grad, cost=_reduce_cost,
                   doc="axis: a tuple of ints, or None for all axes."))


def _kernel_div_count(node, ctx):
    axes = node.attrs["axes"]

    def run(g, x):
        count = 1
        for a in axes:
            count *= x.shape[a]
        return g / g.dtype.type(max(count, 1))
    return run


register(OpDef("DivByReducedCount", inputs=("g", "x"), attrs={"axes": ()},
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)],
               kernel=_kernel_div_count, cost=lambda node: Cost(num_elements_est(node.inputs[0].shape)),
               doc="g / (number of elements of x along axes), for means over unknown dims."))


def _kernel_extreme_grad(node, ctx):
    xp = ctx.xp
    axes, keep, dt = node.attrs["axes"], node.attrs["keepdims"], node.inputs[0].dtype

    def run(x, y, dy):
        if not keep:
            y = xp.expand_dims(y, axes)
            dy = xp.expand_dims(dy, axes)
        mask = x == y
        share = dy / mask.sum(axis=axes, keepdims=True).astype(dt)
        return xp.multiply(mask, share, dtype=dt)
    return run


register(OpDef("ReduceExtremeGrad", inputs=("x", "y", "dy"), attrs={"axes": (), "keepdims": False},
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)],
               kernel=_kernel_extreme_grad, cost=lambda node: Cost(3 * num_elements_est(node.inputs[0].shape)),
               doc="Gradient of ReduceMax/ReduceMin: dy to the extreme positions, ties split evenly."))


def _norm_axis_arg(axis) -> Optional[tuple]:
    if axis is None:
        return None
    if isinstance(axis, Tensor):
        raise TypeError(f"reduction axes must be static ints, not tensor '{axis.name}'")
    if isinstance(axis, (int, np.integer)):
        return (int(axis),)
    return tuple(int(a) for a in axis)


def _reduce(op, x, axis, keepdims, name) -> Tensor:
    return make(op, (convert(x),), {"axis": _norm_axis_arg(axis), "keepdims": bool(keepdims)}, name=name).outputs[0]


def reduce_sum(x, axis=None, keepdims: bool = False, name=None) -> Tensor:
    return _reduce("ReduceSum", x, axis, keepdims, name)


def reduce_mean(x, axis=None, keepdims: bool = False, name=None) -> Tensor:
    return _reduce("ReduceMean", x, axis, keepdims, name)


def reduce_max(x, axis=None, keepdims: bool = False, name=None) -> Tensor:
    return _reduce("ReduceMax", x, axis, keepdims, name)


def reduce_min(x, axis=None, keepdims: bool = False, name=None) -> Tensor:
    return _reduce("ReduceMin", x, axis, keepdims, name)


# ---- argmax / argmin ------------------------------------------------------------------------------
def _infer_arg(node):
    x = node.inputs[0]
    if not x.shape:
        raise ShapeError(f"{node.op} of a scalar")
    if node.attrs["output_type"].kind not in "iu":
        raise ShapeError(f"{node.op} output_type must be an integer dtype, got {node.attrs['output_type'].name}")
    axis = normalize_axis(node.attrs["axis"], len(x.shape))
    if x.shape[axis] == 0:
        raise ShapeError(f"{node.op} over the empty axis {axis}")
    return [(node.attrs["output_type"], x.shape[:axis] + x.shape[axis + 1:])]


def _kernel_arg(node, ctx):
    xp = ctx.xp
    f = xp.argmax if node.op == "ArgMax" else xp.argmin
    axis = normalize_axis(node.attrs["axis"], len(node.inputs[0].shape))
    dt = node.attrs["output_type"]
    if len(node.inputs[0].shape) == 1:  # a scalar result: keep it an array
        return lambda x, a=xp.asarray: a(f(x, axis=axis), dtype=dt)
    return lambda x: f(x, axis=axis).astype(dt, copy=False)


for _name in ("ArgMax", "ArgMin"):
    register(OpDef(_name, inputs=("x",), attrs={"axis": -1, "output_type": _dt.int64}, infer=_infer_arg,
                   kernel=_kernel_arg, grad=lambda node, dys: [None], cost=_reduce_cost,
                   doc="Index of the first extreme value along axis (ties: the lowest index)."))


def argmax(x, axis: int = -1, output_type="int64", name=None) -> Tensor:
    """Index of the largest entry along `axis` (the last by default)."""
    return make("ArgMax", (convert(x),), {"axis": int(axis), "output_type": _dt.as_dtype(output_type)},
                name=name).outputs[0]


def argmin(x, axis: int = -1, output_type="int64", name=None) -> Tensor:
    """Index of the smallest entry along `axis` (the last by default)."""
    return make("ArgMin", (convert(x),), {"axis": int(axis), "output_type": _dt.as_dtype(output_type)},
                name=name).outputs[0]


# ---- reductions over axes known only at run time (ONNX feeds them as inputs) ---------------------
def _infer_reduce_dynamic(node):
    x, axes = node.inputs
    if axes.dtype.kind not in "iu" or len(axes.shape) != 1 or axes.shape[0] is None:
        raise ShapeError(f"axes must be a 1-D integer tensor of known length, got {axes.dtype.name}{list(axes.shape)}")
    n, rank = axes.shape[0], len(x.shape)
    if node.attrs["keepdims"] or (n == 0 and node.attrs["noop_with_empty_axes"]):
        return [(x.dtype, (None,) * rank)]
    return [(x.dtype, () if n == 0 else (None,) * (rank - n))]


def _kernel_reduce_dynamic(node, ctx):
    f = getattr(ctx.xp, {"sum": "sum", "mean": "mean", "max": "max", "min": "min", "prod": "prod"}[node.attrs["kind"]])
    keep, noop = node.attrs["keepdims"], node.attrs["noop_with_empty_axes"]
    kind = node.attrs["kind"]

    def run(x, axes):
        if len(axes) == 0:
            if noop:
                return x
            ax = None
        else:
            ax = tuple(sorted({int(a) % x.ndim for a in axes}))
        if x.size == 0 and kind in ("max", "min"):  # ONNX: the reduction of an empty set is the identity
            return ctx.xp.asarray(f(x, axis=ax, keepdims=keep, initial=_identity(x.dtype, kind))).astype(x.dtype)
        return ctx.xp.asarray(f(x, axis=ax, keepdims=keep)).astype(x.dtype, copy=False)
    return run


def _identity(dtype, kind):
    if dtype.kind == "b":
        return kind == "min"
    if dtype.kind == "f":
        return -np.inf if kind == "max" else np.inf
    info = np.iinfo(dtype)
    return info.min if kind == "max" else info.max


register(OpDef("ReduceDynamic", inputs=("x", "axes"),
               attrs={"kind": "sum", "keepdims": True, "noop_with_empty_axes": False},
               infer=_infer_reduce_dynamic, kernel=_kernel_reduce_dynamic, cost=_reduce_cost,
               doc="sum/mean/max/min/prod over axes given at run time (no gradient: use reduce_* with static axes)."))


def reduce_dynamic(x, axes, kind: str = "sum", keepdims: bool = True, noop_with_empty_axes: bool = False,
                   name=None) -> Tensor:
    if kind not in ("sum", "mean", "max", "min", "prod"):
        raise ValueError(f"reduce kind must be sum, mean, max, min or prod, got {kind!r}")
    return make("ReduceDynamic", (convert(x), convert(axes)),
                {"kind": kind, "keepdims": bool(keepdims), "noop_with_empty_axes": bool(noop_with_empty_axes)},
                name=name).outputs[0]


__all__.append("reduce_dynamic")
