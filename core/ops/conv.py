"""Convolution and pooling on NCHW tensors (weights OIHW), at BLAS speed.

conv2d with stride 1 along H and enough channels copies only the kernel's columns of the input
("row taps": a [kw*C, H*OW*N] matrix, W-padded only, kw times the input instead of kh*kw times)
and runs one GEMM per kernel row over the output rows it reaches (rows that would read only H
padding are skipped), or one stacked GEMM and shifted adds when O is small; otherwise it builds
the im2col matrix one image at a time and multiplies it. 1x1 convolutions are a GEMM on the
input as it lies. The filter gradient is the same GEMMs against the same columns; the input
gradient of a stride-1 convolution is itself a convolution (of dy with the flipped, transposed
weights), else one GEMM and one strided add per kernel tap. Depthwise convolutions skip the
GEMM: compiled loops (isthmus.jit, forward and both gradients) where numba serves, else
depthwise.py's chunked forward and a multiply-add per kernel tap for the gradients.
"""
from __future__ import annotations

import sys
from typing import Optional, Tuple

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import fmt, num_elements_est
from .base import convert, make
from .depthwise import (_CLAMPS, ARENAS, DepthwiseConv, _immutable, compiled_filter_grad, compiled_input_grad,
                        compiled_ok)
from .fused import activation_inplace

__all__ = ["conv2d", "depthwise_conv2d", "max_pool", "avg_pool", "global_avg_pool"]


def _pair(v, what) -> Tuple[int, int]:
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    v = tuple(int(a) for a in v)
    if len(v) != 2:
        raise ShapeError(f"{what} must be an int or a pair, got {v}")
    return v


