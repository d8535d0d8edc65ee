"""ONNX import of ops built from core ops: BitShift and the Bitwise ops, LpNormalization, Swish, Compress,
LpPool, CumProd, EyeLike, CenterCropPad, ReverseSequence, Unique, NonMaxSuppression, DFT, STFT (Xor and Hardmax
live in onnx_ops_elementwise)."""
from __future__ import annotations

import numpy as np

import isthmus.core as ism
from isthmus.core.ops.arange import arange
from isthmus.core.ops.bitwise import bit_shift, bitwise_and, bitwise_not, bitwise_or, bitwise_xor
from isthmus.core.ops.array_dynamic import slice_dynamic
from isthmus.core.ops.pad_dynamic import pad_dynamic
from isthmus.core.ops.selection import cumprod, non_max_suppression, unique
from isthmus.core.ops.spectral import dft, stft

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



@handler("CumProd", 26, attrs=("exclusive", "reverse"))
def _cumprod(c, node, ins):
    axis = c.const_or_none(node, 1)
    axis = int(np.asarray(axis).reshape(-1)[0]) if axis is not None else ins[1]
    return [cumprod(ins[0], axis, bool(_attrs(node).get("exclusive", 0)), bool(_attrs(node).get("reverse", 0)))]


@handler("EyeLike", 9, attrs=("dtype", "k"))
def _eye_like(c, node, ins):
    from onnx import helper  # deferred: onnx is a heavy or optional dependency
    at = _attrs(node)
    x = ins[0]
    refuse_unless(len(x.shape) == 2 and all(d is not None for d in x.shape), "EyeLike needs a 2-D input of known shape")
    dtype = helper.tensor_dtype_to_np_dtype(at["dtype"]) if "dtype" in at else x.dtype
    return [ism.constant(np.eye(x.shape[0], x.shape[1], int(at.get("k", 0)), dtype=dtype), dtype=dtype)]


@handler("CenterCropPad", 18, attrs=("axes",))
def _center_crop_pad(c, node, ins):
    """Crop from the centre (the extra element cut at the end) or zero-pad around it (the extra element
    at the end) each given axis to its target length; the target may be computed at run time."""
    x = ins[0]
    rank = len(x.shape)
    axes = [int(a) % rank for a in _attrs(node).get("axes", range(rank))]
    refuse_unless(len(set(axes)) == len(axes), f"repeated axes {axes}")
    shape = ism.shape(x, "int64")
    d = ism.concat([shape[a:a + 1] for a in axes], 0)
    t = ism.cast(ins[1], np.int64) if ins[1].dtype != np.int64 else ins[1]
    zero = ism.zeros_like(d)
    start = ism.floordiv(ism.maximum(ism.sub(d, t), zero), np.int64(2))
    cropped = ism.slice_dynamic(x, start, ism.add(start, ism.minimum(d, t)), ism.constant(np.array(axes, np.int64)))
    grow = ism.maximum(ism.sub(t, d), zero)
    before = ism.floordiv(grow, np.int64(2))
    where = {a: k for k, a in enumerate(axes)}
    z1 = ism.constant(np.zeros(1, np.int64))
    pads = ism.concat([before[where[a]:where[a] + 1] if a in where else z1 for a in range(rank)] +
                      [ism.sub(grow, before)[where[a]:where[a] + 1] if a in where else z1 for a in range(rank)], 0)
    return [pad_dynamic(cropped, pads)]


@handler("ReverseSequence", 10, attrs=("batch_axis", "time_axis"))
def _reverse_sequence(c, node, ins):
    """Each batch entry's first sequence_lens[b] steps reversed, the rest kept: a gather along the time
    axis with index (len - 1 - t) where t < len, else t."""
    at = _attrs(node)
    x, lens = ins
    b_ax, t_ax = int(at.get("batch_axis", 1)), int(at.get("time_axis", 0))
    refuse_unless({b_ax, t_ax} == {0, 1}, f"batch_axis {b_ax} and time_axis {t_ax} must be 0 and 1")
    xt = x if t_ax == 0 else ism.transpose(x, (1, 0) + tuple(range(2, len(x.shape))))  # [time, batch, ...]
    n_t = ism.shape(xt, "int64")[0]
    t = ism.expand_dims(arange(np.int64(0), n_t, np.int64(1)), 1)  # [time, 1]
    ln = ism.expand_dims(ism.cast(lens, np.int64), 0)  # [1, batch]
    idx = ism.where(ism.less(t, ln), ism.sub(ism.sub(ln, np.int64(1)), t), ism.add(t, ism.zeros_like(ln)))
    for _ in range(len(x.shape) - 2):
        idx = ism.expand_dims(idx, len(idx.shape))
    idx = ism.add(idx, ism.zeros_like(ism.cast(xt, np.int64)))  # broadcast over the trailing dims
    y = ism.gather_elements(xt, idx, 0)
    return [y if t_ax == 0 else ism.transpose(y, (1, 0) + tuple(range(2, len(x.shape))))]


@handler("Unique", 11, attrs=("axis", "sorted"))
def _unique(c, node, ins):
    at = _attrs(node)
    return unique(ins[0], at.get("axis"), bool(at.get("sorted", 1)))


@handler("NonMaxSuppression", 10, attrs=("center_point_box",))
def _nms(c, node, ins):
    defaults = [np.array([0], np.int64), np.array([0.0], np.float32), np.array([-np.inf], np.float32)]
    extra = [ins[k] if len(ins) > k and ins[k] is not None else ism.constant(defaults[k - 2]) for k in (2, 3, 4)]
    return [non_max_suppression(ins[0], ins[1], *extra, center_point_box=int(_attrs(node).get("center_point_box", 0)))]


@handler("DFT", 17, attrs=("axis", "inverse", "onesided"))
def _dft(c, node, ins):
    """Opset 17-19: axis an attribute (default 1); 20+: an input (default -2), read at run time unless known."""
    at = _attrs(node)
    length = ins[1] if len(ins) > 1 else None
    if c.opset >= 20:
        axis = c.const_or_none(node, 2)
        axis = -2 if not c.has_input(node, 2) else (int(np.asarray(axis).reshape(-1)[0]) if axis is not None else ins[2])
    else:
        axis = int(at.get("axis", 1))
    if isinstance(axis, int) and axis < 0:
        axis += len(ins[0].shape)
    return [dft(ins[0], length, axis, bool(at.get("inverse", 0)), bool(at.get("onesided", 0)))]


@handler("STFT", 17, attrs=("onesided",))
def _stft(c, node, ins):
    window = ins[2] if len(ins) > 2 else None
    length = ins[3] if len(ins) > 3 else None
    return [stft(ins[0], ins[1], window, length, bool(_attrs(node).get("onesided", 1)))]
