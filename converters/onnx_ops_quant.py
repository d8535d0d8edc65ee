"""ONNX import of quantized models: QuantizeLinear/DequantizeLinear onto the core ops (scales and zero
points stay Const inputs, see `qdq_params`), DynamicQuantizeLinear, and MatMulInteger, QLinearMatMul,
ConvInteger, QLinearConv as integer-exact float64 computation (exact while sums stay below 2^53)."""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

import isthmus.core as ism
from isthmus.core.graph import Graph, Tensor

from .onnx_import import OnnxImportError, handler
from .onnx_ops_conv import conv_nd
from .onnx_ops_elementwise import attrs, where


def _zero_point(node, ins, i: int, dtype) -> Tensor:
    if len(ins) > i and ins[i] is not None:
        return ins[i]
    return ism.constant(np.zeros((), dtype))


@handler("QuantizeLinear", 10)
def _quantize(c, node, ins):
    at = attrs(node)
    if int(at.get("saturate", 1)) != 1:
        raise OnnxImportError(f"{where(node)}: saturate=0 applies to float8 outputs, which isthmus lacks")
    if at.get("precision"):
        raise OnnxImportError(f"{where(node)}: the precision attribute is not supported")
    out_dt = np.uint8
    if at.get("output_dtype"):
        from onnx import helper  # deferred: onnx is a heavy or optional dependency
        out_dt = helper.tensor_dtype_to_np_dtype(at["output_dtype"])
    zp = _zero_point(node, ins, 2, out_dt)
    return [ism.quantize_linear(ins[0], ins[1], zp, int(at.get("axis", 1)), int(at.get("block_size", 0)))]


@handler("DequantizeLinear", 10)
def _dequantize(c, node, ins):
    at = attrs(node)
    if at.get("output_dtype"):
        raise OnnxImportError(f"{where(node)}: the output_dtype attribute is not supported")
    x = ins[0]
    zp = _zero_point(node, ins, 2, x.dtype)
    return [ism.dequantize_linear(x, ins[1], zp, int(at.get("axis", 1)), int(at.get("block_size", 0)))]


def _centred(x: Tensor, zp, axis_of_vector: int = None) -> Tensor:
    """x - zero_point in float64 (exact for 8/16-bit values); a vector zero point lies along axis_of_vector."""
    xf = ism.cast(x, "float64")
    if zp is None:
        return xf
    zf = ism.cast(zp, "float64")
    if axis_of_vector is not None and len(zp.shape) == 1 and zp.shape != (1,):
        zf = ism.reshape(zf, [-1 if i == axis_of_vector else 1 for i in range(len(x.shape))])
    return ism.sub(xf, zf)


def _opt(ins, i):
    return ins[i] if len(ins) > i else None


def _requantize(acc: Tensor, multiplier: Tensor, y_zp: Tensor) -> Tensor:
    """clip(rint(acc * multiplier) + y_zp) in y_zp's dtype, multiplier computed in float32 as the reference."""
    lo, hi = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}[np.dtype(y_zp.dtype)]
    d = ism.add(ism.mul(acc, ism.cast(multiplier, "float64")), ism.cast(y_zp, "float64"))
    d = ism.minimum(ism.maximum(ism.round(d), ism.constant(float(lo), "float64")), ism.constant(float(hi), "float64"))
    return ism.cast(d, y_zp.dtype)


@handler("MatMulInteger", 10)
def _matmul_integer(c, node, ins):
    a, b = ins[0], ins[1]
    y = ism.matmul(_centred(a, _opt(ins, 2), len(a.shape) - 2), _centred(b, _opt(ins, 3), len(b.shape) - 1))
    return [ism.cast(y, "int32")]


@handler("QLinearMatMul", 10)
def _qlinear_matmul(c, node, ins):
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = ins
    acc = ism.matmul(_centred(a, a_zp, len(a.shape) - 2), _centred(b, b_zp, len(b.shape) - 1))
    if len(a_s.shape) == 1 and a_s.shape != (1,):
        a_s = ism.reshape(a_s, (-1, 1))
    return [_requantize(acc, ism.div(ism.mul(a_s, b_s), y_s), y_zp)]


@handler("ConvInteger", 10)
def _conv_integer(c, node, ins):
    x, w = ins[0], ins[1]
    y = conv_nd(node, _centred(x, _opt(ins, 2)), _centred(w, _opt(ins, 3), 0))
    return [ism.cast(y, "int32")]


@handler("QLinearConv", 10)
def _qlinear_conv(c, node, ins):
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = ins[:8]
    acc = conv_nd(node, _centred(x, x_zp), _centred(w, w_zp, 0))
    rank = len(acc.shape)
    if len(ins) > 8 and ins[8] is not None:  # int32 bias at scale x_s * w_s
        acc = ism.add(acc, ism.reshape(ism.cast(ins[8], "float64"), (-1,) + (1,) * (rank - 2)))
    if len(w_s.shape) == 1 and w_s.shape != (1,):
        w_s = ism.reshape(w_s, (-1,) + (1,) * (rank - 2))
    return [_requantize(acc, ism.div(ism.mul(x_s, w_s), y_s), y_zp)]


def qdq_params(graph: Graph) -> Dict[Tensor, Tuple[np.ndarray, np.ndarray, int]]:
    """The quantization an imported QDQ model carries: for each tensor a QuantizeLinear reads, its
    (scale, zero point, axis) when both are Consts. This is what an edge quantizer can use in place of
    calibration (uint8 values map to the edge's int8 by subtracting 128 from value and zero point)."""
    out = {}
    for n in graph.nodes:
        if n.op == "QuantizeLinear" and all(t.node.op == "Const" for t in n.inputs[1:]):
            out[n.inputs[0]] = (np.asarray(n.inputs[1].node.attrs["value"]),
                                np.asarray(n.inputs[2].node.attrs["value"]), n.attrs["axis"])
    return out


@handler("DynamicQuantizeLinear", 11)
def _dynamic_quantize(c, node, ins):
    """uint8 quantization with the scale and zero point of this input's own range (0 included)."""
    x = ins[0]
    f32 = ism.constant(np.float32(0.0))
    hi = ism.maximum(ism.reduce_max(x), f32)
    lo = ism.minimum(ism.reduce_min(x), f32)
    span = ism.where(ism.equal(hi, lo), ism.constant(np.float32(1.0)), ism.sub(hi, lo))
    scale = ism.div(span, ism.constant(np.float32(255.0)))
    zp_f = ism.round(ism.minimum(ism.maximum(ism.neg(ism.div(lo, scale)), f32), ism.constant(np.float32(255.0))))
    zp = ism.cast(zp_f, "uint8")
    y = ism.minimum(ism.maximum(ism.add(ism.round(ism.div(x, scale)), zp_f), f32), ism.constant(np.float32(255.0)))
    return [ism.cast(y, "uint8"), scale, zp]
