"""Convolution on NCHW tensors (weights OIHW), at BLAS speed (pooling: pool.py; the window
arithmetic both share: conv_geometry.py).

conv2d with stride 1 along H and enough channels, at batch > 1, takes the row taps (conv_rows.py:
kw copies of the input, one GEMM per kernel row accumulated into the output by BLAS); otherwise it
builds the im2col matrix one image at a time and multiplies it (always at batch 1: one deeper GEMM
beats kh shallower ones there). 1x1 convolutions are a GEMM on the input as it lies
(conv_pointwise.py, with the bias + activation finish every GEMM path shares). At inference
(constant float32 weights, a clamp activation) few output pixels run as a GEMM with the pixels as
rows (conv_pixels.py), and batch 1 and constant-weight batches image by image on the packed GEMM,
with im2col or without it (conv_one_image.py); a node keeps the route it chose for constant weights
per input shape and takes it again without the checks (conv_bound.py). The filter
gradient is the same GEMMs against the same columns; the input gradient of a stride-1 convolution
is itself a convolution (of dy with the flipped, transposed weights), else one GEMM and one
strided add per kernel tap. Depthwise convolutions skip the
GEMM: compiled loops (isthmus.jit, forward and both gradients) where numba serves, else
depthwise.py's chunked forward and a multiply-add per kernel tap for the gradients.
FusedConv2DAdd (conv_residual.py) runs these paths with a residual addend added where each
finishes its output (depthwise and jit.conv_images: one add + clamp pass after, _AddAfter).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import fmt, num_elements_est
from .base import convert, make
from .conv_geometry import WindowGeometry, _windows, padded_copy, resolve_pads, window_out_size, window_pair
from .conv_bound import BoundRoutes
from .conv_one_image import OneImage
from .conv_pixels import PixelRows
from .conv_pointwise import Finish, Pointwise, addend_finish
from .conv_rows import conv_rows, filter_grad_rows, stacked_weights
from .depthwise import DepthwiseConv, _immutable, compiled_filter_grad, compiled_input_grad, compiled_ok
from .fused import activation_inplace
from .intra_op import contiguous, copy_into, ksplit_parts, matmul_ksplit, rows_apply, serial_blas, sum_of_parts
from .intra_op import matmul as split_matmul
from .par_gate import split_rows

__all__ = ["conv2d", "depthwise_conv2d"]


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


# Row taps pay when each kernel row's GEMM has a deep enough contraction (kw*C) to run BLAS
# at full speed; below this the full im2col's one deep GEMM wins (measured on 2 cores).
_ROW_TAPS_MIN_K = 64


def _row_taps(g, c) -> bool:
    return g.groups == 1 and g.sh == 1 and g.kh > 1 and c * g.kw >= _ROW_TAPS_MIN_K


def _transposed_geometry(g, h, w) -> Optional["WindowGeometry"]:
    """The geometry under which dx = conv2d(dy, flipped transposed weights), for stride 1
    (None when the padding exceeds the kernel's extent and the identity does not hold)."""
    if (g.sh, g.sw) != (1, 1) or g.groups != 1:
        return None
    eh, ew = g.dh * (g.kh - 1), g.dw * (g.kw - 1)
    (t, b), (l, r) = g.pads
    pads = ((eh - t, eh - b), (ew - l, ew - r))
    if min(pads[0] + pads[1]) < 0:
        return None
    t2 = WindowGeometry()
    t2.kh, t2.kw, t2.sh, t2.sw, t2.dh, t2.dw = g.kh, g.kw, 1, 1, g.dh, g.dw
    t2.pads, t2.oh, t2.ow, t2.groups = pads, h, w, 1
    return t2


def _geometry(node, x_shape, w_shape) -> WindowGeometry:
    g = WindowGeometry()
    g.kh, g.kw = w_shape[2], w_shape[3]
    g.sh, g.sw = node.attrs["strides"]
    g.dh, g.dw = node.attrs["dilations"]
    g.pads = node.attrs["pads"]
    g.oh = window_out_size(x_shape[2], g.kh, g.sh, g.dh, g.pads[0])
    g.ow = window_out_size(x_shape[3], g.kw, g.sw, g.dw, g.pads[1])
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


def _kernel_conv(node, ctx, activation: str = "none", residual: bool = False):
    """conv(x, w[, bias[, addend]]) -> activation(conv2d(x, w) + bias (+ addend)), the bias, addend
    and activation applied while each chunk of the output is still in cache where the path allows
    (residual: FusedConv2DAdd's kernel, whose addend has the output's shape)."""
    xp = ctx.xp
    groups = node.attrs["groups"]
    act = None if activation == "none" else activation_inplace(xp, activation)
    depthwise = DepthwiseConv(xp, activation)
    pointwise = Pointwise(xp, act, activation)
    finish = Finish(xp, act, activation)
    pixels = PixelRows(activation)
    one_image = OneImage(activation, finish)
    row_weights = _RowWeights(xp)
    add_after = _AddAfter(node, ctx, activation) if residual else None
    bound = BoundRoutes()
    cache = {}

    def geom(x_shape, w_shape):
        g = cache.get((x_shape, w_shape))
        if g is None:
            g = cache[(x_shape, w_shape)] = _geometry(node, x_shape, w_shape)
        return g

    def conv(x, w, bias=None, addend=None):
        run = bound.get(x, w, bias, addend)
        if run is not None:  # the route chosen below for these constant weights at this shape
            return run(x, addend)
        n, c = x.shape[0], x.shape[1]
        g = geom(x.shape, w.shape)
        o = w.shape[0]
        if addend is not None and (addend.shape != (n, o, g.oh, g.ow) or addend.dtype != x.dtype):
            return add_after(x, w, bias, addend)
        if _depthwise(node, w.shape, c):
            return depthwise(x, w, g, bias) if addend is None else add_after(x, w, bias, addend)
        out_shape = (n, o, g.oh, g.ow)
        if pixels.pays(xp, x, w, bias, g):  # few output pixels: constant weights streamed once
            bound.learn(x, w, bias, addend, out_shape,
                        pixels.runner(x, w, g, bias) or (lambda x, a: pixels(x, w, g, bias, a)))
            return pixels(x, w, g, bias, addend)
        if groups == 1 and g.kh == g.kw == 1 and (g.sh, g.sw) == (1, 1) and g.pads == ((0, 0), (0, 0)):
            if n == 1 and (addend is None or addend.dtype == np.float32):
                bound.learn(x, w, bias, addend, out_shape, pointwise.packed_runner(x, w, bias))
            return pointwise(x, w, bias, addend).reshape(n, o, g.oh, g.ow)
        if n == 1 and groups == 1 and compiled_ok(xp, x.dtype) and x.dtype == w.dtype == np.float32:
            bound.learn(x, w, bias, addend, out_shape, one_image.runner(x, w, g, bias))
            return one_image(x, w, g, bias, addend)
        if groups == 1 and compiled_ok(xp, x.dtype) and x.dtype == w.dtype == np.float32 \
                and one_image.batch_pays(x, w, bias, g):  # constant weights: compiled, image by image
            bound.learn(x, w, bias, addend, out_shape, lambda x, a: one_image.batch(x, w, g, bias, a))
            return one_image.batch(x, w, g, bias, addend)
        if n == 1 or not _row_taps(g, c):  # one image: one deeper GEMM beats kh shallower ones
            if _images_compiled_pays(xp, x, w, g, bias, finish):
                if addend is not None:
                    return add_after(x, w, bias, addend)
                return _images_compiled(x, w, g, bias, finish.clamp)
            return _im2col_per_image(xp, x, w, g, bias, finish, addend)
        return conv_rows(xp, x, row_weights(w), g, _rows_finisher(xp, bias, finish, addend))
    return conv


class _AddAfter:
    """FusedConv2DAdd where a path takes no addend (depthwise, jit.conv_images) or the addend only
    broadcasts: the convolution with its bias, then act(y + addend) in one more pass (addend_finish)."""

    def __init__(self, node, ctx, activation: str):
        self.node, self.ctx, self._conv = node, ctx, None
        self._finish = addend_finish(ctx.xp, activation)

    def __call__(self, x, w, bias, addend):
        if self._conv is None:
            self._conv = _kernel_conv(self.node, self.ctx)
        return self._finish(self._conv(x, w, bias), addend)


class _RowWeights:
    """w [O, C, kh, kw] relaid as conv_rows' [kh, O, kw*C] (stacked_weights), once for weights that
    cannot change (a constant's): per call, the relayout of a 256x256 3x3 kernel cost more than its
    GEMMs at batch 1."""

    def __init__(self, xp):
        self.xp, self._cached = xp, None

    def __call__(self, w):
        cached = self._cached
        if cached is not None and cached[0] is w:
            return cached[1]
        wt = stacked_weights(self.xp, w)
        if _immutable(w):
            self._cached = (w, wt)  # holding w keeps its identity unique
        return wt


def _rows_finisher(xp, bias, finish, addend=None):
    """finish_rows for conv_rows: output rows a.. of y [N, O, OH, OW] = act(src [O, rows, OW, N] + bias
    (+ the same rows of addend, of y's shape)) (finish None: src relaid alone). One compiled pass where
    isthmus.jit serves float32 and the activation is a clamp or absent (2-3x numpy's strided copy), else
    numpy's copy, add and activation over the rows' view."""
    act = None if finish is None else finish.act
    clamp = None if finish is None else finish.clamp

    def numpy_rows(src, y, a):
        dst = y[:, :, a:a + src.shape[1], :]
        dst[...] = src.transpose(3, 0, 1, 2)
        if bias is not None:
            dst += bias.reshape(1, -1, 1, 1)
        if addend is not None:
            dst += addend[:, :, a:a + src.shape[1], :]
        if act is not None:
            act(dst)
    if ((finish is not None and clamp is None) or not compiled_ok(xp, np.dtype(np.float32))
            or (bias is not None and bias.dtype != np.float32)):
        return numpy_rows

    def compiled_rows(src, y, a):
        if y.dtype != np.float32:
            return numpy_rows(src, y, a)
        from ...jit import bias_clamp  # deferred: loads numba
        if finish is None:
            return bias_clamp.ohwn_to_nchw(src, y, a)
        b = np.zeros(y.shape[1], np.float32) if bias is None else bias.reshape(-1)
        if addend is not None:
            return bias_clamp.ohwn_to_nchw_bias_add_clamp(src, b, addend, np.float32(clamp[0]), np.float32(clamp[1]), y, a)
        bias_clamp.ohwn_to_nchw_bias_clamp(src, b, np.float32(clamp[0]), np.float32(clamp[1]), y, a)

    def par_finish(acc4, y):  # the same pass as a range kernel and its leading arguments (conv_rows' prange path)
        from ...jit import par_conv  # deferred: loads numba
        if finish is None:
            return par_conv.finish_range, (acc4, y)
        b = np.zeros(y.shape[1], np.float32) if bias is None else bias.reshape(-1)
        lo, hi = np.float32(clamp[0]), np.float32(clamp[1])
        if addend is not None:
            return par_conv.finish_bias_add_clamp_range, (acc4, b, addend, lo, hi, y)
        return par_conv.finish_bias_clamp_range, (acc4, b, lo, hi, y)
    compiled_rows.par_finish = par_finish
    return compiled_rows


def _images_compiled_pays(xp, x, w, g, bias, finish) -> bool:
    """Whether _images_compiled serves: float32, groups 1, a clamp activation, and a GEMM shape the
    packed kernel runs at least as fast as BLAS (jit.gemm_f32.packed_pays)."""
    if (g.groups != 1 or finish.clamp is None or not compiled_ok(xp, x.dtype) or x.dtype != np.float32
            or w.dtype != np.float32 or (bias is not None and bias.dtype != np.float32)):
        return False
    from ...jit.gemm_f32 import packed_pays  # deferred: loads llvmlite, numba
    return packed_pays(w.shape[0], x.shape[1] * g.kh * g.kw, g.oh * g.ow)


def _images_compiled(x, w, g, bias, clamp):
    """A batch's convolution as compiled calls over blocks of images split by FLOPs (par_gate.split_rows)
    (jit.conv_images: im2col and the packed GEMM with bias and clamp, nogil), not a Python loop of
    per-image copies, BLAS products and bias passes. Chunks change no arithmetic: each image's
    output is the same whichever thread computes it."""
    from ...jit.conv_images import conv_images_bias_clamp  # deferred: loads llvmlite, numba
    from ...jit.gemm_f32 import pack_weights  # deferred: loads llvmlite, numba
    n, c = x.shape[0], x.shape[1]
    o = w.shape[0]
    xpad = padded_copy(np, x, g.pads)
    hp, wp = xpad.shape[2], xpad.shape[3]
    packed = pack_weights(w.reshape(o, -1))
    b = np.zeros(o, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32).reshape(o)
    geo = np.array([g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, g.oh, g.ow], np.int64)
    out = np.empty((n, o, g.oh * g.ow), np.float32)
    x3 = xpad.reshape(n, c, hp * wp)
    lo, hi = np.float32(clamp[0]), np.float32(clamp[1])
    split_rows(conv_images_bias_clamp, (x3, wp, packed, b, lo, hi, geo, out), n, 2 * out.size * c * g.kh * g.kw,
               flops=True)
    return out.reshape(n, o, g.oh, g.ow)


def _im2col_per_image(xp, x, w, g, bias, finish, addend=None):
    """The general convolution one image at a time: the image's im2col [C*kh*kw, OH*OW] (in
    cache) times the weights gives its NCHW output directly (no transposes), finished there."""
    n, c = x.shape[0], x.shape[1]
    o, groups = w.shape[0], g.groups
    cg, og = c // groups, o // groups
    xpad = padded_copy(xp, x, g.pads)
    win = _windows(xpad, g.kh, g.kw, g.oh, g.ow, g.sh, g.sw, g.dh, g.dw)  # [N, C, kh, kw, OH, OW]
    wk = [w[k * og:(k + 1) * og].reshape(og, -1) for k in range(groups)]
    out = xp.empty((n, o, g.oh * g.ow), dtype=x.dtype)

    def images(lo, hi):  # a chunk of images on one thread, with its own columns buffer
        cols = xp.empty((cg, g.kh, g.kw, g.oh, g.ow), dtype=x.dtype)
        cols2 = cols.reshape(cg * g.kh * g.kw, g.oh * g.ow)
        for i in range(lo, hi):
            y = out[i]
            for k in range(groups):
                cols[...] = win[i, k * cg:(k + 1) * cg]
                xp.matmul(wk[k], cols2, out=y[k * og:(k + 1) * og])
            finish(y, bias, None if addend is None else addend[i].reshape(y.shape))
    rows_apply(xp, images, n, out.nbytes + n * c * g.kh * g.kw * g.oh * g.ow * x.dtype.itemsize, blas_inside=True,
               flops=2 * out.size * cg * g.kh * g.kw)
    return out.reshape(n, o, g.oh, g.ow)


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
            wf = stacked_weights(xp, w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
            return conv_rows(xp, dy, wf, t2, _rows_finisher(xp, None, None))
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
            xpad = padded_copy(xp, x, g.pads)
            win = _windows(xpad, g.kh, g.kw, g.oh, g.ow, g.sh, g.sw, g.dh, g.dw)
            dw_ = xp.empty(w.shape, dtype=x.dtype)
            for i in range(g.kh):
                for j in range(g.kw):
                    dw_[:, 0, i, j] = (win[:, :, i, j] * dy).sum(axis=(0, 2, 3))
            return dw_
        if groups == 1 and not _row_taps(g, c) and _cnhw_pays(g, n, c, o, x.shape[3]):
            return _filter_grad_cnhw(xp, x, dy, w, g)
        if _row_taps(g, c):
            return filter_grad_rows(xp, x, dy, g, w.shape)
        cg, og = c // groups, o // groups
        dy_t = contiguous(xp, dy.transpose(1, 2, 3, 0)).reshape(o, g.oh * g.ow * n)
        xt = _chwn_padded(xp, x, g.pads)
        out = xp.empty(w.shape, dtype=x.dtype)
        for k in range(groups):
            cols = _cols_chwn(xp, xt, g, k * cg, (k + 1) * cg)
            out[k * og:(k + 1) * og] = matmul_ksplit(xp, dy_t[k * og:(k + 1) * og], cols.T).reshape(og, cg, g.kh, g.kw)
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
    copy_into(xp, xc[:, :, t:t + h, l:l + wd], x.transpose(1, 0, 2, 3), axis=1)
    s0, s1, s2, s3 = xc.strides
    win = as_strided(xc, (c, g.kh, g.kw, n, g.oh, g.ow),
                     (s0, g.dh * s2, g.dw * s3, s1, g.sh * s2, g.sw * s3), writeable=False)
    k, p = c * g.kh * g.kw, g.oh * g.ow
    parts = min(n, ksplit_parts(k, n * p, o)) if xp is np else 1
    if parts > 1:  # each part gathers its own images' columns and dy on its thread, in cache
        bounds = [n * i // parts for i in range(parts + 1)]

        def product(j, dst):
            a, b = bounds[j], bounds[j + 1]
            cols = np.ascontiguousarray(win[:, :, :, a:b]).reshape(k, (b - a) * p)
            dyc = np.ascontiguousarray(dy[a:b].transpose(1, 0, 2, 3)).reshape(o, (b - a) * p)
            np.matmul(dyc, cols.T, out=dst)
        return sum_of_parts(product, parts, (o, k), x.dtype, 2 * o * k * n * p).reshape(w.shape)
    cols = contiguous(xp, win, axis=3).reshape(k, n * p)
    dyc = contiguous(xp, dy.transpose(1, 0, 2, 3), axis=1).reshape(o, n * p)
    return split_matmul(xp, cols, dyc.T).T.reshape(w.shape)


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
    s, d = window_pair(strides, "strides"), window_pair(dilations, "dilations")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ShapeError(f"conv2d needs NCHW input and OIHW weights, got {fmt(x.shape)} and {fmt(w.shape)}")
    pads = resolve_pads(padding, x.shape[2:], w.shape[2:], s, d)
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
