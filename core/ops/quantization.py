"""QuantizeLinear and DequantizeLinear (ONNX semantics: per-tensor, per-axis or blocked scales, int8,
uint8 or int16 values). Scale and zero point are ordinary inputs, Consts in an imported QDQ model, so a
pass or the edge quantizer can read them off the graph instead of calibrating again."""
from __future__ import annotations

import numpy as np

from .. import dtypes as _dt
from ..errors import ShapeError
from ..graph import Tensor
from ..registry import OpDef, elementwise_cost, register
from ..shapes import normalize_axis
from .base import constant, convert, make

__all__ = ["quantize_linear", "dequantize_linear"]

RANGES = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255), np.dtype(np.int16): (-32768, 32767)}


def _check(node, value: Tensor):
    x, scale, zp = node.inputs
    if scale.dtype.kind != "f":
        raise ShapeError(f"{node.op} scale must be a float tensor, got {scale.dtype.name}")
    allowed = set(RANGES) | ({np.dtype(np.int32)} if node.op == "DequantizeLinear" else set())  # int32 biases
    if zp.dtype not in allowed:
        raise ShapeError(f"{node.op} zero point must be one of {sorted(d.name for d in allowed)}, got {zp.dtype.name}")
    if len(scale.shape) > 1 and not node.attrs["block_size"]:
        raise ShapeError(f"{node.op} scale of rank {len(scale.shape)} needs block_size")
    if value.shape and scale.shape not in ((), (1,)):  # the axis matters only for per-axis or blocked scales
        normalize_axis(node.attrs["axis"], len(value.shape))


def _infer_quantize(node):
    x, scale, zp = node.inputs
    _check(node, x)
    if x.dtype.kind != "f":
        raise ShapeError(f"QuantizeLinear input must be float, got {x.dtype.name}")
    return [(zp.dtype, x.shape)]


def _infer_dequantize(node):
    x, scale, zp = node.inputs
    _check(node, x)
    if x.dtype != zp.dtype:
        raise ShapeError(f"DequantizeLinear input is {x.dtype.name}, its zero point {zp.dtype.name}")
    return [(scale.dtype, x.shape)]


def _broadcastable(xp, v, shape, axis: int, block: int):
    """A scale or zero point shaped to broadcast against x: scalar, per-axis vector, or blocks along axis."""
    if v.ndim == 0 or v.size == 1 and not block:
        return v.reshape(())
    if block:
        return xp.repeat(v, block, axis=axis)[tuple(slice(0, d) for d in shape)]
    return v.reshape([-1 if i == axis else 1 for i in range(len(shape))])


def _k_quantize(node, ctx):
    xp, block = ctx.xp, node.attrs["block_size"]
    lo, hi = RANGES[np.dtype(node.outputs[0].dtype)]

    def run(x, scale, zp):
        axis = node.attrs["axis"] % max(x.ndim, 1)
        s = _broadcastable(xp, scale, x.shape, axis, block)
        z = _broadcastable(xp, zp, x.shape, axis, block).astype(xp.int32)
        q = xp.rint(x / s).astype(xp.int32) + z  # round half to even, as ONNX does
        return xp.clip(q, lo, hi).astype(zp.dtype)
    return run


def _k_dequantize(node, ctx):
    xp, block = ctx.xp, node.attrs["block_size"]

    def run(x, scale, zp):
        axis = node.attrs["axis"] % max(x.ndim, 1)
        s = _broadcastable(xp, scale, x.shape, axis, block)
        z = _broadcastable(xp, zp, x.shape, axis, block)
        return ((x.astype(xp.float32) - z.astype(xp.float32)) * s).astype(scale.dtype, copy=False)
    return run


_ATTRS = {"axis": 1, "block_size": 0}
register(OpDef("QuantizeLinear", inputs=("x", "scale", "zero_point"), attrs=_ATTRS, infer=_infer_quantize,
               kernel=_k_quantize, grad=lambda node, dys: [None, None, None], cost=elementwise_cost(4),
               doc="clip(rint(x / scale) + zero_point) in the zero point's integer dtype."))
register(OpDef("DequantizeLinear", inputs=("x", "scale", "zero_point"), attrs=_ATTRS, infer=_infer_dequantize,
               kernel=_k_dequantize, grad=lambda node, dys: [None, None, None], cost=elementwise_cost(2),
               doc="(x - zero_point) * scale, in the scale's float dtype."))


def _zp(zero_point, dtype, like: Tensor) -> Tensor:
    if zero_point is None:
        return constant(np.zeros((), dtype), graph=like.graph)
    return convert(zero_point)


def quantize_linear(x, scale, zero_point=None, axis: int = 1, block_size: int = 0, dtype="uint8", name=None) -> Tensor:
    """x as integers of the zero point's dtype (`dtype` when no zero point is given)."""
    x = convert(x)
    return make("QuantizeLinear", (x, convert(scale), _zp(zero_point, _dt.as_dtype(dtype), x)),
                {"axis": int(axis), "block_size": int(block_size)}, name=name).outputs[0]


def dequantize_linear(x, scale, zero_point=None, axis: int = 1, block_size: int = 0, name=None) -> Tensor:
    x = convert(x)
    return make("DequantizeLinear", (x, convert(scale), _zp(zero_point, x.dtype, x)),
                {"axis": int(axis), "block_size": int(block_size)}, name=name).outputs[0]
