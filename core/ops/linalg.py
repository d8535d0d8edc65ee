"""Matrix products: MatMul (batched, with transposes) and BiasAdd."""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import broadcast, dim_compatible, fmt, normalize_axis, num_elements_est
from .base import convert, make
from .intra_op import matmul as split_matmul
from .math import reduce_sum_like


def _infer_matmul(node):
    a, b = node.inputs[0], node.inputs[1]
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    if a.dtype != b.dtype:
        raise ShapeError(f"operand dtypes differ: {a.dtype.name} vs {b.dtype.name}")
    if a.dtype.kind not in "fi":
        raise ShapeError(f"MatMul needs numeric operands, got {a.dtype.name}")
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ShapeError(f"MatMul needs operands of rank >= 2, got {fmt(a.shape)} and {fmt(b.shape)}")
    m, k = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
    k2, n = (b.shape[-1], b.shape[-2]) if tb else (b.shape[-2], b.shape[-1])
    if not dim_compatible(k, k2):
        raise ShapeError(f"inner dimensions differ: {fmt(a.shape)}{'ᵀ' if ta else ''} @ "
                         f"{fmt(b.shape)}{'ᵀ' if tb else ''} ({k} vs {k2})")
    batch = broadcast(a.shape[:-2], b.shape[:-2])
    return [(a.dtype, batch + (m, n))]


def _kernel_matmul(node, ctx):
    xp = ctx.xp
    # numpy: 2-D products split across the intra-op threads (intra_op.matmul), else BLAS whole
    mm = xp.matmul if xp is not np else (lambda a, b: split_matmul(xp, a, b))
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    # numpy hands transposed views to BLAS with a transpose flag: no copy is made
    if ta and tb:
        return lambda a, b: mm(a.swapaxes(-1, -2), b.swapaxes(-1, -2))
    if ta:
        return lambda a, b: mm(a.swapaxes(-1, -2), b)
    if tb:
        return lambda a, b: mm(a, b.swapaxes(-1, -2))
    return mm


def _g_matmul(node, dys):
    a, b = node.inputs
    dy = dys[0]
    ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
    if not ta and not tb:
        da, db = matmul(dy, b, transpose_b=True), matmul(a, dy, transpose_a=True)
    elif not ta and tb:
        da, db = matmul(dy, b), matmul(dy, a, transpose_a=True)
    elif ta and not tb:
        da, db = matmul(b, dy, transpose_b=True), matmul(a, dy)
    else:
        da, db = matmul(b, dy, transpose_a=True, transpose_b=True), matmul(dy, a, transpose_a=True, transpose_b=True)
    return [reduce_sum_like(da, a), reduce_sum_like(db, b)]


def _cost_matmul(node):
    a, b = node.inputs[0], node.inputs[1]
    out = node.outputs[0]
    k = a.shape[-2] if node.attrs["transpose_a"] else a.shape[-1]
    k = 1 if k is None else k
    isz = out.dtype.itemsize
    return Cost(2.0 * num_elements_est(out.shape) * k,
                (num_elements_est(a.shape) + num_elements_est(b.shape)) * isz,
                num_elements_est(out.shape) * isz)


register(OpDef("MatMul", inputs=("a", "b"), attrs={"transpose_a": False, "transpose_b": False},
               infer=_infer_matmul, kernel=_kernel_matmul, grad=_g_matmul, cost=_cost_matmul))


def matmul(a, b, transpose_a: bool = False, transpose_b: bool = False, name: Optional[str] = None) -> Tensor:
    return make("MatMul", (convert(a), convert(b)),
                {"transpose_a": bool(transpose_a), "transpose_b": bool(transpose_b)}, name=name).outputs[0]


# ---- BiasAdd -------------------------------------------------------------------------------------
def _infer_bias_add(node):
    x, b = node.inputs
    if x.dtype != b.dtype:
        raise ShapeError(f"operand dtypes differ: {x.dtype.name} vs {b.dtype.name}")
    if len(b.shape) != 1:
        raise ShapeError(f"bias must be 1-D, got {fmt(b.shape)}")
    axis = normalize_axis(node.attrs["axis"], len(x.shape))
    if not dim_compatible(x.shape[axis], b.shape[0]):
        raise ShapeError(f"bias of length {b.shape[0]} does not match dim {axis} of {fmt(x.shape)}")
    return [(x.dtype, x.shape)]


def _bias_view_shape(node):
    rank = len(node.inputs[0].shape)
    axis = normalize_axis(node.attrs["axis"], rank)
    return (-1,) + (1,) * (rank - axis - 1)


def _kernel_bias_add(node, ctx):
    add = ctx.xp.add
    shape = _bias_view_shape(node)
    if len(shape) == 1:
        return add
    return lambda x, b: add(x, b.reshape(shape))


def _kernel_bias_add_grad(node, ctx):
    xp = ctx.xp
    rank = len(node.inputs[0].shape)
    axis = normalize_axis(node.attrs["axis"], rank)
    axes = tuple(i for i in range(rank) if i != axis)
    if xp is not np or rank < 2:
        return lambda dy: xp.sum(dy, axis=axes)
    # numpy's einsum sums the other axes 2-3.5x faster than sum(axis=...) on one core (the benchmark
    # CNN's first conv, dy [64, 32, 28, 28]: 0.17 vs 0.36 ms), as accurately (float64 reference);
    # at that speed a split across threads would not repay its hand-off
    letters = "abcdefghijklmnopqrstuvwxyz"[:rank]
    spec = f"{letters}->{letters[axis]}"
    return lambda dy: np.einsum(spec, dy)


register(OpDef("BiasAdd", inputs=("x", "bias"), attrs={"axis": -1}, infer=_infer_bias_add,
               kernel=_kernel_bias_add,
               grad=lambda node, dys: [dys[0], make("BiasAddGrad", (dys[0],), {"axis": node.attrs["axis"]}).outputs[0]],
               cost=lambda node: Cost(num_elements_est(node.inputs[0].shape),
                                      2 * num_elements_est(node.inputs[0].shape) * node.inputs[0].dtype.itemsize,
                                      num_elements_est(node.inputs[0].shape) * node.inputs[0].dtype.itemsize)))


def _infer_bias_add_grad(node):
    dy = node.inputs[0]
    axis = normalize_axis(node.attrs["axis"], len(dy.shape))
    return [(dy.dtype, (dy.shape[axis],))]


register(OpDef("BiasAddGrad", inputs=("dy",), attrs={"axis": -1}, infer=_infer_bias_add_grad,
               kernel=_kernel_bias_add_grad,
               cost=lambda node: Cost(num_elements_est(node.inputs[0].shape),
                                      num_elements_est(node.inputs[0].shape) * node.inputs[0].dtype.itemsize, 0)))


def bias_add(x, bias, axis: int = -1, name: Optional[str] = None) -> Tensor:
    """x + bias along `axis` (-1 for [N, C] activations, 1 for NCHW feature maps)."""
    return make("BiasAdd", (convert(x), convert(bias)), {"axis": int(axis)}, name=name).outputs[0]


def _install_matmul_operator() -> None:
    Tensor.__matmul__ = lambda a, b: matmul(a, b)
    Tensor.__rmatmul__ = lambda a, b: matmul(b, a)


_install_matmul_operator()
