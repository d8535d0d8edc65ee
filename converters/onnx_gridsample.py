"""ONNX GridSample import (2-D and 3-D; nearest, linear, cubic; zeros, border, reflection padding),
as core ops: per spatial dim, the sampling coordinate and its taps' indices and weights; each
combination of taps is one gather of the flattened input, weighted and summed. Differentiable in
the input and (through the weights) in the grid, as core's gather and arithmetic are.
"""
from __future__ import annotations

import itertools

import numpy as np

import isthmus.core as ism
from isthmus.core.ops.arange import arange

from .onnx_import import _attrs, _s, handler, refuse_unless

_CUBIC_A = -0.75  # Keys' cubic convolution, as ONNX and PyTorch use


def _k(v, dt=None):
    """An integer constant tensor, or a Python float (which takes the dtype of the tensor it meets)."""
    return float(v) if dt is None else ism.constant(np.array(v, dt))


def _reflect(v, lo: float, hi: float):
    """v folded back into [lo, hi] by the nearer border, as many times as it takes."""
    span = hi - lo
    out = v
    for below in (True, False):
        dx = ism.sub(_k(lo), v) if below else ism.sub(v, _k(hi))
        n = ism.floor(ism.div(dx, _k(span)))
        r = ism.sub(dx, ism.mul(n, _k(span)))
        even = ism.equal(ism.mod(n, _k(2.0)), _k(0.0))
        near, far = (lo, hi) if below else (hi, lo)
        folded = ism.where(even, ism.add(_k(near), r) if below else ism.sub(_k(near), r),
                           ism.sub(_k(far), r) if below else ism.add(_k(far), r))
        out = ism.where(ism.less(v, _k(lo)) if below else ism.greater(v, _k(hi)), folded, out)
    return out


def _cubic_weights(t):
    a = _CUBIC_A

    def near(x):  # |x| <= 1
        return ism.add(ism.mul(ism.mul(ism.sub(ism.mul(x, a + 2), _k(a + 3)), x), x), _k(1.0))

    def far(x):  # 1 < |x| < 2
        return ism.sub(ism.mul(ism.add(ism.mul(ism.sub(ism.mul(x, a), _k(5 * a)), x), _k(8 * a)), x), _k(4 * a))
    one = _k(1.0)
    return [far(ism.add(t, one)), near(t), near(ism.sub(one, t)), far(ism.sub(_k(2.0), t))]


def _taps(v, size: int, mode: str, padding: str, align: bool):
    """[(integer index tensor, weight tensor or None, in-range mask or None)] for one spatial dim."""
    lo, hi = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
    if mode == "nearest":
        v = ism.round(v)
    outside = ism.logical_or(ism.less(v, _k(lo)), ism.greater(v, _k(hi)))
    if padding == "border":
        v = ism.where(outside, ism.minimum(ism.maximum(v, _k(0.0)), _k(size - 1.0)), v)
    elif padding == "reflection":
        v = ism.where(outside, _reflect(v, lo, hi), v)
    if mode == "nearest":
        offsets, weights, base = [0], [None], v
    else:
        base = ism.floor(v)
        t = ism.sub(v, base)
        offsets = [0, 1] if mode == "linear" else [-1, 0, 1, 2]
        weights = [ism.sub(_k(1.0), t), t] if mode == "linear" else _cubic_weights(t)
    out = []
    for off, w in zip(offsets, weights):
        i = ism.add(base, _k(float(off))) if off else base
        mask = None
        if padding == "zeros":
            mask = ism.logical_and(ism.greater_equal(i, _k(0.0)), ism.less_equal(i, _k(size - 1.0)))
            i = ism.minimum(ism.maximum(i, _k(0.0)), _k(size - 1.0))
        elif padding == "border":
            i = ism.minimum(ism.maximum(i, _k(0.0)), _k(size - 1.0))
        else:
            i = _reflect(i, lo, hi) if size > 1 else ism.mul(i, 0.0)
        out.append((ism.cast(i, np.int64), w, mask))  # the cast truncates toward zero, as the reference's int()
    return out


@handler("GridSample", 16, attrs=("align_corners", "mode", "padding_mode"))
def _grid_sample(c, node, ins):
    at = _attrs(node)
    x, grid = ins
    mode = _s(at.get("mode", "linear" if c.opset >= 20 else "bilinear"))
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    padding = _s(at.get("padding_mode", "zeros"))
    align = bool(at.get("align_corners", 0))
    refuse_unless(mode in ("nearest", "linear", "cubic"), f"mode '{mode}' is not nearest, linear or cubic")
    refuse_unless(padding in ("zeros", "border", "reflection"), f"padding_mode '{padding}' is not supported")
    dims = list(x.shape[2:])
    refuse_unless(len(dims) in (2, 3) and len(grid.shape) == len(dims) + 2 and grid.shape[-1] == len(dims),
                  f"input {list(x.shape)} and grid {list(grid.shape)} do not form a 2-D or 3-D GridSample")
    refuse_unless(all(d is not None for d in dims) and x.shape[1] is not None,
                  "the input's channel and spatial dims must be known at import")
    refuse_unless(not (mode == "cubic" and len(dims) == 3), "cubic mode is defined for 2-D only")
    ch, total = x.shape[1], int(np.prod(dims))
    out_dims = tuple(grid.shape[1:-1])
    refuse_unless(None not in out_dims, "the grid's output spatial dims must be known at import")
    coords = grid if grid.dtype in (np.float32, np.float64) else ism.cast(grid, np.float32)  # float16: in float32
    g = ism.reshape(coords, (-1, int(np.prod(out_dims)), len(dims)))  # (N, P, d)
    per_dim = []
    for k, size in enumerate(dims):  # grid's last axis lists coordinates innermost first (x = W, then H, D)
        gk = g[:, :, len(dims) - 1 - k]
        v = ism.mul(ism.add(gk, _k(1.0)), (size - 1) / 2.0) if align else \
            ism.div(ism.sub(ism.mul(ism.add(gk, _k(1.0)), float(size)), _k(1.0)), _k(2.0))
        per_dim.append(_taps(v, size, mode, padding, align))
    strides = [int(np.prod(dims[k + 1:])) for k in range(len(dims))]
    flat = ism.reshape(ism.transpose(ism.reshape(x, (-1, ch, total)), (0, 2, 1)), (-1, ch))  # (N*S, C)
    n = ism.reshape(ism.shape(x, "int64")[0:1], ())
    batch_base = ism.reshape(ism.mul(arange(_k(0, np.int64), n), _k(total, np.int64)), (-1, 1))  # (N, 1)
    out = None
    for combo in itertools.product(*per_dim):
        idx = batch_base
        w, mask = None, None
        for (i, wk, mk), stride in zip(combo, strides):
            idx = ism.add(idx, ism.mul(i, _k(stride, np.int64)) if stride != 1 else i)
            w = wk if w is None else (w if wk is None else ism.mul(w, wk))
            mask = mk if mask is None else (mask if mk is None else ism.logical_and(mask, mk))
        if mask is not None:
            ones = ism.ones_like(g[:, :, 0])
            w = ism.where(mask, ones if w is None else w, ism.zeros_like(ones))
        vals = ism.gather(flat, idx, 0)  # (N, P, C)
        term = vals if w is None else ism.mul(vals, ism.expand_dims(ism.cast(w, x.dtype), -1))
        out = term if out is None else ism.add(out, term)
    y = ism.transpose(out, (0, 2, 1))  # (N, C, P)
    return [ism.reshape(y, (-1, ch) + out_dims)]
