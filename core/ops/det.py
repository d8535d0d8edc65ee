"""Det (ONNX Det): the determinant of each square matrix in the last two axes; its gradient
det(X) inv(X)^T is one DetGrad kernel (defined where X is invertible)."""
from __future__ import annotations

from typing import Optional

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import num_elements_est
from .base import convert, make


def _infer(node):
    x = node.inputs[0]
    if x.dtype.kind != "f":
        raise ShapeError(f"Det needs a float input, got {x.dtype.name}")
    if len(x.shape) < 2 or (None not in x.shape[-2:] and x.shape[-1] != x.shape[-2]):
        raise ShapeError(f"Det needs square matrices in the last two axes, got shape {list(x.shape)}")
    return [(x.dtype, x.shape[:-2])]


def _cost(node) -> Cost:
    x = node.inputs[0]
    n = x.shape[-1] or 1
    elems = num_elements_est(x.shape)
    return Cost(flops=elems * n * 2 / 3 + elems, bytes_read=elems * x.dtype.itemsize,
                bytes_written=elems * x.dtype.itemsize / n)


def _kernel_det_grad(node, ctx):
    xp = ctx.xp

    def run(x, y, dy):  # d det / dX = det(X) inv(X)^T
        return (dy * y)[..., None, None] * xp.swapaxes(xp.linalg.inv(x), -1, -2)
    return run


def _grad(node, dys):
    if dys[0] is None:
        return [None]
    x, y = node.inputs[0], node.outputs[0]
    return [make("DetGrad", (x, y, dys[0])).outputs[0]]


register(OpDef("Det", inputs=("x",), infer=_infer, kernel=lambda node, ctx: ctx.xp.linalg.det, grad=_grad,
               cost=_cost, doc="numpy.linalg.det over the last two axes."))
register(OpDef("DetGrad", inputs=("x", "y", "dy"), infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)],
               kernel=_kernel_det_grad, cost=_cost))


def det(x, name: Optional[str] = None) -> Tensor:
    """The determinant of each matrix in x's last two axes."""
    return make("Det", (convert(x),), name=name).outputs[0]
