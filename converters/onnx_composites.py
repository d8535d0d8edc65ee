"""ONNX import of ops built from existing core ops: BitShift and the Bitwise ops, LpNormalization,
Swish, Compress and LpPool (Xor and Hardmax live in onnx_ops_elementwise)."""
from __future__ import annotations

import numpy as np

import isthmus.core as ism
from isthmus.core.ops.bitwise import bit_shift, bitwise_and, bitwise_not, bitwise_or, bitwise_xor

from .onnx_import import _attrs, _s, handler, refuse_unless
from .onnx_nn import _conv_pads


@handler("BitShift", 11, attrs=("direction",))
def _bit_shift(c, node, ins):
    direction = _s(_attrs(node).get("direction", ""))
    refuse_unless(direction in ("LEFT", "RIGHT"), f"direction '{direction}' is not LEFT or RIGHT")
    return [bit_shift(ins[0], ins[1], direction)]


for _op, _fn in (("BitwiseAnd", bitwise_and), ("BitwiseOr", bitwise_or), ("BitwiseXor", bitwise_xor)):
    handler(_op, 18, attrs=())((lambda f: lambda c, node, ins: [f(ins[0], ins[1])])(_fn))
handler("BitwiseNot", 18, attrs=())(lambda c, node, ins: [bitwise_not(ins[0])])


@handler("LpNormalization", 1, attrs=("axis", "p"))
def _lp_normalization(c, node, ins):
    at = _attrs(node)
    x = ins[0]
    p, axis = int(at.get("p", 2)), int(at.get("axis", -1))
    refuse_unless(p in (1, 2), f"p = {p} is not supported (1 and 2 are)")
    norm = ism.reduce_sum(ism.abs(x), (axis,), keepdims=True) if p == 1 else \
        ism.sqrt(ism.reduce_sum(ism.square(x), (axis,), keepdims=True))
    zero = ism.zeros_like(norm)
    return [ism.div(x, ism.where(ism.equal(norm, zero), ism.ones_like(norm), norm))]


@handler("Swish", 24, attrs=("alpha",))
def _swish(c, node, ins):
    x = ins[0]
    alpha = float(_attrs(node).get("alpha", 1.0))
    xf = ism.cast(x, np.float32) if x.dtype == np.float16 else x  # float16: one rounding, at the end
    y = ism.mul(xf, ism.sigmoid(xf if alpha == 1.0 else ism.mul(xf, np.array(alpha, xf.dtype))))
    return [y if y.dtype == x.dtype else ism.cast(y, x.dtype)]


@handler("Compress", 9, attrs=("axis",))
def _compress(c, node, ins):
    """The slices along `axis` (of the flattened input without one) where the condition is true; a
    condition shorter than the axis drops the rest."""
    at = _attrs(node)
    x, cond = ins
    if "axis" not in at:
        x, axis = ism.reshape(x, (-1,)), 0
    else:
        axis = int(at["axis"]) % len(x.shape)
    refuse_unless(len(cond.shape) == 1, f"the condition must be 1-D, got rank {len(cond.shape)}")
    idx = ism.reshape(ism.nonzero(cond), (-1,))
    return [ism.gather(x, idx, axis)]


@handler("LpPool", 2, attrs=("auto_pad", "ceil_mode", "dilations", "kernel_shape", "p", "pads", "strides"))
def _lp_pool(c, node, ins):
    """(sum over each window of |x|^p)^(1/p), zero padding: an average pool of the padded |x|^p times the
    window size. 1-D inputs run as 2-D with a unit height."""
    at = _attrs(node)
    x = ins[0]
    one_d = len(x.shape) == 3
    refuse_unless(len(x.shape) in (3, 4), f"only 1-D and 2-D LpPool is supported, the input has rank {len(x.shape)}")
    refuse_unless(not at.get("ceil_mode", 0), "ceil_mode is not supported")
    k = list(at["kernel_shape"])
    s = list(at.get("strides", [1] * len(k)))
    d = list(at.get("dilations", [1] * len(k)))
    p = float(at.get("p", 2))
    refuse_unless(p > 0, f"p = {p} must be positive")
    if one_d:
        x = ism.expand_dims(x, 2)
        k, s, d = [1] + k, [1] + s, [1] + d
        if "pads" in at:
            at = dict(at, pads=[0, at["pads"][0], 0, at["pads"][1]])
    pads = _conv_pads(at, x.shape[2:], k, s, d)
    powered = ism.abs(x) if p == 1 else ism.pow(ism.abs(x), np.array(p, x.dtype))
    if any(a or b for a, b in pads):
        powered = ism.pad(powered, ((0, 0), (0, 0)) + tuple(pads))
    total = ism.mul(ism.avg_pool(powered, tuple(k), tuple(s), ((0, 0), (0, 0)), dilations=tuple(d)),
                    np.array(float(np.prod(k)), x.dtype))
    y = total if p == 1 else ism.pow(total, np.array(1.0 / p, x.dtype))
    return [ism.squeeze(y, (2,)) if one_d else y]

