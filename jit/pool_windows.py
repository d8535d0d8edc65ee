"""Max pooling over any window, stride, dilation and padding in one compiled call per chunk of
(image, channel) planes, for core's MaxPool at inference (floats; numpy's NaN rule).

numpy pools as one pass per window tap over strided views; on small planes each pass pays its
iterator per output row (SqueezeNet's 3x3/stride-2 pools at batch 1: 660 us against
onnxruntime's 50; Inception's 3x3/stride-1 SAME pools: 900 against 67). A compiled loop per
output row paid its own per-row overhead the same way (jit/pool.py's note). Here the window is
separable and the loops run long: each plane (padded with -inf in a scratch only when the
window pads) is maxed down its columns first, kh taps over whole rows (one flat loop per tap
where the stride along H is 1), then along its rows, kw taps as flat loops over the whole plane
at every column, and every sw-th column of each output row is picked out (3x3/stride 2 on
64x48x48: 56 us against numpy's 200; 3x3/stride 1 SAME on 168x16x16: 42 against 255, one
thread, load about 1). At a row stride of 2 or more the windows' rows are maxed one output row at
a time instead (_planes_by_rows: no padded copy, fewer passes; 1.0-1.35x on SqueezeNet's pools).
"""
from __future__ import annotations

import numba as nb  # imported only when the kernel is first bound
import numpy as np


@nb.njit(nogil=True, cache=True, boundscheck=False)
def _vertical(p, v, oh, kh, sh, dh, wp):
    """v[oy wp + x] = max over i < kh of p[(oy sh + i dh) wp + x] (p, v flat planes of width wp)."""
    n = oh * wp
    if sh == 1:
        for q in range(n):
            v[q] = p[q]
        for i in range(1, kh):
            s = p[i * dh * wp:]
            for q in range(n):
                v[q] = np.maximum(v[q], s[q])
        return
    for oy in range(oh):
        d = v[oy * wp:(oy + 1) * wp]
        s0 = p[oy * sh * wp:]
        for x in range(wp):
            d[x] = s0[x]
        for i in range(1, kh):
            s = p[(oy * sh + i * dh) * wp:]
            for x in range(wp):
                d[x] = np.maximum(d[x], s[x])


@nb.njit(nogil=True, cache=True, boundscheck=False)
def _horizontal(v, t, out, oh, ow, kw, sw, dw, wp):
    """out[oy, ox] = max over j < kw of v[oy wp + ox sw + j dw] (t: scratch of v's size): the
    maxima at every column, one flat loop per tap, then every sw-th picked per output row."""
    n = oh * wp - (kw - 1) * dw
    for q in range(n):
        t[q] = v[q]
    for j in range(1, kw):
        s = v[j * dw:]
        for q in range(n):
            t[q] = np.maximum(t[q], s[q])
    for oy in range(oh):
        d, s = out[oy], t[oy * wp:]
        if sw == 1:
            for ox in range(ow):
                d[ox] = s[ox]
        elif sw == 2:  # a constant stride vectorizes (interleaved loads)
            for ox in range(ow):
                d[ox] = s[2 * ox]
        else:
            for ox in range(ow):
                d[ox] = s[ox * sw]


@nb.njit(nogil=True, cache=True, boundscheck=False, inline="always")  # a call per row cost 20-40%
def _rows_max(rb, xf, base, y0, kh, dh, h, w, left):
    """rb[left + q] = the maximum over rows y0 + i dh (i < kh) of the plane at xf[base:] [H, W] (flat),
    rows outside the plane being -inf padding: one loop for windows of 2 or 3 rows."""
    d = rb[left:]
    i0 = 0
    while i0 < kh and y0 + i0 * dh < 0:
        i0 += 1
    i1 = kh
    while i1 > i0 and y0 + (i1 - 1) * dh >= h:
        i1 -= 1
    if i1 - i0 == 3:
        a = xf[base + (y0 + i0 * dh) * w:]
        b = a[dh * w:]
        c = a[2 * dh * w:]
        for q in range(w):
            d[q] = np.maximum(np.maximum(a[q], b[q]), c[q])
        return
    if i1 - i0 == 2:
        a = xf[base + (y0 + i0 * dh) * w:]
        b = a[dh * w:]
        for q in range(w):
            d[q] = np.maximum(a[q], b[q])
        return
    if i1 == i0:
        for q in range(w):
            d[q] = -np.inf
        return
    a = xf[base + (y0 + i0 * dh) * w:]
    for q in range(w):
        d[q] = a[q]
    for i in range(i0 + 1, i1):
        a = xf[base + (y0 + i * dh) * w:]
        for q in range(w):
            d[q] = np.maximum(d[q], a[q])


