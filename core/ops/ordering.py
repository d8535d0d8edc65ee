"""Order- and count-based ops: CumSum, TopK, ReduceProd, Size. One record each; gradients where the
op is differentiable (TopK's through its values, ReduceProd's exact even where an entry is zero)."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, default_cost, elementwise_cost, register
from ..shapes import normalize_axis, num_elements_est
from .base import convert, make
from .indexing import scatter_elements
from .math import zeros_like

__all__ = ["cumsum", "top_k", "reduce_prod", "size"]


# ---- CumSum ---------------------------------------------------------------------------------------------
def _k_cumsum(node, ctx):
    xp = ctx.xp
    excl, rev = node.attrs["exclusive"], node.attrs["reverse"]
    static_axis = normalize_axis(node.attrs["axis"], len(node.inputs[0].shape))

    def run(x, *axis_value):  # an axis given as a second input is read at run time
        axis = int(axis_value[0]) % x.ndim if axis_value else static_axis
        y = xp.flip(x, axis) if rev else x
        c = xp.cumsum(y, axis=axis, dtype=x.dtype)
        if excl:  # shift by one along axis, a zero first: exact, unlike cumsum - x
            c = xp.concatenate([xp.zeros_like(xp.take(c, [0], axis=axis)),
                                xp.take(c, xp.arange(c.shape[axis] - 1), axis=axis)], axis=axis)
        return xp.flip(c, axis) if rev else c
    return run


def _infer_cumsum(node):
    x = node.inputs[0]
    if not x.shape:
        raise ShapeError("CumSum needs rank >= 1")
    if len(node.inputs) > 1 and (node.inputs[1].dtype.kind not in "iu" or node.inputs[1].shape not in ((), (1,))):
        raise ShapeError(f"CumSum axis must be an integer scalar, got {node.inputs[1].dtype.name}{node.inputs[1].shape}")
    normalize_axis(node.attrs["axis"], len(x.shape))
    return [(x.dtype, x.shape)]


register(OpDef("CumSum", inputs=("x", "*axis"), attrs={"axis": 0, "exclusive": False, "reverse": False},
               infer=_infer_cumsum, kernel=_k_cumsum, cost=elementwise_cost(1),
               grad=lambda node, dys: [cumsum(dys[0], node.inputs[1] if len(node.inputs) > 1 else node.attrs["axis"],
                                              node.attrs["exclusive"], not node.attrs["reverse"])]
               + [None] * (len(node.inputs) - 1),
               doc="Running sums along axis; exclusive leaves out the element itself, reverse runs from the end."))


def cumsum(x, axis=0, exclusive: bool = False, reverse: bool = False, name=None) -> Tensor:
    """Running sums along `axis` (an int, or a scalar integer Tensor read at run time)."""
    ins = (convert(x),) + ((axis,) if isinstance(axis, Tensor) else ())
    return make("CumSum", ins, {"axis": 0 if isinstance(axis, Tensor) else int(axis), "exclusive": bool(exclusive),
                                "reverse": bool(reverse)}, name=name).outputs[0]


# ---- TopK -------------------------------------------------------------------------------------------------
def _infer_top_k(node):
    x = node.inputs[0]
    if not x.shape:
        raise ShapeError("TopK needs rank >= 1")
    axis = normalize_axis(node.attrs["axis"], len(x.shape))
    k = node.attrs["k"] if len(node.inputs) == 1 else None  # None: given as an input, read at run time
    if k is not None and (k < 0 or (x.shape[axis] is not None and k > x.shape[axis])):
        raise ShapeError(f"TopK k={k} outside [0, {x.shape[axis]}] along axis {axis}")
    shape = tuple(k if i == axis else d for i, d in enumerate(x.shape))
    return [(x.dtype, shape), (_dt.int64, shape)]


def _k_top_k(node, ctx):
    xp = ctx.xp
    static_k, largest = node.attrs["k"], node.attrs["largest"]
    axis = normalize_axis(node.attrs["axis"], len(node.inputs[0].shape))

    def run(x, *k_value):
        k = int(k_value[0].reshape(-1)[0]) if k_value else static_k
        if not 0 <= k <= x.shape[axis]:
            raise ValueError(f"TopK k={k} outside [0, {x.shape[axis]}] along axis {axis}")
        key = x
        if largest:  # a stable sort of the negated key keeps ties in index order, as ONNX wants
            key = -x.astype(xp.int64) if x.dtype.kind == "u" else -x
        order = xp.argsort(key, axis=axis, kind="stable")
        idx = xp.take(order, xp.arange(k), axis=axis)
        return xp.take_along_axis(x, idx, axis=axis), idx.astype(xp.int64)
    return run


def _g_top_k(node, dys):
    x = node.inputs[0]
    if dys[0] is None:
        return [None] * len(node.inputs)
    return [scatter_elements(zeros_like(x), node.outputs[1], dys[0], node.attrs["axis"], "add")] + [None] * (len(node.inputs) - 1)


register(OpDef("TopK", inputs=("x", "*k"), attrs={"k": 1, "axis": -1, "largest": True},
               infer=_infer_top_k, kernel=_k_top_k, grad=_g_top_k, cost=default_cost,
               doc="The k largest (or smallest) values along axis, sorted, and their indices (ties: lower index first)."))


def top_k(x, k, axis: int = -1, largest: bool = True, name=None):
    """(values, indices) of the k largest (smallest with largest=False) entries along axis, sorted;
    k an int, or an integer Tensor read at run time."""
    ins = (convert(x),) + ((k,) if isinstance(k, Tensor) else ())
    n = make("TopK", ins, {"k": 0 if isinstance(k, Tensor) else int(k), "axis": int(axis), "largest": bool(largest)},
             name=name)
    return n.outputs[0], n.outputs[1]


# ---- ReduceProd -----------------------------------------------------------------------------------------------
def _axes(node) -> tuple:
    rank = len(node.inputs[0].shape)
    axis = node.attrs["axis"]
    return tuple(range(rank)) if axis is None else tuple(sorted({normalize_axis(a, rank) for a in axis}))


def _infer_prod(node):
    x = node.inputs[0]
    if x.dtype == _dt.bool_:
        raise ShapeError("cannot reduce a bool tensor; cast it first")
    axes, keep = _axes(node), node.attrs["keepdims"]
    return [(x.dtype, tuple((1 if i in axes else d) for i, d in enumerate(x.shape) if keep or i not in axes))]


def _k_prod(node, ctx):
    xp, axes, keep = ctx.xp, _axes(node), node.attrs["keepdims"]
    return lambda x: xp.asarray(xp.prod(x, axis=axes, keepdims=keep, dtype=x.dtype))


def _k_prod_grad(node, ctx):
    """dx = dy * (product of the other entries of x's reduced group): the exclusive products from the left
    times those from the right, so a zero entry gets the product of the rest (not 0 / 0)."""
    xp, axes = ctx.xp, node.attrs["axes"]

    def run(x, dy):
        rank = x.ndim
        keep = [a for a in range(rank) if a not in axes]
        perm = keep + list(axes)
        xt = xp.transpose(x, perm)
        lead = xt.shape[:len(keep)]
        flat = xt.reshape(lead + (-1,))
        ones = xp.ones(lead + (1,), x.dtype)
        left = xp.cumprod(xp.concatenate([ones, flat[..., :-1]], axis=-1), axis=-1)
        right = xp.flip(xp.cumprod(xp.flip(xp.concatenate([flat[..., 1:], ones], axis=-1), -1), axis=-1), -1)
        g = (left * right).reshape(xt.shape)
        g = xp.transpose(g, list(np.argsort(perm)))
        return g * dy.reshape([1 if a in axes else x.shape[a] for a in range(rank)])
    return run


def _g_prod(node, dys):
    return [make("ReduceProdGrad", (node.inputs[0], dys[0]), {"axes": _axes(node)}).outputs[0]]


def _prod_cost(node):
    n = num_elements_est(node.inputs[0].shape)
    return Cost(n, n * node.inputs[0].dtype.itemsize, num_elements_est(node.outputs[0].shape) * node.outputs[0].dtype.itemsize)


register(OpDef("ReduceProd", inputs=("x",), attrs={"axis": None, "keepdims": False}, infer=_infer_prod,
               kernel=_k_prod, grad=_g_prod, cost=_prod_cost, doc="Product over axes (None: all)."))
register(OpDef("ReduceProdGrad", inputs=("x", "dy"), attrs={"axes": ()},
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)], kernel=_k_prod_grad,
               cost=elementwise_cost(4), doc="The gradient of ReduceProd; exact where entries are zero."))


def reduce_prod(x, axis=None, keepdims: bool = False, name=None) -> Tensor:
    if axis is not None:
        axis = (int(axis),) if isinstance(axis, (int, np.integer)) else tuple(int(a) for a in axis)
    return make("ReduceProd", (convert(x),), {"axis": axis, "keepdims": bool(keepdims)}, name=name).outputs[0]


# ---- Size ----------------------------------------------------------------------------------------------------
register(OpDef("Size", inputs=("x",), infer=lambda node: [(_dt.int64, ())],
               kernel=lambda node, ctx: (lambda x, a=ctx.xp.asarray: a(x.size, dtype=np.int64)),
               grad=lambda node, dys: [None], cost=lambda node: Cost(0, 0, 8),
               doc="The number of elements of x, an int64 scalar."))


def size(x, name=None) -> Tensor:
    return make("Size", (convert(x),), name=name).outputs[0]
