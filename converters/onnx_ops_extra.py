"""ONNX import of small ops built from core ops: Shrink, MeanVarianceNormalization, the Hann, Hamming
and Blackman windows, SwiGLU, CausalConvWithState, BitCast, TensorScatter, MaxUnpool, AffineGrid and Det
(the ops the conformance run refused most cheaply: each is a few core ops, so each is
differentiable where its parts are)."""
from __future__ import annotations

import numpy as np

import isthmus.core as ism
from isthmus.core.ops.arange import arange
from isthmus.core.ops.bitwise import bitcast
from isthmus.core.ops.det import det
from isthmus.core.ops.pad_dynamic import pad_dynamic

from .onnx_import import ImportError_, _attrs, _pick, _s, handler, refuse_unless


@handler("Shrink", 9, attrs=("bias", "lambd"))
def _shrink(c, node, ins):
    """x + bias below -lambd, x - bias above lambd, 0 between."""
    at = _attrs(node)
    x = ins[0]
    lam, bias = float(at.get("lambd", 0.5)), float(at.get("bias", 0.0))
    dt = x.dtype

    def k(v):
        return ism.constant(np.array(v, dt))
    return [ism.where(ism.less(x, k(-lam)), ism.add(x, k(bias)),
                      ism.where(ism.greater(x, k(lam)), ism.sub(x, k(bias)), ism.zeros_like(x)))]


@handler("MeanVarianceNormalization", 9, attrs=("axes",))
def _mvn(c, node, ins):
    """(x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9) over `axes` (default N, H, W), as ONNX's function body."""
    x = ins[0]
    axes = tuple(int(a) for a in _attrs(node).get("axes", (0, 2, 3)))
    mean = ism.reduce_mean(x, axes, keepdims=True)
    var = ism.sub(ism.reduce_mean(ism.square(x), axes, keepdims=True), ism.square(mean))
    std = ism.add(ism.sqrt(var), ism.constant(np.array(1e-9, x.dtype)))
    return [ism.div(ism.sub(x, mean), std)]


# name -> [(coefficient, cosine harmonic)]: w[n] = sum of coefficient * cos(2 pi harmonic n / N)
_WINDOWS = {"HannWindow": [(0.5, 0), (-0.5, 1)],  # the first term is the constant one
            "HammingWindow": [(25.0 / 46.0, 0), (-(1 - 25.0 / 46.0), 1)],
            "BlackmanWindow": [(0.42, 0), (-0.5, 1), (0.08, 2)]}


def _window(terms):
    def h(c, node, ins):
        """A window of `size` (known at import or at run time) points; N = size (periodic) or size - 1."""
        from onnx import helper  # deferred: onnx is a heavy or optional dependency
        at = _attrs(node)
        out_dtype = helper.tensor_dtype_to_np_dtype(int(at.get("output_datatype", 1)))
        size = ism.cast(ism.reshape(ins[0], ()), np.int64)
        n = ism.cast(arange(ism.constant(np.array(0, np.int64)), size), np.float64)
        span = ism.cast(size if at.get("periodic", 1) else ism.sub(size, ism.constant(np.array(1, np.int64))),
                        np.float64)
        phase = ism.div(ism.mul(n, ism.constant(np.array(2 * np.pi))), span)
        w = ism.mul(ism.ones_like(n), terms[0][0])
        for coef, harmonic in terms[1:]:
            w = ism.add(w, ism.mul(ism.cos(ism.mul(phase, float(harmonic))), coef))
        return [ism.cast(w, out_dtype)]
    return h


for _op, _terms in _WINDOWS.items():
    handler(_op, 17, attrs=("output_datatype", "periodic"))(_window(_terms))


def _silu(x, alpha: float = 1.0):
    """x * sigmoid(alpha x), float16 computed in float32 (one rounding, at the end)."""
    xf = ism.cast(x, np.float32) if x.dtype == np.float16 else x
    y = ism.mul(xf, ism.sigmoid(xf if alpha == 1.0 else ism.mul(xf, np.array(alpha, xf.dtype))))
    return y if y.dtype == x.dtype else ism.cast(y, x.dtype)