@nb.njit(nogil=True, cache=True, boundscheck=False, inline="always")  # a call per row cost 20-40%
def _cols_max(rb, d, ow, kw, sw, dw):
    """d[ox] = the maximum of rb[ox sw + j dw] for j < kw; the common windows with constant steps
    (3 at stride 2 or 1, 2 at stride 2), which vectorize."""
    if kw == 3 and dw == 1 and sw == 2:
        for ox in range(ow):
            d[ox] = np.maximum(np.maximum(rb[2 * ox], rb[2 * ox + 1]), rb[2 * ox + 2])
    elif kw == 3 and dw == 1 and sw == 1:
        for ox in range(ow):
            d[ox] = np.maximum(np.maximum(rb[ox], rb[ox + 1]), rb[ox + 2])
    elif kw == 2 and dw == 1 and sw == 2:
        for ox in range(ow):
            d[ox] = np.maximum(rb[2 * ox], rb[2 * ox + 1])
    else:
        for ox in range(ow):
            m = rb[ox * sw]
            for j in range(1, kw):
                m = np.maximum(m, rb[ox * sw + j * dw])
            d[ox] = m


@nb.njit(nogil=True, cache=True, boundscheck=False)
def _planes_by_rows(x, out, geo, lo, hi):
    """max_pool_planes one output row at a time: the window's rows maxed into one padded row (in L1),
    then its columns; no padded plane, and each input row read once per window holding it. Faster
    than the plane passes at a row stride of 2 or more (SqueezeNet's 3x3/s2: 64x48x48 77 -> 60 us,
    256x12x12 55 -> 41), slower at stride 1 (168x16x16 SAME 42 -> 65), one thread."""
    kh, kw, sh, sw, dh, dw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    top, left = geo[6], geo[8]
    h, w = x.shape[1], x.shape[2]
    oh, ow = out.shape[1], out.shape[2]
    wp = max(left + w, (ow - 1) * sw + (kw - 1) * dw + 1)
    rb = np.full(wp, -np.inf, x.dtype)  # one row of column maxima; its padding stays -inf
    xf = x.reshape(x.shape[0] * h * w)  # flat views per row vectorize; 2-D row views ran slower
    of = out.reshape(out.shape[0] * oh * ow)
    for r in range(lo, hi):
        for oy in range(oh):
            _rows_max(rb, xf, r * h * w, oy * sh - top, kh, dh, h, w, left)
            _cols_max(rb, of[(r * oh + oy) * ow:], ow, kw, sw, dw)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def max_pool_planes(x, out, geo, lo, hi):
    """out[r] [OH, OW] = the maximum over each window of x[r] [H, W] for lo <= r < hi; geo (kh, kw,
    sh, sw, dh, dw, top, bottom, left, right), the padding -inf. Windows that hold a NaN give NaN,
    as numpy's tap-by-tap np.maximum does."""
    kh, kw, sh, sw, dh, dw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
    if sh >= 2:
        _planes_by_rows(x, out, geo, lo, hi)
        return
    top, bottom, left, right = geo[6], geo[7], geo[8], geo[9]
    h, w = x.shape[1], x.shape[2]
    oh, ow = out.shape[1], out.shape[2]
    hp, wp = h + top + bottom, w + left + right
    padded = top + bottom + left + right > 0
    p = np.full(hp * wp, -np.inf, x.dtype)
    v = np.empty(oh * wp, x.dtype)
    t = np.empty(oh * wp, x.dtype)
    for r in range(lo, hi):
        xr = x[r]
        if padded:  # the borders stay -inf: only the interior is rewritten
            for y in range(h):
                d, s = p[(y + top) * wp + left:], xr[y]
                for i in range(w):
                    d[i] = s[i]
            src = p
        else:
            src = xr.reshape(h * w)
        _vertical(src, v, oh, kh, sh, dh, wp)
        _horizontal(v, t, out[r], oh, ow, kw, sw, dw, wp)
