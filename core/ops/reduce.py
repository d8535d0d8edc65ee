"""Reductions: sum, mean, max, min over axes (with keepdims), and argmax/argmin."""
from __future__ import annotations

from typing import Optional

import numpy as np

from .. import dtypes as _dt
from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import normalize_axis, num_elements_est
from .base import constant, convert, make

__all__ = ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "argmax", "argmin"]


def _axes(node):
    """The normalised axes of a reduction (all axes when the attribute is None)."""
    rank = len(node.inputs[0].shape)
    axis = node.attrs["axis"]
    if axis is None:
        return tuple(range(rank))
    axes = tuple(sorted({normalize_axis(a, rank) for a in axis}))
    return axes


def _infer_reduce(node):
    x = node.inputs[0]
    if x.dtype == _dt.bool_:
        raise ShapeError("cannot reduce a bool tensor; cast it first")
    axes = _axes(node)
    keep = node.attrs["keepdims"]
    shape = tuple((1 if i in axes else d) for i, d in enumerate(x.shape) if keep or i not in axes)
    return [(x.dtype, shape)]


def _kernel_reduce(fn_name):
    def factory(node, ctx):
        f = getattr(ctx.xp, fn_name)
        axes, keep = _axes(node), node.attrs["keepdims"]
        dt = node.outputs[0].dtype
        if fn_name == "mean":  # numpy's mean of float16 accumulates in float32 anyway; keep the dtype
            return lambda x: f(x, axis=axes, keepdims=keep).astype(dt, copy=False)
        return lambda x: f(x, axis=axes, keepdims=keep)
    return factory



def _expand(dy, node):
    """dy with the reduced axes put back as size 1, so it broadcasts against the input."""
    if node.attrs["keepdims"]:
        return dy
    return make("ExpandAxes", (dy,), {"axes": _axes(node)}).outputs[0]


def _g_sum(node, dys):
    from .math import broadcast_like
    return [broadcast_like(_expand(dys[0], node), node.inputs[0])]


def _g_mean(node, dys):
    from .math import broadcast_like, mul
    x = node.inputs[0]
    g = broadcast_like(_expand(dys[0], node), x)
    axes = _axes(node)
    dims = [x.shape[a] for a in axes]
    if all(d is not None for d in dims):
        count = int(np.prod(dims)) if dims else 1
        return [mul(g, constant(1.0 / max(count, 1), x.dtype))]
    return [make("DivByReducedCount", (g, x), {"axes": axes}).outputs[0]]


def _g_maxmin(node, dys):
    """Gradient to the positions holding the extreme value, split evenly between ties."""
    return [make("ReduceExtremeGrad", (node.inputs[0], node.outputs[0], dys[0]),
                 {"axes": _axes(node), "keepdims": node.attrs["keepdims"]}).outputs[0]]


def _reduce_cost(node):
    x = node.inputs[0]
    n = num_elements_est(x.shape)
    return Cost(n, n * x.dtype.itemsize, num_elements_est(node.outputs[0].shape) * x.dtype.itemsize)


for _name, _fn, _grad in [("ReduceSum", "sum", _g_sum), ("ReduceMean", "mean", _g_mean),
                          ("ReduceMax", "max", _g_maxmin), ("ReduceMin", "min", _g_maxmin)]:
    register(OpDef(_name, inputs=("x",), attrs={"axis": None, "keepdims": False}, infer=_infer_reduce,
                   kernel=_kernel_reduce(_fn), grad=_grad, cost=_reduce_cost))


def _expand_infer(node):
    x = node.inputs[0]
    axes = node.attrs["axes"]
    shape = list(x.shape)
    for a in sorted(axes):
        shape.insert(a, 1)
    return [(x.dtype, tuple(shape))]


register(OpDef("ExpandAxes", inputs=("x",), attrs={"axes": ()}, infer=_expand_infer,
               kernel=lambda node, ctx: (lambda x, a=node.attrs["axes"]: ctx.xp.expand_dims(x, a)),
               grad=lambda node, dys: [make("ReduceSum", (dys[0],), {"axis": node.attrs["axes"], "keepdims": False}).outputs[0]],
               cost=lambda node: Cost(0, 0, 0), doc="Insert size-1 axes (after a reduction without keepdims)."))


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
    axes, keep = node.attrs["axes"], node.attrs["keepdims"]

    def run(x, y, dy):
        if not keep:
            y = xp.expand_dims(y, axes)
            dy = xp.expand_dims(dy, axes)
        mask = (x == y)
        count = mask.sum(axis=axes, keepdims=True)
        return xp.where(mask, dy / count.astype(x.dtype), 0).astype(x.dtype, copy=False)
    return run


register(OpDef("ReduceExtremeGrad", inputs=("x", "y", "dy"), attrs={"axes": (), "keepdims": False},
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)],
               kernel=_kernel_extreme_grad, cost=lambda node: Cost(3 * num_elements_est(node.inputs[0].shape)),
               doc="Gradient of ReduceMax/ReduceMin: dy to the extreme positions, ties split evenly."))


def _norm_axis_arg(axis) -> Optional[tuple]:
    if axis is None:
        return None
    if isinstance(axis, (int, np.integer)):
        return (int(axis),)
    return tuple(int(a) for a in axis)


def reduce_sum(x, axis=None, keepdims: bool = False, name=None) -> Tensor:
    return make("ReduceSum", (convert(x),), {"axis": _norm_axis_arg(axis), "keepdims": bool(keepdims)}, name=name).outputs[0]


def reduce_mean(x, axis=None, keepdims: bool = False, name=None) -> Tensor:
    return make("ReduceMean", (convert(x),), {"axis": _norm_axis_arg(axis), "keepdims": bool(keepdims)}, name=name).outputs[0]


def reduce_max(x, axis=None, keepdims: bool = False, name=None) -> Tensor:
    return make("ReduceMax", (convert(x),), {"axis": _norm_axis_arg(axis), "keepdims": bool(keepdims)}, name=name).outputs[0]


def reduce_min(x, axis=None, keepdims: bool = False, name=None) -> Tensor:
    return make("ReduceMin", (convert(x),), {"axis": _norm_axis_arg(axis), "keepdims": bool(keepdims)}, name=name).outputs[0]


# ---- argmax / argmin ----------------------------------------------------------------------------
def _infer_arg(node):
    x = node.inputs[0]
    axis = normalize_axis(node.attrs["axis"], len(x.shape))
    return [(node.attrs["output_type"], x.shape[:axis] + x.shape[axis + 1:])]


def _kernel_arg(fn_name):
    def factory(node, ctx):
        f = getattr(ctx.xp, fn_name)
        axis = normalize_axis(node.attrs["axis"], len(node.inputs[0].shape))
        dt = node.attrs["output_type"]
        return lambda x: f(x, axis=axis).astype(dt, copy=False)
    return factory


for _name, _fn in [("ArgMax", "argmax"), ("ArgMin", "argmin")]:
    register(OpDef(_name, inputs=("x",), attrs={"axis": -1, "output_type": _dt.int64}, infer=_infer_arg,
                   kernel=_kernel_arg(_fn), grad=lambda node, dys: [None], cost=_reduce_cost))


def argmax(x, axis: int = -1, output_type="int64", name=None) -> Tensor:
    return make("ArgMax", (convert(x),), {"axis": int(axis), "output_type": _dt.as_dtype(output_type)}, name=name).outputs[0]


def argmin(x, axis: int = -1, output_type="int64", name=None) -> Tensor:
    return make("ArgMin", (convert(x),), {"axis": int(axis), "output_type": _dt.as_dtype(output_type)}, name=name).outputs[0]