@handler("SwiGLU", 28, attrs=("alpha",))
def _swiglu(c, node, ins):
    a, b = ins
    refuse_unless(a.shape == b.shape or None in a.shape or None in b.shape,
                  f"A {list(a.shape)} and B {list(b.shape)} must have the same shape (no broadcasting)")
    return [ism.mul(_silu(a, float(_attrs(node).get("alpha", 1.0))), b)]


@handler("CausalConvWithState", 27, attrs=("activation",))
def _causal_conv(c, node, ins):
    """Depthwise 1-D conv over [past_state (or k-1 zeros), input]; present_state is the last k-1 positions
    of that concatenation. The convolution is the imported Conv (group = channels)."""
    from onnx import helper  # deferred: onnx is a heavy or optional dependency
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    past = ins[3] if len(ins) > 3 else None
    act = _s(_attrs(node).get("activation", "none"))
    refuse_unless(act in ("none", "silu", "swish"), f"activation '{act}' is not none, silu or swish")
    refuse_unless(len(x.shape) == 3 and len(w.shape) == 3 and w.shape[2] is not None,
                  f"input {list(x.shape)} and weight {list(w.shape)} must be rank 3 with a known kernel size")
    ch, k = x.shape[1], w.shape[2]
    refuse_unless(ch is not None, "the channel count must be known at import")
    if past is None:
        padded = ism.pad(x, ((0, 0), (0, 0), (k - 1, 0))) if k > 1 else x
    else:
        padded = ism.concat([past, x], 2)
    conv = helper.make_node("Conv", ["x", "w"] + (["b"] if bias is not None else []), ["y"], group=ch,
                            kernel_shape=[k], strides=[1], pads=[0, 0], dilations=[1])
    y = _pick("Conv", c.opset)(c, conv, [padded, w] + ([bias] if bias is not None else []))[0]
    if act != "none":
        y = _silu(y)
    present = padded[:, :, -(k - 1):] if k > 1 else padded[:, :, 0:0]
    return [y, present]


@handler("BitCast", 26, attrs=("to",))
def _bitcast(c, node, ins):
    from onnx import helper  # deferred: onnx is a heavy or optional dependency
    at = _attrs(node)
    refuse_unless("to" in at, "the 'to' attribute is required")
    try:
        to = np.dtype(helper.tensor_dtype_to_np_dtype(int(at["to"])))
    except Exception:  # noqa: BLE001
        raise ImportError_(f"'to' = {at['to']} is not an ONNX element type") from None
    refuse_unless(to.kind in "fiub" and to.isnative, f"'to' = {to} is not supported (numeric and bool types are)")
    return [bitcast(ins[0], to)]


@handler("TensorScatter", 24, attrs=("axis", "mode"))
def _tensor_scatter(c, node, ins):
    """present = past with update written along `axis` from write_indices[b] (0 when absent) on, the
    position taken modulo the cache length in circular mode: one ScatterElements."""
    at = _attrs(node)
    past, update = ins[0], ins[1]
    w = ins[2] if len(ins) > 2 else None
    r = len(past.shape)
    axis = int(at.get("axis", -2))
    axis = axis + r if axis < 0 else axis
    mode = _s(at.get("mode", "linear"))
    refuse_unless(mode in ("linear", "circular"), f"mode '{mode}' is not linear or circular")
    refuse_unless(0 < axis < r and len(update.shape) == r, f"axis {at.get('axis', -2)} does not fit rank {r} "
                                                             "(the batch axis 0 cannot be the sequence axis)")
    along = [1] * r
    along[axis] = -1
    seq_len = ism.reshape(ism.shape(update, "int64")[axis:axis + 1], ())
    idx = ism.reshape(arange(ism.constant(np.array(0, np.int64)), seq_len), along)
    if w is not None:
        idx = ism.add(idx, ism.reshape(ism.cast(w, np.int64), [-1] + [1] * (r - 1)))
    if mode == "circular":
        idx = ism.mod(idx, ism.shape(past, "int64")[axis:axis + 1])
    idx = ism.add(idx, ism.cast(ism.zeros_like(update), np.int64))  # broadcast to the update's shape
    return [ism.scatter_elements(past, idx, update, axis)]


