"""Pooling on NCHW tensors: MaxPool, AvgPool and GlobalAvgPool with their gradients (the window
arithmetic is conv_geometry.py's, shared with conv.py)."""
from __future__ import annotations

import sys
from typing import Optional

import numpy as np

from ... import jit
from ..errors import ShapeError
from ..graph import Tensor
from ..registry import Cost, OpDef, register
from ..shapes import fmt, num_elements_est
from .base import convert, make
from .conv_geometry import WindowGeometry, padded_copy, resolve_pads, window_out_size, window_pair
from .depthwise import compiled_ok
from .intra_op import rows_apply
from .par_gate import split_rows

__all__ = ["max_pool", "avg_pool", "global_avg_pool"]


# ---- pooling ------------------------------------------------------------------------------------
def _pool_geometry(node, shape):
    g = WindowGeometry()
    g.kh, g.kw = node.attrs["ksize"]
    g.sh, g.sw = node.attrs["strides"]
    g.dh, g.dw = node.attrs["dilations"]
    g.pads = node.attrs["pads"]
    g.oh = window_out_size(shape[2], g.kh, g.sh, g.dh, g.pads[0])
    g.ow = window_out_size(shape[3], g.kw, g.sw, g.dw, g.pads[1])
    g.groups = 1
    return g


def _geometry_cache(node):
    """shape -> (the node's window geometry, whether its 2x2 windows tile the input), computed once
    per input shape (a kernel asked for them on every call: about 3 us of a 10 us batch-1 pool)."""
    cache = {}

    def geometry(shape):
        got = cache.get(shape)
        if got is None:
            if len(cache) >= 8:  # many input shapes (a varying batch): start over
                cache.clear()
            g = _pool_geometry(node, shape)
            got = cache[shape] = (g, _pairs_tiled(g, shape))
        return got
    return geometry


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
    """Maximum of row pairs (contiguous runs of W), then of column pairs: two ops, not four;
    images in chunks on the intra-op threads."""
    n, c = x.shape[0], x.shape[1]
    x5 = x.reshape(n, c, g.oh, 2, 2 * g.ow)
    out = xp.empty((n, c, g.oh, g.ow), dtype=x.dtype)

    def part(lo, hi):
        rows = xp.maximum(x5[lo:hi, :, :, 0], x5[lo:hi, :, :, 1])
        xp.maximum(rows[..., 0::2], rows[..., 1::2], out=out[lo:hi])
    rows_apply(xp, part, n, x.nbytes)
    return out


def _max_pool_pairs_compiled(x, g):
    """One compiled pass (jit.pool, the edge's kernel) over chunks of (image, channel) planes on the
    intra-op threads: numpy's two passes pay their iterator per output row on small planes, and
    each pass is a trip through memory (64x32x28x28: 2.3 ms in numpy, one thread)."""
    pp = jit.loaded("par_pool")
    n, c, h, w = x.shape
    out = np.empty((n, c, g.oh, g.ow), x.dtype)
    x3, y3 = x.reshape(n * c, h, w), out.reshape(n * c, g.oh, g.ow)
    split_rows(pp.max_pool_2x2_float_range, (x3, y3), n * c, x.nbytes)
    return out


def _max_pool_windows_compiled(x, g):
    """Any window, stride, dilation and padding as one compiled call (jit.pool_windows: separable
    maxima, the padding implicit) per chunk of (image, channel) planes on the intra-op threads:
    numpy's kh*kw passes over strided views pay their iterator per output row on small planes
    (SqueezeNet's 3x3/stride-2 pools at batch 1: 660 us in numpy, onnxruntime 50)."""
    max_pool_planes = jit.loaded("par_pool").max_pool_planes  # loading registers the prange driver
    n, c, h, w = x.shape
    out = np.empty((n, c, g.oh, g.ow), x.dtype)
    (t, b), (l, r) = g.pads
    geo = np.array([g.kh, g.kw, g.sh, g.sw, g.dh, g.dw, t, b, l, r], np.int64)
    x3 = np.ascontiguousarray(x).reshape(n * c, h, w)
    y3 = out.reshape(n * c, g.oh, g.ow)
    # work in the bytes a copy writes in the same time (intra_op's unit), fit at one thread, load 1.3:
    # 64x48x48 3x3/s2 69 us, 96x24x24 2x2/s2 25, 64x28x28 5x5/s1 56
    split_rows(max_pool_planes, (x3, y3, geo), n * c, 3 * x.nbytes + out.nbytes * (g.kh + g.kw))
    return out


