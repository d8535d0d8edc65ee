"""Gather (embedding lookup) and the row-sparse gradients it produces.

The gradient of Gather is an IndexedSlices (values, indices, dense shape): only the rows
looked up carry gradient, so optimizers update only those rows.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import fmt, normalize_axis, num_elements_est
from .base import convert, make


class IndexedSlices:
    """A gradient that is zero except in rows `indices` of a tensor shaped like `like`."""
    __slots__ = ("values", "indices", "like")

    def __init__(self, values: Tensor, indices: Tensor, like: Tensor):
        self.values, self.indices, self.like = values, indices, like

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def shape(self):
        return self.like.shape

    @property
    def graph(self):
        return self.values.graph

    def __repr__(self) -> str:
        return f"<IndexedSlices values={self.values.name} indices={self.indices.name} shape={fmt(self.like.shape)}>"


def _infer_gather(node):
    params, idx = node.inputs
    if idx.dtype.kind not in "iu":
        raise ShapeError(f"indices must be integers, got {idx.dtype.name}")
    axis = normalize_axis(node.attrs["axis"], len(params.shape))
    shape = params.shape[:axis] + idx.shape + params.shape[axis + 1:]
    return [(params.dtype, shape)]


def _kernel_gather(node, ctx):
    xp = ctx.xp
    axis = node.attrs["axis"] % len(node.inputs[0].shape)
    if axis == 0:
        def gather0(params, indices):
            return params[indices]  # numpy bounds-checks and raises IndexError naming the index
        return gather0
    if xp is not np:  # cupy's take has no mode= (it wraps out-of-range indices; the H100 run found this)
        return lambda params, indices: xp.take(params, indices, axis=axis)
    return lambda params, indices: xp.take(params, indices, axis=axis, mode="raise")


def _g_gather(node, dys):
    params, idx = node.inputs
    dy = dys[0]
    axis = node.attrs["axis"] % len(params.shape)
    if axis == 0:
        # rows of dy, one per looked-up index: values [n_idx, *params.shape[1:]]
        lead = len(idx.shape)
        flat_idx = idx if lead == 1 else make("MergeLeading", (idx,), {"lead": lead}).outputs[0]
        vals = dy if lead == 1 else make("MergeLeading", (dy,), {"lead": lead}).outputs[0]
        return [IndexedSlices(vals, flat_idx, params), None]
    return [make("GatherGrad", (dy, idx, params), {"axis": axis}).outputs[0], None]


def _gather_cost(node):
    out = node.outputs[0]
    n = num_elements_est(out.shape) * out.dtype.itemsize
    return Cost(0, n + num_elements_est(node.inputs[1].shape) * node.inputs[1].dtype.itemsize, n)


register(OpDef("Gather", inputs=("params", "indices"), attrs={"axis": 0}, infer=_infer_gather,
               kernel=_kernel_gather, grad=_g_gather, cost=_gather_cost))


def _infer_merge_leading(node):
    x, lead = node.inputs[0], node.attrs["lead"]
    n = 1
    for d in x.shape[:lead]:
        n = None if n is None or d is None else n * d
    return [(x.dtype, (n,) + tuple(x.shape[lead:]))]


register(OpDef("MergeLeading", inputs=("x",), attrs={"lead": 1}, infer=_infer_merge_leading,
               kernel=lambda node, ctx: (lambda x, k=node.attrs["lead"]: x.reshape((-1,) + x.shape[k:])
                                         if x.size or k == 0 else x.reshape((0,) + x.shape[k:])),
               grad=lambda node, dys: [make("ReshapeLike", (dys[0], node.inputs[0])).outputs[0]],
               cost=lambda node: Cost(0, 0, 0),
               doc="Merge the first `lead` dims into one (none: a new leading dim of 1)."))


def _kernel_gather_grad(node, ctx):
    xp = ctx.xp
    axis = node.attrs["axis"]

    def run(dy, indices, params):
        out = xp.zeros_like(params)
        moved = xp.moveaxis(out, axis, 0)
        dym = xp.moveaxis(dy.reshape(params.shape[:axis] + (-1,) + params.shape[axis + 1:]), axis, 0)
        xp.add.at(moved, indices.reshape(-1), dym)
        return out
    return run


register(OpDef("GatherGrad", inputs=("dy", "indices", "params"), attrs={"axis": 0},
               infer=lambda node: [(node.inputs[2].dtype, node.inputs[2].shape)],
               kernel=_kernel_gather_grad, cost=_gather_cost,
               doc="Dense gradient of Gather along a non-leading axis."))


def gather(params, indices, axis: int = 0, name: Optional[str] = None) -> Tensor:
    return make("Gather", (convert(params), convert(indices)), {"axis": int(axis)}, name=name).outputs[0]


# ---- densifying and summing IndexedSlices ------------------------------------------------
def _kernel_dense_from_slices(node, ctx):
    xp = ctx.xp

    def run(values, indices, like):
        out = xp.zeros(like.shape, dtype=values.dtype)
        xp.add.at(out, indices, values)
        return out
    return run


register(OpDef("DenseFromSlices", inputs=("values", "indices", "like"),
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[2].shape)],
               kernel=_kernel_dense_from_slices,
               grad=lambda node, dys: [gather(dys[0], node.inputs[1]), None, None],
               cost=lambda node: Cost(num_elements_est(node.inputs[0].shape), 0,
                                      num_elements_est(node.outputs[0].shape) * node.outputs[0].dtype.itemsize)))


def to_dense(g) -> Optional[Tensor]:
    if isinstance(g, IndexedSlices):
        return make("DenseFromSlices", (g.values, g.indices, g.like)).outputs[0]
    return g


def _infer_concat_rows(node):
    first = node.inputs[0]
    rows = 0
    for t in node.inputs:
        if t.dtype != first.dtype or t.shape[1:] != first.shape[1:]:
            raise ShapeError(f"row blocks differ: {t.name} {t.dtype.name}{fmt(t.shape)} vs "
                             f"{first.dtype.name}{fmt(first.shape)}")
        rows = None if rows is None or t.shape[0] is None else rows + t.shape[0]
    return [(first.dtype, (rows,) + tuple(first.shape[1:]))]


register(OpDef("ConcatRows", inputs=("x0", "*xs"), infer=_infer_concat_rows,
               kernel=lambda node, ctx: (lambda *xs: ctx.xp.concatenate(xs, axis=0)),
               cost=lambda node: Cost(0, *(2 * [sum(num_elements_est(t.shape) * t.dtype.itemsize
                                                   for t in node.inputs)])),
               doc="Concatenate along axis 0: sums IndexedSlices without densifying."))


def sum_slices(parts) -> IndexedSlices:
    like = parts[0].like
    vals = make("ConcatRows", [p.values for p in parts]).outputs[0]
    idx = make("ConcatRows", [p.indices for p in parts]).outputs[0]
    return IndexedSlices(vals, idx, like)