@handler("MaxUnpool", 9, attrs=("kernel_shape", "pads", "strides"))
def _max_unpool(c, node, ins):
    """Each value of X written at its index (flat over the whole inferred output, as MaxPool's Indices
    count) into zeros; an output_shape input pads that at the end of each axis."""
    at = _attrs(node)
    x, idx = ins[0], ins[1]
    k = list(at["kernel_shape"])
    d = len(k)
    s = list(at.get("strides", [1] * d))
    p = list(at.get("pads", [0] * (2 * d)))
    spatial = x.shape[2:]
    refuse_unless(len(spatial) == d and None not in spatial and x.shape[1] is not None,
                  f"input {list(x.shape)}: channel and spatial dims must be known, rank {d + 2}")
    out_sp = [(n - 1) * st - (p[i] + p[i + d]) + k[i] for i, (n, st) in enumerate(zip(spatial, s))]
    per_image = int(x.shape[1] * np.prod(out_sp))
    n = ism.reshape(ism.shape(x, "int64")[0:1], ())
    size = ism.reshape(ism.mul(n, ism.constant(np.array(per_image, np.int64))), (1,))
    flat = ism.scatter_elements(ism.fill(size, 0, x.dtype), ism.reshape(ism.cast(idx, np.int64), (-1,)),
                                ism.reshape(x, (-1,)), 0)
    y = ism.reshape(flat, [-1, x.shape[1]] + out_sp)
    if len(ins) > 2 and ins[2] is not None:  # grow each axis to output_shape, zeros after
        extra = ism.sub(ism.cast(ins[2], np.int64), ism.shape(y, "int64"))
        y = pad_dynamic(y, ism.concat([ism.mul(extra, ism.constant(np.array(0, np.int64))), extra], 0))
    return [y]


@handler("AffineGrid", 20, attrs=("align_corners",))
def _affine_grid(c, node, ins):
    """theta (N, 2, 3) or (N, 3, 4) applied to the normalized coordinates of a (D,) H, W grid whose size
    comes at run time: [x, y, (z,) 1] per point, one batched matmul, reshaped to (N, (D,) H, W, 2|3)."""
    theta, size = ins
    align = bool(_attrs(node).get("align_corners", 0))
    refuse_unless(len(theta.shape) == 3 and theta.shape[1] in (2, 3), f"theta {list(theta.shape)} is not (N, 2, 3) "
                                                                       "or (N, 3, 4)")
    d = theta.shape[1]
    dt = theta.dtype
    sz = ism.cast(size, np.int64)
    axes = []  # per spatial dim (D,) H, W: its normalized coordinates, shaped to broadcast over the grid
    for k in range(d):
        n = ism.reshape(sz[2 + k:3 + k], ())
        i = ism.cast(arange(ism.constant(np.array(0, np.int64)), n), dt)
        nf = ism.cast(n, dt)
        v = ism.sub(ism.div(ism.mul(i, 2.0), ism.sub(nf, 1.0)), 1.0) if align else \
            ism.sub(ism.div(ism.add(ism.mul(i, 2.0), 1.0), nf), 1.0)
        shape = [1] * d
        shape[k] = -1
        axes.append(ism.reshape(v, shape))
    zero = None
    for a in axes:
        z = ism.mul(a, 0.0)
        zero = z if zero is None else ism.add(zero, z)  # zeros of the full grid's shape
    coords = [ism.add(a, zero) for a in reversed(axes)] + [ism.add(zero, 1.0)]  # x (W) first, then y, (z), 1
    grid = ism.reshape(ism.concat([ism.expand_dims(t, -1) for t in coords], -1), (1, -1, d + 1))
    out = ism.matmul(grid, ism.transpose(theta, (0, 2, 1)))  # (N, points, d)
    shape = ism.concat([ism.shape(theta, "int64")[0:1], sz[2:2 + d], ism.constant(np.array([d], np.int64))], 0)
    return [ism.cast(ism.reshape_to(out, shape), np.float32)]


@handler("Det", 11, attrs=())
def _det(c, node, ins):
    return [det(ins[0])]