def _blocked_pays(x, g) -> bool:
    """Whether jit.pool_blocked serves: 3x3 windows, dilation 1, float32, at least 16 planes, AVX2.
    One thread, load ~2: SqueezeNet's 3x3/s2 pools 1.4-3.2x (64x48x48 63 -> 45 us, 256x12x12 41 ->
    13), Inception's 1.3-2.8x (224x16x16 s2 46 -> 16, 168x16x16 s1 SAME 42 -> 33), a batch-32-sized
    2048x48x48 1.4x; below 16 planes the element-by-element tail of the transposes ran slower."""
    if not ((g.kh, g.kw, g.dh, g.dw) == (3, 3, 1, 1) and x.dtype == np.float32
            and x.shape[0] * x.shape[1] >= 16 and min(g.pads[0] + g.pads[1]) >= 0):
        return False
    from ...jit.gemm_int8 import supported  # deferred: loads llvmlite, numba
    return supported()


def _blocked_runner(shape, g):
    """run(x): jit.pool_blocked over 8-plane blocks, split across numba's threads where
    threads.par_threads says it pays (intra_op.par_rows; each block alone, so the same bytes on any
    thread count), for inputs of one shape; what does not change from call to call (the import,
    the geometry) worked out once: at batch 1 that was 11 us a call."""
    from ...jit.par_pool import max_pool_blocked_range  # deferred: loads numba; registers the prange driver
    n, c, h, w = shape
    (t, b), (l, r) = g.pads
    hp, wp, oh, ow, sh, sw = h + t + b, w + l + r, g.oh, g.ow, g.sh, g.sw
    blocks = -(-(n * c) // 8)
    # work in the bytes a copy writes in the same time (intra_op's unit), fit at one thread, load 1.3:
    # 64x48x48/s2 41 us, 256x12x12/s2 10, 224x16x16/s2 15, 168x16x16/s1 31
    work = 4 * n * c * (h * w + 5 * oh * ow)

    def run(x):
        out = np.empty((n, c, oh, ow), np.float32)
        x3 = (x if x.flags.c_contiguous else np.ascontiguousarray(x)).reshape(n * c, h, w)
        split_rows(max_pool_blocked_range, (x3, t, l, hp, wp, sh, sw, out.reshape(n * c, oh, ow)), blocks, work)
        return out
    return run


def _kernel_max_pool(node, ctx):
    """The running maximum over kernel taps: kh*kw elementwise ops on output-sized strided
    views, several times faster than a numpy reduction over window axes."""
    xp = ctx.xp
    blocked = {}  # (shape, dtype) -> the blocked kernel's runner, once it served that shape
    geometry = _geometry_cache(node)

    def run(x):
        fast = blocked.get((x.shape, x.dtype))
        if fast is not None and jit.enabled_by_env():
            return fast(x)
        g, pairs = geometry(x.shape)
        if pairs and x.flags.c_contiguous:
            if x.dtype.kind == "f" and compiled_ok(xp, x.dtype):
                return _max_pool_pairs_compiled(x, g)
            return _max_pool_pairs(xp, x, g)
        if x.dtype.kind == "f" and compiled_ok(xp, x.dtype) and min(g.pads[0] + g.pads[1]) >= 0:
            if _blocked_pays(x, g):
                if len(blocked) >= 8:  # many input shapes (a varying batch): start over
                    blocked.clear()
                fast = blocked[(x.shape, x.dtype)] = _blocked_runner(x.shape, g)
                return fast(x)
            return _max_pool_windows_compiled(x, g)
        xpad = padded_copy(xp, x, g.pads, _lowest(x.dtype))
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


def _max_pool_grad_split(xp, x, y, dy, g):
    """_max_pool_grad_pairs over chunks of images on the intra-op threads (one chunk: in place)."""
    n = x.shape[0]
    dx = []

    def part(lo, hi):
        r = _max_pool_grad_pairs(xp, x[lo:hi], y[lo:hi], dy[lo:hi], g)
        if lo == 0 and hi == n:
            dx.append(r)
        else:
            out[lo:hi] = r
    out = xp.empty(x.shape, dtype=x.dtype)
    rows_apply(xp, part, n, x.nbytes * 3)
    return dx[0] if dx else out


def _max_pool_grad_compiled(x, y, dy, g, through_relu: bool):
    """MaxPoolGrad of _pairs_tiled windows as one compiled pass (jit.pool) over chunks of (image,
    channel) planes split across numba's threads (intra_op.par_rows) where it pays: the same values as _max_pool_grad_pairs' mask passes
    (ties, NaN and the relu mask alike), in one trip through memory instead of about ten."""
    from ...jit.par_pool import max_pool_2x2_grad_range  # deferred: loads numba
    n, c, h, w = x.shape
    rows = n * c * g.oh  # pairs of input rows, one row of windows each
    xf, yf = np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(y).reshape(-1)
    dyf = np.ascontiguousarray(dy).reshape(-1)
    dx = np.empty((n, c, h, w), x.dtype)
    split_rows(max_pool_2x2_grad_range, (xf, yf, dyf, dx.reshape(-1), w, through_relu), rows,
             2 * x.nbytes + 2 * y.nbytes)
    return dx


def _kernel_max_pool_grad(node, ctx):
    xp = ctx.xp

    through_relu = node.attrs["through_relu"]
    geometry = _geometry_cache(node)

    def run(x, y, dy):
        g, pairs = geometry(x.shape)
        if pairs and x.dtype == y.dtype == dy.dtype and compiled_ok(xp, x.dtype):
            return _max_pool_grad_compiled(x, y, dy, g, through_relu)
        if through_relu:  # see math.max_pool_grad_through_relu: the relu's mask at the pooled size
            dy = xp.multiply(dy, y > 0)
        if pairs and x.dtype == np.float32:
            return _max_pool_grad_split(xp, xp.ascontiguousarray(x), xp.ascontiguousarray(y),
                                        xp.ascontiguousarray(dy), g)
        n, c, h, w = x.shape
        (t, b), (l, r) = g.pads
        xpad = padded_copy(xp, x, g.pads, -np.inf)
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
    ones = padded_copy(xp, xp.ones((1, 1) + tuple(shape[2:]), dtype=dtype), g.pads)
    out = xp.zeros((1, 1, g.oh, g.ow), dtype=dtype)
    for t in _taps(g):
        out += ones[t]
    return out


def _kernel_avg_pool(node, ctx):
    xp = ctx.xp

    def run(x):
        g = _pool_geometry(node, x.shape)
        xpad = padded_copy(xp, x, g.pads)
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
    k = window_pair(ksize, "ksize")
    s = window_pair(strides if strides is not None else ksize, "strides")
    d = window_pair(dilations, "dilations")
    if min(k + s + d) < 1:
        raise ShapeError(f"{op}: ksize {k}, strides {s} and dilations {d} must be >= 1")
    pads = resolve_pads(padding, x.shape[2:], k, s, d)
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


def _kernel_gap(node, ctx):
    """Each plane's mean as one matrix-vector product with a vector of 1/(H*W) (BLAS): numpy's
    mean over two axes costs tens of microseconds of wrapper and reduction setup at batch 1."""
    xp, keep, inv = ctx.xp, node.attrs["keepdims"], {}

    def run(x):
        n, c, h, w = x.shape
        if h * w == 0:
            return x.mean(axis=(2, 3), keepdims=keep)
        v = inv.get((h * w, x.dtype))
        if v is None:
            v = inv[(h * w, x.dtype)] = xp.full(h * w, 1.0 / (h * w), dtype=x.dtype)
        y = x.reshape(n * c, h * w) @ v
        return y.reshape((n, c, 1, 1) if keep else (n, c))
    return run


register(OpDef("GlobalAvgPool", inputs=("x",), attrs={"keepdims": False}, infer=_infer_gap,
               kernel=_kernel_gap,
               grad=lambda node, dys: [make("GlobalAvgPoolGrad", (node.inputs[0], dys[0])).outputs[0]],
               cost=lambda node: Cost(num_elements_est(node.inputs[0].shape),
                                      num_elements_est(node.inputs[0].shape) * node.inputs[0].dtype.itemsize, 0)))
register(OpDef("GlobalAvgPoolGrad", inputs=("x", "dy"),
               infer=lambda node: [(node.inputs[0].dtype, node.inputs[0].shape)], kernel=_kernel_gap_grad,
               cost=lambda node: Cost(num_elements_est(node.inputs[0].shape))))


def global_avg_pool(x, keepdims: bool = False, name: Optional[str] = None) -> Tensor:
    return make("GlobalAvgPool", (convert(x),), {"keepdims": bool(keepdims)}, name=name).outputs[0]
