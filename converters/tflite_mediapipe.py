"""TFLite import of MediaPipe's public custom operators: Convolution2DTransposeBias, MaxPoolingWithArgmax2D
and MaxUnpooling2D. Their custom_options are C structs (TfLiteTransposeConvParams, TfLitePoolParams:
little-endian int32 fields), read with their sizes checked."""
from __future__ import annotations

import struct
from typing import Tuple

import numpy as np

import isthmus.core as ism

from .tflite_import import _ACTS, _Val, _handler, as_nchw
from .tflite_read import TFLiteImportError

_SAME, _VALID = 1, 2  # TfLitePadding (the C enum: 0 is "unknown")


def _ints(imp, op, n: int, what: str) -> Tuple[int, ...]:
    raw = op.custom_options
    if len(raw) < 4 * n:
        raise TFLiteImportError(f"{imp.where(op)}: custom options hold {len(raw)} bytes, {what} needs {4 * n}")
    return struct.unpack_from(f"<{n}i", raw, 0)


def _pool_params(imp, op):
    padding, sw, sh, fw, fh, act = _ints(imp, op, 6, "TfLitePoolParams")
    if padding not in (_SAME, _VALID) or min(sw, sh, fw, fh) < 1 or act not in _ACTS:
        raise TFLiteImportError(f"{imp.where(op)}: pool parameters padding={padding} strides=({sh}, {sw}) "
                                f"filter=({fh}, {fw}) activation={act} are not valid")
    return padding, (sh, sw), (fh, fw), act


def _known_hw(imp, op, x: ism.Tensor):
    h, w = x.shape[2], x.shape[3]
    if h is None or w is None:
        raise TFLiteImportError(f"{imp.where(op)}: needs the spatial size at import, got {x.shape} (NCHW)")
    return h, w


@_handler("custom:Convolution2DTransposeBias")
def _transpose_conv_bias(imp, op):
    padding, sw, sh = _ints(imp, op, 3, "TfLiteTransposeConvParams")
    if padding not in (_SAME, _VALID) or min(sw, sh) < 1:
        raise TFLiteImportError(f"{imp.where(op)}: padding={padding} strides=({sh}, {sw}) are not valid")
    x = as_nchw(imp.value(op, 0))
    weights = imp.const(op, 1, "the weights")  # OHWI
    bias = imp.const(op, 2, "the bias")
    if weights.ndim != 4 or bias.shape != (weights.shape[0],):
        raise TFLiteImportError(f"{imp.where(op)}: weights {weights.shape} (OHWI) and bias {bias.shape} do not match")
    h, w = _known_hw(imp, op, x)
    kh, kw = weights.shape[1], weights.shape[2]
    pads = []
    for n, k, s in ((h, kh, sh), (w, kw, sw)):
        total = max(0, k - (n - 1) % s - 1) if padding == _SAME else 0
        pads.append((total // 2, total - total // 2))  # the output is trimmed by total, total // 2 in front
    y = ism.conv_transpose2d(x, np.ascontiguousarray(weights.transpose(3, 0, 1, 2)), (sh, sw), tuple(pads))
    return [_Val(ism.bias_add(y, bias.astype(np.float32), axis=1), True)]


@_handler("custom:MaxPoolingWithArgmax2D")
def _max_pool_argmax(imp, op):
    """The window maximum, and where in the window it is (y * filter_width + x, as float32 + 0.1, the
    first of equal maxima), over windows clamped to the input (padding never wins)."""
    padding, (sh, sw), (fh, fw), act = _pool_params(imp, op)
    x = as_nchw(imp.value(op, 0))
    h, w = _known_hw(imp, op, x)
    outs, pads = [], []
    for n, k, s in ((h, fh, sh), (w, fw, sw)):
        out = -(-n // s) if padding == _SAME else (n - k + s) // s
        front = max(((out - 1) * s + k - n) // 2, 0)
        outs.append(out)
        pads.append((front, max((out - 1) * s + k - n - front, 0)))
    xp = ism.pad(x, [(0, 0), (0, 0)] + pads, constant_value=-np.inf)
    taps = [xp[:, :, dy:dy + sh * (outs[0] - 1) + 1:sh, dx:dx + sw * (outs[1] - 1) + 1:sw]
            for dy in range(fh) for dx in range(fw)]
    stacked = ism.concat([ism.expand_dims(t, -1) for t in taps], -1)  # [N, C, OH, OW, fh * fw]
    value = ism.reduce_max(stacked, -1)
    where = ism.add(ism.cast(ism.argmax(stacked, -1), "float32"), np.float32(0.1))
    if _ACTS[act] is not None:
        value = _ACTS[act](value)
    return [_Val(value, True), _Val(where, True)]


@_handler("custom:MaxUnpooling2D")
def _max_unpooling(imp, op):
    """Each value written back at the window position its index names, zeros elsewhere; for windows that
    tile the output (stride == filter, MediaPipe's use), as a depth-to-space of one masked map per position."""
    padding, (sh, sw), (fh, fw), act = _pool_params(imp, op)
    if (sh, sw) != (fh, fw):
        raise TFLiteImportError(f"{imp.where(op)}: only strides equal to the filter ({fh}, {fw}) are supported, "
                                f"got ({sh}, {sw})")
    x, idx = as_nchw(imp.value(op, 0)), as_nchw(imp.value(op, 1))
    h, w = _known_hw(imp, op, x)
    if x.shape[1] is None:
        raise TFLiteImportError(f"{imp.where(op)}: needs the channel count at import, got {x.shape} (NCHW)")
    pos = ism.cast(idx, "int32")  # the float index truncates, as the C++ kernel's int conversion does
    zero = ism.zeros_like(x)
    maps = [ism.expand_dims(ism.where(ism.equal(pos, np.int32(dy * fw + dx)), x, zero), -1)
            for dy in range(fh) for dx in range(fw)]
    stacked = ism.reshape(ism.concat(maps, -1), (-1, x.shape[1], h, w, fh, fw))
    y = ism.reshape(ism.transpose(stacked, (0, 1, 2, 4, 3, 5)), (-1, x.shape[1], h * fh, w * fw))
    return [_Val(y, True)]
