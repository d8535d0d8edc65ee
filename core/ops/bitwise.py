"""Bitwise integer ops (ONNX BitShift, BitwiseAnd/Or/Xor/Not): elementwise with numpy broadcasting,
no gradient (integers); BitCast reinterprets a tensor's bits as another dtype of the same width. A shift by a negative amount or by the type's width or more gives what the
sign extension alone gives (ONNX opset 28): -1 for a right shift of a negative value, else 0."""
from __future__ import annotations

from typing import Optional

import numpy as np

from .. import dtypes as _dt
from ..errors import ShapeError
from ..graph import Tensor
from ..registry import OpDef, elementwise_cost, register
from ..shapes import broadcast
from .base import convert, convert_pair, make

__all__ = ["bit_shift", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitcast"]


def _infer(node):
    xs = node.inputs
    if any(t.dtype.kind not in "iu" for t in xs) or len({t.dtype for t in xs}) != 1:
        raise ShapeError(f"{node.op} needs integer operands of one dtype, got {', '.join(t.dtype.name for t in xs)}")
    shape = xs[0].shape if len(xs) == 1 else broadcast(xs[0].shape, xs[1].shape)
    return [(xs[0].dtype, shape)]


def _kernel_shift(node, ctx):
    xp, left = ctx.xp, node.attrs["direction"] == "LEFT"
    bits = node.inputs[0].dtype.itemsize * 8

    def run(x, y):
        out_of_range = (y < 0) | (y >= bits) if y.dtype.kind == "i" else (y >= bits)
        safe = xp.where(out_of_range, 0, y).astype(x.dtype)
        z = xp.left_shift(x, safe) if left else xp.right_shift(x, safe)
        fill = xp.where(x < 0, x.dtype.type(-1), x.dtype.type(0)) if (not left and x.dtype.kind == "i") \
            else x.dtype.type(0)
        return xp.where(out_of_range, fill, z).astype(x.dtype, copy=False)
    return run


register(OpDef("BitShift", inputs=("x", "y"), attrs={"direction": "LEFT"}, infer=_infer, kernel=_kernel_shift,
               cost=elementwise_cost(1), doc="x << y (LEFT) or x >> y (RIGHT, arithmetic for signed x)."))
for _op, _fn in (("BitwiseAnd", "bitwise_and"), ("BitwiseOr", "bitwise_or"), ("BitwiseXor", "bitwise_xor")):
    register(OpDef(_op, inputs=("x", "y"), infer=_infer, cost=elementwise_cost(1),
                   kernel=(lambda f: lambda node, ctx: getattr(ctx.xp, f))(_fn)))
register(OpDef("BitwiseNot", inputs=("x",), infer=_infer, cost=elementwise_cost(1),
               kernel=lambda node, ctx: ctx.xp.invert))


def _infer_bitcast(node):
    x, to = node.inputs[0], node.attrs["dtype"]
    if x.dtype.itemsize != to.itemsize:
        raise ShapeError(f"BitCast keeps the bit width: {x.dtype.name} ({x.dtype.itemsize * 8} bits) cannot become "
                         f"{to.name} ({to.itemsize * 8} bits)")
    return [(to, x.shape)]


# the same bytes seen as another dtype (a view; little-endian, as ONNX specifies and these CPUs are)
register(OpDef("BitCast", inputs=("x",), attrs={"dtype": None}, infer=_infer_bitcast, cost=elementwise_cost(0),
               kernel=lambda node, ctx: (lambda x, d=node.attrs["dtype"]: x.view(d)),
               doc="x's bits as dtype (same width, same shape); no gradient."))


def bitcast(x, dtype, name: Optional[str] = None) -> Tensor:
    """x's bits reinterpreted as `dtype` (same bit width): ONNX BitCast."""
    return make("BitCast", (convert(x),), {"dtype": _dt.as_dtype(dtype)}, name=name).outputs[0]


def bit_shift(x, y, direction: str = "LEFT", name: Optional[str] = None) -> Tensor:
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(f"direction must be LEFT or RIGHT, got {direction!r}")
    return make("BitShift", convert_pair(x, y), {"direction": direction}, name=name).outputs[0]


def bitwise_and(x, y, name: Optional[str] = None) -> Tensor:
    return make("BitwiseAnd", convert_pair(x, y), name=name).outputs[0]


def bitwise_or(x, y, name: Optional[str] = None) -> Tensor:
    return make("BitwiseOr", convert_pair(x, y), name=name).outputs[0]


def bitwise_xor(x, y, name: Optional[str] = None) -> Tensor:
    return make("BitwiseXor", convert_pair(x, y), name=name).outputs[0]


def bitwise_not(x, name: Optional[str] = None) -> Tensor:
    return make("BitwiseNot", (convert(x),), name=name).outputs[0]