def _pads(padding, size, k, stride, dil):
    """((top, bottom), (left, right)) for SAME/VALID/explicit padding (TensorFlow's SAME)."""
    if isinstance(padding, str):
        p = padding.upper()
        if p == "VALID":
            return ((0, 0), (0, 0))
        if p != "SAME":
            raise ShapeError(f"padding must be SAME, VALID or explicit, got {padding!r}")
        out = []
        for n, kk, s, d in zip(size, k, stride, dil):
            if n is None:
                raise ShapeError("SAME padding needs known spatial dims")
            total = max((-(-n // s) - 1) * s + (kk - 1) * d + 1 - n, 0)
            out.append((total // 2, total - total // 2))
        return tuple(out)
    p = tuple(padding)
    if len(p) == 4:
        return ((int(p[0]), int(p[1])), (int(p[2]), int(p[3])))
    if len(p) == 2 and all(isinstance(a, (tuple, list)) for a in p):
        return tuple((int(a), int(b)) for a, b in p)
    raise ShapeError(f"explicit padding must be ((top, bottom), (left, right)) or 4 ints, got {padding!r}")


def _out_size(n, k, s, d, pads):
    if n is None:
        return None
    eff = (k - 1) * d + 1
    o = (n + pads[0] + pads[1] - eff) // s + 1
    if o <= 0:
        raise ShapeError(f"window {k} (dilation {d}) does not fit input {n} with padding {pads}")
    return o


def _windows(xp_, kh, kw, oh, ow, sh, sw, dh, dw):
    """View [N, C, kh, kw, OH, OW] of a padded NCHW array (no copy)."""
    n, c, _, _ = xp_.shape
    s0, s1, s2, s3 = xp_.strides
    return as_strided(xp_, (n, c, kh, kw, oh, ow), (s0, s1, dh * s2, dw * s3, sh * s2, sw * s3), writeable=False)


def _padded(xp, x, pads, value=0.0):
    (t, b), (l, r) = pads
    if not (t or b or l or r):
        return x if x.flags.c_contiguous else xp.ascontiguousarray(x)
    n, c, h, w = x.shape
    out = xp.full((n, c, h + t + b, w + l + r), value, dtype=x.dtype)
    out[:, :, t:t + h, l:l + w] = x
    return out


def _chwn_padded(xp, x, pads):
    """x [N, C, H, W] as a zero-padded [C, Hp, Wp, N] array: in this layout each row of a
    kernel window is one contiguous run of OW*N values, so im2col and col2im move long runs."""
    (t, b), (l, r) = pads
    n, c, h, w = x.shape
    out = xp.zeros((c, h + t + b, w + l + r, n), dtype=x.dtype)
    out[:, t:t + h, l:l + w, :] = x.transpose(1, 2, 3, 0)
    return out


def _cols_chwn(xp, xt, g, c0=0, c1=None):
    """im2col rows (channel, tap) by columns (oh, ow, n), from a [C, Hp, Wp, N] array."""
    xt = xt[c0:c1]
    c, _, _, n = xt.shape
    s0, s1, s2, s3 = xt.strides
    win = as_strided(xt, (c, g.kh, g.kw, g.oh, g.ow, n),
                     (s0, g.dh * s1, g.dw * s2, g.sh * s1, g.sw * s2, s3), writeable=False)
    return xp.ascontiguousarray(win).reshape(c * g.kh * g.kw, g.oh * g.ow * n)


# a 1x1 convolution's output is finished in groups of images of about this many bytes (in cache)
_POINTWISE_CHUNK_BYTES = 1 << 20


class _Geometry:
    __slots__ = ("kh", "kw", "sh", "sw", "dh", "dw", "pads", "oh", "ow", "groups")


# Row taps pay when each kernel row's GEMM has a deep enough contraction (kw*C) to run BLAS
# at full speed; below this the full im2col's one deep GEMM wins (measured on 2 cores).
_ROW_TAPS_MIN_K = 64


def _row_taps(g, c) -> bool:
    return g.groups == 1 and g.sh == 1 and g.kh > 1 and c * g.kw >= _ROW_TAPS_MIN_K


def _cols_kw(xp, xt, g):
    """[kw*C, Hp*OW*N] from a [C, Hp, Wp, N] array: row (j, c) holds x[c, :, ow*sw + j*dw, :].
    Kernel row i's im2col block is then the contiguous column slice starting at i*dh*OW*N."""
    c, hp, _, n = xt.shape
    s0, s1, s2, s3 = xt.strides
    view = as_strided(xt, (g.kw, c, hp, g.ow, n), (g.dw * s2, s0, s1, g.sw * s2, s3), writeable=False)
    return xp.ascontiguousarray(view).reshape(g.kw * c, hp * g.ow * n)


def _transposed_geometry(g, h, w) -> Optional["_Geometry"]:
    """The geometry under which dx = conv2d(dy, flipped transposed weights), for stride 1
    (None when the padding exceeds the kernel's extent and the identity does not hold)."""
    if (g.sh, g.sw) != (1, 1) or g.groups != 1:
        return None
    eh, ew = g.dh * (g.kh - 1), g.dw * (g.kw - 1)
    (t, b), (l, r) = g.pads
    pads = ((eh - t, eh - b), (ew - l, ew - r))
    if min(pads[0] + pads[1]) < 0:
        return None
    t2 = _Geometry()
    t2.kh, t2.kw, t2.sh, t2.sw, t2.dh, t2.dw = g.kh, g.kw, 1, 1, g.dh, g.dw
    t2.pads, t2.oh, t2.ow, t2.groups = pads, h, w, 1
    return t2


def _geometry(node, x_shape, w_shape) -> _Geometry:
    g = _Geometry()
    g.kh, g.kw = w_shape[2], w_shape[3]
    g.sh, g.sw = node.attrs["strides"]
    g.dh, g.dw = node.attrs["dilations"]
    g.pads = node.attrs["pads"]
    g.oh = _out_size(x_shape[2], g.kh, g.sh, g.dh, g.pads[0])
    g.ow = _out_size(x_shape[3], g.kw, g.sw, g.dw, g.pads[1])
    g.groups = node.attrs["groups"]
    return g


def _infer_conv(node):
    x, w = node.inputs[0], node.inputs[1]
    if x.dtype != w.dtype or x.dtype.kind != "f":
        raise ShapeError(f"conv needs float input and weights of one dtype, got {x.dtype.name} and {w.dtype.name}")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ShapeError(f"conv needs NCHW input and OIHW weights, got {fmt(x.shape)} and {fmt(w.shape)}")
    groups = node.attrs["groups"]
    c, o = x.shape[1], w.shape[0]
    if any(d is None for d in w.shape):  # weights fed at run time: the kernel works the geometry out then
        return [(x.dtype, (x.shape[0], o, None, None))]
    if o % groups or (c is not None and (c % groups or c // groups != w.shape[1])):
        raise ShapeError(f"input channels {c} and weights {fmt(w.shape)} do not fit groups={groups} "
                         f"(weights must be [out, in/groups, kh, kw])")
    g = _geometry(node, x.shape, w.shape)
    return [(x.dtype, (x.shape[0], o, g.oh, g.ow))]


def _depthwise(node, w_shape, c):
    return node.attrs["groups"] == c and w_shape[1] == 1 and w_shape[0] == c


def _kernel_conv(node, ctx, activation: str = "none"):
    """conv(x, w[, bias]) -> activation(conv2d(x, w) + bias), the bias and activation applied
    while each chunk of the output is still in cache where the path allows."""
    xp = ctx.xp
    groups = node.attrs["groups"]
    act = None if activation == "none" else activation_inplace(xp, activation)
    depthwise = DepthwiseConv(xp, activation)
    pointwise = _Pointwise(xp, act, activation)
    cache = {}

    def geom(x_shape, w_shape):
        g = cache.get((x_shape, w_shape))
        if g is None:
            g = cache[(x_shape, w_shape)] = _geometry(node, x_shape, w_shape)
        return g

    def conv(x, w, bias=None):
        n, c = x.shape[0], x.shape[1]
        g = geom(x.shape, w.shape)
        o = w.shape[0]
        if _depthwise(node, w.shape, c):
            return depthwise(x, w, g, bias)
        if groups == 1 and g.kh == g.kw == 1 and (g.sh, g.sw) == (1, 1) and g.pads == ((0, 0), (0, 0)):
            return pointwise(x, w, bias).reshape(n, o, g.oh, g.ow)
        if not _row_taps(g, c):
            return _im2col_per_image(xp, x, w, g, bias, act)
        y = xp.ascontiguousarray(_conv_rows(xp, x, w, g).transpose(3, 0, 1, 2))
        if bias is not None:
            xp.add(y, bias.reshape(1, -1, 1, 1), out=y)
        return y if act is None else act(y)
    return conv


def _im2col_per_image(xp, x, w, g, bias, act):
    """The general convolution one image at a time: the image's im2col [C*kh*kw, OH*OW] (in
    cache) times the weights gives its NCHW output directly (no transposes), finished there."""
    n, c = x.shape[0], x.shape[1]
    o, groups = w.shape[0], g.groups
    cg, og = c // groups, o // groups
    xpad = _padded(xp, x, g.pads)
    win = _windows(xpad, g.kh, g.kw, g.oh, g.ow, g.sh, g.sw, g.dh, g.dw)  # [N, C, kh, kw, OH, OW]
    wk = [w[k * og:(k + 1) * og].reshape(og, -1) for k in range(groups)]
    out = xp.empty((n, o, g.oh * g.ow), dtype=x.dtype)
    cols = xp.empty((cg, g.kh, g.kw, g.oh, g.ow), dtype=x.dtype)
    cols2 = cols.reshape(cg * g.kh * g.kw, g.oh * g.ow)
    b = None if bias is None else bias.reshape(o, 1)
    for i in range(n):
        y = out[i]
        for k in range(groups):
            cols[...] = win[i, k * cg:(k + 1) * cg]
            xp.matmul(wk[k], cols2, out=y[k * og:(k + 1) * og])
        if b is not None:
            xp.add(y, b, out=y)
        if act is not None:
            act(y)
    return out.reshape(n, o, g.oh, g.ow)


class _Pointwise:
    """A 1x1 convolution as one matrix product per image ([O, C] @ [C, H*W], no im2col), in
    groups of images whose output fits in cache, each finished (bias, activation) in place
    before the next group is computed. When the output has more channels than the input (an
    expansion), the bias rides in the product instead: [W | b] @ [x; 1] costs a copy of the
    smaller input rather than a pass over the larger output. Where the compiled kernels serve
    (isthmus.jit) and the activation is a clamp (none, relu, relu6), the bias and the clamp are
    one compiled pass after each group's product instead (no copy of the input, one pass)."""

    def __init__(self, xp, act, activation: str = "none"):
        self.xp, self.act = xp, act
        self._clamp = _CLAMPS.get(activation)
        self._aug = None  # (w, bias, [W | b]) for immutable w and bias

    def __call__(self, x, w, bias):
        xp, act = self.xp, self.act
        n, c = x.shape[0], x.shape[1]
        o, hw = w.shape[0], x.shape[2] * x.shape[3]
        xs = x.reshape(n, c, hw)
        out = xp.empty((n, o, hw), dtype=x.dtype)
        step = max(1, _POINTWISE_CHUNK_BYTES // (o * hw * x.dtype.itemsize))
        if bias is not None and self._clamp is not None and compiled_ok(xp, x.dtype):
            return self._compiled_finish(xs, w.reshape(o, c), bias, out, step)
        if bias is not None and c < o:
            wa = self._augmented(w, bias, x.dtype)
            k = min(step, n)
            size = k * (c + 1) * hw
            # a scratch arena of the depthwise pool (still in cache from the node before), last rows ones
            mem = ARENAS.take(xp, size * x.dtype.itemsize)
            try:
                xa = mem[:size * x.dtype.itemsize].view(x.dtype).reshape(k, c + 1, hw)
                xa[:, c] = 1
                for i in range(0, n, step):
                    m = min(step, n - i)
                    xa[:m, :c] = xs[i:i + m]
                    y = out[i:i + m]
                    xp.matmul(wa, xa[:m], out=y)
                    if act is not None:
                        act(y)
            finally:
                ARENAS.give(xp, mem)
            return out
        w2 = w.reshape(o, c)
        b = None if bias is None else bias.reshape(1, o, 1)
        for i in range(0, n, step):
            y = out[i:i + step]
            xp.matmul(w2, xs[i:i + step], out=y)
            if b is not None:
                xp.add(y, b, out=y)
            if act is not None:
                act(y)
        return out

    def _compiled_finish(self, xs, w2, bias, out, step):
        from ...jit.bias_clamp import bias_clamp_rows
        n, o = xs.shape[0], w2.shape[0]
        dt = out.dtype.type
        lo, hi = dt(self._clamp[0]), dt(self._clamp[1])
        b = bias.reshape(o)
        b = b if b.dtype == out.dtype and b.flags.c_contiguous else np.ascontiguousarray(b, dtype=out.dtype)
        w2 = w2 if w2.dtype == out.dtype else w2.astype(out.dtype)
        for i in range(0, n, step):
            y = out[i:i + step]
            self.xp.matmul(w2, xs[i:i + step], out=y)
            bias_clamp_rows(y.reshape(-1, y.shape[2]), b, lo, hi)
        return out

    def _augmented(self, w, bias, dtype):
        cached = self._aug
        if cached is not None and cached[0] is w and cached[1] is bias:
            return cached[2]
        o = w.shape[0]
        wa = self.xp.concatenate([w.reshape(o, -1), bias.reshape(o, 1)], axis=1).astype(dtype, copy=False)
        if _immutable(w) and _immutable(bias):
            self._aug = (w, bias, wa)  # holding w and bias keeps their identities unique
        return wa


def _cost_conv(node):
    x, w = node.inputs[0], node.inputs[1]
    out = node.outputs[0]
    k = w.shape[1] * w.shape[2] * w.shape[3]
    isz = x.dtype.itemsize
    return Cost(2.0 * num_elements_est(out.shape) * k,
                (num_elements_est(x.shape) * w.shape[2] * w.shape[3] + num_elements_est(w.shape)) * isz,
                num_elements_est(out.shape) * isz)


def _conv_attrs():
    return {"strides": (1, 1), "dilations": (1, 1), "pads": ((0, 0), (0, 0)), "groups": 1}


def _g_conv(node, dys):
    dy = dys[0]
    x, w = node.inputs[0], node.inputs[1]
    attrs = {k: node.attrs[k] for k in _conv_attrs()}
    dx = make("Conv2DBackpropInput", (dy, w, x), attrs).outputs[0]
    dw = make("Conv2DBackpropFilter", (x, dy, w), attrs).outputs[0]
    return [dx, dw]


register(OpDef("Conv2D", inputs=("x", "w"), attrs=_conv_attrs(), infer=_infer_conv, kernel=_kernel_conv,
               grad=_g_conv, cost=_cost_conv, doc="NCHW input, OIHW weights; pads are explicit ((t,b),(l,r))."))


# ---- gradients -------------------------------------------------------------------------------------
def _kernel_conv_input(node, ctx):
    xp = ctx.xp
    w_shape = node.inputs[1].shape
    groups = node.attrs["groups"]

    def run(dy, w, x):
        n, c, h, wd = x.shape
        g = _geometry(node, x.shape, w.shape)
        (t, b), (l, r) = g.pads
        o = w.shape[0]
        hs = g.sh * (g.oh - 1) + 1
        ws = g.sw * (g.ow - 1) + 1
        if _depthwise(node, w.shape, c) and compiled_ok(xp, dy.dtype):
            return compiled_input_grad(dy, w, g, x.shape)
        t2 = None if _depthwise(node, w.shape, c) else _transposed_geometry(g, h, wd)
        if t2 is not None and _row_taps(t2, w.shape[0]):
            wf = xp.ascontiguousarray(w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
            return xp.ascontiguousarray(_conv_rows(xp, dy, wf, t2).transpose(3, 0, 1, 2))
        dxp = xp.zeros((n, c, h + t + b, wd + l + r), dtype=dy.dtype)
        if _depthwise(node, w.shape, c):
            for i in range(g.kh):
                for j in range(g.kw):
                    dxp[:, :, i * g.dh:i * g.dh + hs:g.sh, j * g.dw:j * g.dw + ws:g.sw] += \
                        dy * w[:, 0, i, j].reshape(1, c, 1, 1)
        else:
            # [C, Hp, Wp, N] accumulation: with W's rows ordered (tap, channel) each tap's block
            # of the column gradient is a contiguous [C, OH, OW, N] array, added in long runs
            cg, og = c // groups, o // groups
            dy_t = xp.ascontiguousarray(dy.transpose(1, 2, 3, 0)).reshape(o, g.oh * g.ow * n)
            acc = xp.zeros((c,) + dxp.shape[2:] + (n,), dtype=dy.dtype)
            for k in range(groups):
                wk = w[k * og:(k + 1) * og].transpose(0, 2, 3, 1).reshape(og, -1)
                dcols = (wk.T @ dy_t[k * og:(k + 1) * og]).reshape(g.kh, g.kw, cg, g.oh, g.ow, n)
                dst = acc[k * cg:(k + 1) * cg]
                for i in range(g.kh):
                    for j in range(g.kw):
                        dst[:, i * g.dh:i * g.dh + hs:g.sh, j * g.dw:j * g.dw + ws:g.sw, :] += dcols[i, j]
            return xp.ascontiguousarray(acc[:, t:t + h, l:l + wd, :].transpose(3, 0, 1, 2))
        return dxp[:, :, t:t + h, l:l + wd]
    del w_shape
    return run


def _chwn_wpadded(xp, x, wpads):
    """x [N, C, H, W] as [C, H, Wp, N], zero-padded along W only (see _row_spans for H)."""
    l, r = wpads
    n, c, h, w = x.shape
    if not (l or r):
        return xp.ascontiguousarray(x.transpose(1, 2, 3, 0))
    out = xp.empty((c, h, w + l + r, n), dtype=x.dtype)
    out[:, :, :l, :] = 0
    out[:, :, l + w:, :] = 0
    out[:, :, l:l + w, :] = x.transpose(1, 2, 3, 0)
    return out


def _row_spans(g, h):
    """Per kernel row i of a stride-1 (along H) convolution over an input of height h: the output
    rows [lo, hi) whose input row lo + i*dh - top lies inside the input, and that first input row.
    Rows outside read only zero padding, so the GEMMs skip them: the H padding is never built
    (for 5x5 SAME on 14 rows: 9% fewer multiply-adds and 22% fewer im2col copies)."""
    t = g.pads[0][0]
    spans = []
    for i in range(g.kh):
        off = i * g.dh - t
        lo, hi = max(0, -off), min(g.oh, h - off)
        spans.append((lo, hi, lo + off))
    return spans


# Below this many output channels one GEMM over all kernel rows stacked (M = kh*O) beats one
# GEMM per kernel row (M = O): 32 channels, 5x5 on 14x14x64: 16.8 vs 21.2 ms on one core.
_STACK_MAX_M = 128


def _conv_rows(xp, x, w, g):
    """conv2d for _row_taps geometries without H padding: one GEMM per kernel row over the
    output rows it reaches, accumulated (or one stacked GEMM and shifted adds). -> [O, OH, OW, N]"""
    n, c, h = x.shape[0], x.shape[1], x.shape[2]
    o = w.shape[0]
    cols = _cols_kw(xp, _chwn_wpadded(xp, x, g.pads[1]), g)  # [kw*C, H*OW*N]
    run = g.ow * n
    wt = xp.ascontiguousarray(w.transpose(2, 0, 3, 1)).reshape(g.kh, o, g.kw * c)
    spans = _row_spans(g, h)
    full = [i for i, (lo, hi, _) in enumerate(spans) if (lo, hi) == (0, g.oh)]
    if full and o < _STACK_MAX_M and g.kh * h <= 1.25 * sum(max(hi - lo, 0) for lo, hi, _ in spans):
        # one GEMM for all kernel rows, each over every input row, then shifted adds: a few
        # wasted products, but M = kh*O keeps BLAS far busier than kh GEMMs with a small M
        big = xp.matmul(wt.reshape(g.kh * o, g.kw * c), cols).reshape(g.kh, o, h * run)
        src = spans[full[0]][2]
        out = big[full[0], :, src * run:(src + g.oh) * run].copy()
        for i, (lo, hi, src) in enumerate(spans):
            if hi > lo and i != full[0]:
                out[:, lo * run:hi * run] += big[i, :, src * run:(src + hi - lo) * run]
        return out.reshape(o, g.oh, g.ow, n)
    out = xp.empty((o, g.oh * run), dtype=x.dtype)
    if full:
        src = spans[full[0]][2]
        xp.matmul(wt[full[0]], cols[:, src * run:(src + g.oh) * run], out=out)
    else:
        out[...] = 0
    tmp = xp.empty(o * g.oh * run, dtype=x.dtype)
    for i, (lo, hi, src) in enumerate(spans):
        if hi <= lo or (full and i == full[0]):
            continue
        k = (hi - lo) * run
        part = tmp[:o * k].reshape(o, k)
        xp.matmul(wt[i], cols[:, src * run:src * run + k], out=part)
        out[:, lo * run:hi * run] += part
    return out.reshape(o, g.oh, g.ow, n)


def _kernel_conv_filter(node, ctx):
    xp = ctx.xp
    groups = node.attrs["groups"]

    def run(x, dy, w):
        n, c = x.shape[0], x.shape[1]
        g = _geometry(node, x.shape, w.shape)
        o = w.shape[0]
        if _depthwise(node, w.shape, c) and compiled_ok(xp, x.dtype):
            return compiled_filter_grad(x, dy, g, w.shape)
        if _depthwise(node, w.shape, c):
            xpad = _padded(xp, x, g.pads)
            win = _windows(xpad, g.kh, g.kw, g.oh, g.ow, g.sh, g.sw, g.dh, g.dw)
            dw_ = xp.empty(w.shape, dtype=x.dtype)
            for i in range(g.kh):
                for j in range(g.kw):
                    dw_[:, 0, i, j] = (win[:, :, i, j] * dy).sum(axis=(0, 2, 3))
            return dw_
        if groups == 1 and not _row_taps(g, c) and _cnhw_pays(g, n, c, o, x.shape[3]):
            return _filter_grad_cnhw(xp, x, dy, w, g)
        cg, og = c // groups, o // groups
        dy_t = xp.ascontiguousarray(dy.transpose(1, 2, 3, 0)).reshape(o, g.oh * g.ow * n)
        if _row_taps(g, c):
            cols = _cols_kw(xp, _chwn_wpadded(xp, x, g.pads[1]), g)
            run_ = g.ow * n
            rows = xp.empty((g.kh, o, g.kw * c), dtype=x.dtype)
            for i, (lo, hi, src) in enumerate(_row_spans(g, x.shape[2])):
                if hi <= lo:
                    rows[i] = 0
                else:
                    xp.matmul(dy_t[:, lo * run_:hi * run_], cols[:, src * run_:(src + hi - lo) * run_].T, out=rows[i])
            return xp.ascontiguousarray(rows.reshape(g.kh, o, g.kw, c).transpose(1, 3, 0, 2))
        xt = _chwn_padded(xp, x, g.pads)
        out = xp.empty(w.shape, dtype=x.dtype)
        for k in range(groups):
            cols = _cols_chwn(xp, xt, g, k * cg, (k + 1) * cg)
            out[k * og:(k + 1) * og] = (dy_t[k * og:(k + 1) * og] @ cols.T).reshape(og, cg, g.kh, g.kw)
        return out
    return run


def _cnhw_pays(g, n, c, o, wd) -> bool:
    """Whether the filter gradient's columns in (n, oh, ow) order beat the [C, H, W, N] layout.
    The latter moves dy and x with batch innermost (a gather, ~2.4 ns per element here) and then
    copies im2col in long runs; (n, oh, ow) order moves dy in runs of OH*OW (~0.4 ns) but copies
    im2col in runs of OW, which costs more the shorter OW is (a rough model, fit on 2 cores)."""
    p = g.oh * g.ow * n
    cols = c * g.kh * g.kw * p
    chwn = 2.4 * (o * p + c * (g.oh * g.sh) * wd * n) + 0.3 * cols
    cnhw = 0.4 * (o * p + c * (g.oh * g.sh) * wd * n) + (0.3 + 8.0 / g.ow) * cols
    return cnhw < chwn


def _filter_grad_cnhw(xp, x, dy, w, g):
    """Conv2DBackpropFilter (groups 1) as one GEMM over columns ordered (n, oh, ow): dy needs
    only a [O, N, OH*OW] copy, and the input is padded in a [C, N, Hp, Wp] layout."""
    n, c, h, wd = x.shape
    o = w.shape[0]
    (t, b), (l, r) = g.pads
    xc = xp.zeros((c, n, h + t + b, wd + l + r), dtype=x.dtype)
    xc[:, :, t:t + h, l:l + wd] = x.transpose(1, 0, 2, 3)
    s0, s1, s2, s3 = xc.strides
    win = as_strided(xc, (c, g.kh, g.kw, n, g.oh, g.ow),
                     (s0, g.dh * s2, g.dw * s3, s1, g.sh * s2, g.sw * s3), writeable=False)
    cols = xp.ascontiguousarray(win).reshape(c * g.kh * g.kw, n * g.oh * g.ow)
    dyc = xp.ascontiguousarray(dy.transpose(1, 0, 2, 3)).reshape(o, n * g.oh * g.ow)
    return (cols @ dyc.T).T.reshape(w.shape)


register(OpDef("Conv2DBackpropInput", inputs=("dy", "w", "x"), attrs=_conv_attrs(),
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[2].shape)], kernel=_kernel_conv_input,
               cost=lambda node: _cost_conv(_Proxy(node)), doc="Gradient of Conv2D w.r.t. its input."))
register(OpDef("Conv2DBackpropFilter", inputs=("x", "dy", "w"), attrs=_conv_attrs(),
               infer=lambda node: [(node.inputs[2].dtype, node.inputs[2].shape)], kernel=_kernel_conv_filter,
               cost=lambda node: _cost_conv(_Proxy(node)), doc="Gradient of Conv2D w.r.t. its weights."))


class _Proxy:
    """Cost of a conv gradient = cost of the forward conv it differentiates."""

    def __init__(self, node):
        if node.op == "Conv2DBackpropInput":
            dy, w, x = node.inputs
        else:
            x, dy, w = node.inputs
        self.inputs, self.outputs = (x, w), (dy,)


def conv2d(x, w, strides=1, padding="SAME", dilations=1, groups: int = 1, name: Optional[str] = None) -> Tensor:
    """NCHW x OIHW convolution; padding SAME (TensorFlow's), VALID, ((t,b),(l,r)) or 4 ints."""
    x, w = convert(x), convert(w)
    s, d = _pair(strides, "strides"), _pair(dilations, "dilations")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ShapeError(f"conv2d needs NCHW input and OIHW weights, got {fmt(x.shape)} and {fmt(w.shape)}")
    pads = _pads(padding, x.shape[2:], w.shape[2:], s, d)
    return make("Conv2D", (x, w), {"strides": s, "dilations": d, "pads": pads, "groups": int(groups)}, name=name).outputs[0]


def depthwise_conv2d(x, w, strides=1, padding="SAME", dilations=1, name: Optional[str] = None) -> Tensor:
    """Per-channel convolution; w is [channels, 1, kh, kw]."""
    x = convert(x)
    return conv2d(x, w, strides, padding, dilations, groups=x.shape[1], name=name)


# ---- FusedConv2D (made by the passes) ---------------------------------------------------------
def _kernel_fused_conv(node, ctx):
    return _kernel_conv(node, ctx, node.attrs["activation"])


register(OpDef("FusedConv2D", inputs=("x", "w", "bias"), attrs={**_conv_attrs(), "activation": "none"},
               infer=_infer_conv, kernel=_kernel_fused_conv, cost=_cost_conv,
               doc="activation(conv2d(x, w) + bias): made by the fusion pass."))


# ---- pooling ------------------------------------------------------------------------------------
def _pool_geometry(node, shape):
    g = _Geometry()
    g.kh, g.kw = node.attrs["ksize"]
    g.sh, g.sw = node.attrs["strides"]
    g.dh, g.dw = node.attrs["dilations"]
    g.pads = node.attrs["pads"]
    g.oh = _out_size(shape[2], g.kh, g.sh, g.dh, g.pads[0])
    g.ow = _out_size(shape[3], g.kw, g.sw, g.dw, g.pads[1])
    g.groups = 1
    return g


def _infer_pool(node):
    x = node.inputs[0]
    kinds = "fiu" if node.op == "MaxPool" else "f"  # a maximum is exact on integers, a mean is not
    if len(x.shape) != 4 or x.dtype.kind not in kinds:
        raise ShapeError(f"{node.op} needs a {'numeric' if kinds == 'fiu' else 'float'} NCHW input, "
                         f"got {x.dtype.name}{fmt(x.shape)}")
    g = _pool_geometry(node, x.shape)
    return [(x.dtype, (x.shape[0], x.shape[1], g.oh, g.ow))]


def _taps(g):
    hs, ws = g.sh * (g.oh - 1) + 1, g.sw * (g.ow - 1) + 1
    for i in range(g.kh):
        for j in range(g.kw):
            yield (slice(None), slice(None), slice(i * g.dh, i * g.dh + hs, g.sh),
                   slice(j * g.dw, j * g.dw + ws, g.sw))


def _lowest(dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _pairs_tiled(g, shape) -> bool:
    """2x2 windows at stride 2 that tile the whole (unpadded) input: the common CNN pooling."""
    return ((g.kh, g.kw, g.sh, g.sw, g.dh, g.dw) == (2, 2, 2, 2, 1, 1) and g.pads == ((0, 0), (0, 0))
            and shape[2] == 2 * g.oh and shape[3] == 2 * g.ow)


def _max_pool_pairs(xp, x, g):
    """Maximum of row pairs (contiguous runs of W), then of column pairs: two ops, not four."""
    n, c = x.shape[0], x.shape[1]
    x5 = x.reshape(n, c, g.oh, 2, 2 * g.ow)
    rows = xp.maximum(x5[:, :, :, 0], x5[:, :, :, 1])
    return xp.maximum(rows[..., 0::2], rows[..., 1::2])


def _kernel_max_pool(node, ctx):
    """The running maximum over kernel taps: kh*kw elementwise ops on output-sized strided
    views, several times faster than a numpy reduction over window axes."""
    xp = ctx.xp

    def run(x):
        g = _pool_geometry(node, x.shape)
        if _pairs_tiled(g, x.shape) and x.flags.c_contiguous:
            return _max_pool_pairs(xp, x, g)
        xpad = _padded(xp, x, g.pads, _lowest(x.dtype))
        taps = _taps(g)
        out = xpad[next(taps)].copy()
        for t in taps:
            xp.maximum(out, xpad[t], out=out)
        return out
    return run


_LITTLE = sys.byteorder == "little"
_TWICE = np.uint64(0x100000001)  # v * _TWICE == (v << 32) | v for any 32-bit v: a value twice in a row


def _upsample_2x2(xp, a, m, ow):
    """A float32 [.., OH, OW] as [m, 2, 2*OW] with each value in all four places of its 2x2
    window. Through uint64 views both steps are long contiguous runs; numpy's repeat or
    broadcasting copies over a length-2 axis are several times slower."""
    pairs = a.reshape(m, ow).view(xp.uint32).astype(xp.uint64)
    xp.multiply(pairs, _TWICE, out=pairs)
    return xp.repeat(pairs, 2, axis=0).view(a.dtype).reshape(m, 2, 2 * ow)


def _max_pool_grad_pairs(xp, x, y, dy, g):
    """MaxPoolGrad of float32 _pairs_tiled windows as contiguous ops at input size: the mask
    x == y (y upsampled) times dy (upsampled). Where a window holds its maximum more than once,
    only the first in row-major order keeps its hit, as in the general kernel: with the mask
    viewed as uint16 each column pair is one value, so "clear the second of a pair when the first
    is set" is three ops over the whole mask, and "clear row 1 where row 0 has a hit" one more."""
    n, c, h, w = x.shape
    m = n * c * g.oh
    hit = xp.equal(x.reshape(m, 2, w), _upsample_2x2(xp, y, m, g.ow))
    if int(xp.count_nonzero(hit)) != y.size:  # ties (zeros after a relu are common)
        pairs = hit.view(xp.uint16)  # [m, 2, OW]: the bytes (left, right) of each column pair
        first = xp.left_shift(pairs, 8) if _LITTLE else xp.right_shift(pairs, 8)
        xp.bitwise_and(pairs, xp.invert(first, out=first), out=pairs)
        xp.multiply(pairs[:, 1], pairs[:, 0] == 0, out=pairs[:, 1])
    dx = _upsample_2x2(xp, dy, m, g.ow)
    xp.multiply(dx, hit, out=dx)
    return dx.reshape(x.shape)


def _kernel_max_pool_grad(node, ctx):
    xp = ctx.xp

    through_relu = node.attrs["through_relu"]

    def run(x, y, dy):
        g = _pool_geometry(node, x.shape)
        if through_relu:  # see math.max_pool_grad_through_relu: the relu's mask at the pooled size
            dy = xp.multiply(dy, y > 0)
        if _pairs_tiled(g, x.shape) and x.dtype == np.float32:
            return _max_pool_grad_pairs(xp, xp.ascontiguousarray(x), xp.ascontiguousarray(y),
                                        xp.ascontiguousarray(dy), g)
        n, c, h, w = x.shape
        (t, b), (l, r) = g.pads
        xpad = _padded(xp, x, g.pads, -np.inf)
        # windows that neither overlap nor leave gaps write each input element exactly once
        tiled = (g.sh, g.sw, g.dh, g.dw) == (g.kh, g.kw, 1, 1) and xpad.shape[2:] == (g.oh * g.kh, g.ow * g.kw)
        dxp = xp.empty(xpad.shape, dtype=x.dtype) if tiled else xp.zeros(xpad.shape, dtype=x.dtype)
        free = xp.ones(y.shape, dtype=bool)  # each window sends its gradient to one maximum
        hit = xp.empty(y.shape, dtype=bool)
        part = None if tiled else xp.empty(y.shape, dtype=x.dtype)
        for tap in _taps(g):
            xp.equal(xpad[tap], y, out=hit)
            xp.logical_and(hit, free, out=hit)
            xp.logical_xor(free, hit, out=free)  # hit is a subset of free: this clears the hits
            if tiled:
                xp.multiply(hit, dy, out=dxp[tap])
            else:
                xp.multiply(hit, dy, out=part)
                dxp[tap] += part
        return dxp[:, :, t:t + h, l:l + w]
    return run


def _avg_counts(xp, g, shape, dtype):
    ones = _padded(xp, xp.ones((1, 1) + tuple(shape[2:]), dtype=dtype), g.pads)
    out = xp.zeros((1, 1, g.oh, g.ow), dtype=dtype)
    for t in _taps(g):
        out += ones[t]
    return out


def _kernel_avg_pool(node, ctx):
    xp = ctx.xp

    def run(x):
        g = _pool_geometry(node, x.shape)
        xpad = _padded(xp, x, g.pads)
        taps = _taps(g)
        out = xpad[next(taps)].copy()
        for t in taps:
            out += xpad[t]
        if g.pads == ((0, 0), (0, 0)):
            out *= x.dtype.type(1.0 / (g.kh * g.kw))
            return out
        return out / _avg_counts(xp, g, x.shape, x.dtype)
    return run


def _kernel_avg_pool_grad(node, ctx):
    xp = ctx.xp

    def run(x, dy):
        g = _pool_geometry(node, x.shape)
        n, c, h, w = x.shape
        (t, b), (l, r) = g.pads
        d = dy / _avg_counts(xp, g, x.shape, x.dtype)
        dxp = xp.zeros((n, c, h + t + b, w + l + r), dtype=x.dtype)
        for tap in _taps(g):
            dxp[tap] += d
        return dxp[:, :, t:t + h, l:l + w]
    return run


def _pool_attrs():
    return {"ksize": (2, 2), "strides": (2, 2), "pads": ((0, 0), (0, 0)), "dilations": (1, 1)}


def _pool_cost(node):
    x = node.inputs[0]
    n = num_elements_est(node.outputs[0].shape) * node.attrs["ksize"][0] * node.attrs["ksize"][1]
    return Cost(n, num_elements_est(x.shape) * x.dtype.itemsize,
                num_elements_est(node.outputs[0].shape) * x.dtype.itemsize)


register(OpDef("MaxPool", inputs=("x",), attrs=_pool_attrs(), infer=_infer_pool, kernel=_kernel_max_pool,
               grad=lambda node, dys: [make("MaxPoolGrad", (node.inputs[0], node.outputs[0], dys[0]),
                                            dict(node.attrs)).outputs[0]], cost=_pool_cost))
register(OpDef("MaxPoolGrad", inputs=("x", "y", "dy"), attrs={**_pool_attrs(), "through_relu": False},
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)], kernel=_kernel_max_pool_grad,
               cost=_pool_cost, doc="through_relu: x is relu(z) and the result is also the gradient "
                                    "with respect to z (see max_pool_grad_through_relu in math.py)."))


register(OpDef("AvgPool", inputs=("x",), attrs=_pool_attrs(), infer=_infer_pool, kernel=_kernel_avg_pool,
               grad=lambda node, dys: [make("AvgPoolGrad", (node.inputs[0], dys[0]), dict(node.attrs)).outputs[0]],
               cost=_pool_cost, doc="SAME padding divides by the number of real (unpadded) elements."))
register(OpDef("AvgPoolGrad", inputs=("x", "dy"), attrs=_pool_attrs(),
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)], kernel=_kernel_avg_pool_grad,
               cost=_pool_cost))


def _pool(op, x, ksize, strides, padding, dilations, name):
    x = convert(x)
    if len(x.shape) != 4:
        raise ShapeError(f"{op} needs an NCHW input, got {fmt(x.shape)}")
    k = _pair(ksize, "ksize")
    s = _pair(strides if strides is not None else ksize, "strides")
    d = _pair(dilations, "dilations")
    if min(k + s + d) < 1:
        raise ShapeError(f"{op}: ksize {k}, strides {s} and dilations {d} must be >= 1")
    pads = _pads(padding, x.shape[2:], k, s, d)
    return make(op, (x,), {"ksize": k, "strides": s, "pads": pads, "dilations": d}, name=name).outputs[0]


def max_pool(x, ksize=2, strides=None, padding="VALID", dilations=1, name: Optional[str] = None) -> Tensor:
    return _pool("MaxPool", x, ksize, strides, padding, dilations, name)


def avg_pool(x, ksize=2, strides=None, padding="VALID", dilations=1, name: Optional[str] = None) -> Tensor:
    """Divides by the number of real (unpadded) elements in each window."""
    return _pool("AvgPool", x, ksize, strides, padding, dilations, name)


def _infer_gap(node):
    x = node.inputs[0]
    if len(x.shape) != 4 or x.dtype.kind != "f":
        raise ShapeError(f"global_avg_pool needs a float NCHW input, got {x.dtype.name}{fmt(x.shape)}")
    keep = node.attrs["keepdims"]
    return [(x.dtype, x.shape[:2] + ((1, 1) if keep else ()))]


def _kernel_gap_grad(node, ctx):
    xp = ctx.xp

    def run(x, dy):
        h, w = x.shape[2], x.shape[3]
        d = dy.reshape(dy.shape[0], dy.shape[1], 1, 1) / x.dtype.type(h * w)
        return xp.broadcast_to(d, x.shape).copy()
    return run


register(OpDef("GlobalAvgPool", inputs=("x",), attrs={"keepdims": False}, infer=_infer_gap,
               kernel=lambda node, ctx: (lambda x, k=node.attrs["keepdims"]: x.mean(axis=(2, 3), keepdims=k)),
               grad=lambda node, dys: [make("GlobalAvgPoolGrad", (node.inputs[0], dys[0])).outputs[0]],
               cost=lambda node: Cost(num_elements_est(node.inputs[0].shape),
                                      num_elements_est(node.inputs[0].shape) * node.inputs[0].dtype.itemsize, 0)))
register(OpDef("GlobalAvgPoolGrad", inputs=("x", "dy"),
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)], kernel=_kernel_gap_grad,
               cost=lambda node: Cost(num_elements_est(node.inputs[0].shape))))


def global_avg_pool(x, keepdims: bool = False, name: Optional[str] = None) -> Tensor:
    return make("GlobalAvgPool", (convert(x),), {"keepdims": bool(keepdims)}, name=name).outputs[0]
