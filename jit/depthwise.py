"""Depthwise 2-D convolution (one filter per channel) with bias and a clamp, compiled.

`depthwise_rows(x, w, bias, geometry, lo, hi, out, r0, r1)` computes rows r0..r1 of
x [R, H, W] (R = images x channels, channel = row % C) against w [C, kh, kw] into out [R, OH, OW]:
out = clamp(bias + sum over taps of w * x, lo, hi), with zero padding. A clamp covers no
activation (-inf, inf), relu (0, inf) and relu6 (0, 6); NaN passes through as in numpy.

Each row is copied once into a zero-bordered plane so that no tap needs a bounds test; 3x3
kernels (dilation 1) at stride 1 or 2 have the nine products unrolled into one expression per
output (the loop over output columns vectorizes), other shapes loop over taps into a row
accumulator. The GIL is released, so disjoint row ranges run on threads.

Gradients: the input gradient is a forward stride-1 convolution of dy (zeros inserted between
its values at stride s > 1) with the weights flipped (`input_grad_as_forward`); the filter
gradient (`depthwise_filter_grad_rows`) sums, per tap and output row, dy times the input the tap
read (vectorized in the input's dtype) into float64 totals per channel.
"""
from __future__ import annotations

import numba as nb  # this module is imported only when a compiled kernel first runs
import numpy as np

_OPTS = dict(nogil=True, cache=True, fastmath={"contract"}, boundscheck=False)


@nb.njit(**_OPTS)
def _fill(x, r, pad, pt, pl):
    # row by row through 1-d contiguous slices (runtime offsets inside a 2-d index halve the
    # speed here; a 2-d view at the pad offset is 30-37% slower on the large planes than this)
    xr = x[r]
    for y in range(xr.shape[0]):
        row, src = pad[pt + y, pl:], xr[y]
        for i in range(src.shape[0]):
            row[i] = src[i]


@nb.njit(**_OPTS)
def split_phases(pad, ev, od):
    """Even and odd columns of each padded row: ev[y, k] = pad[y, 2k], od[y, k] = pad[y, 2k + 1]."""
    for y in range(ev.shape[0]):
        src, e, o = pad[y], ev[y], od[y]
        for k in range(ev.shape[1]):
            e[k] = src[2 * k]
            o[k] = src[2 * k + 1]


@nb.njit(**_OPTS)
def taps3x3(w, ch):
    """Channel ch's nine weights, row by row."""
    return (w[ch, 0, 0], w[ch, 0, 1], w[ch, 0, 2], w[ch, 1, 0], w[ch, 1, 1], w[ch, 1, 2],
            w[ch, 2, 0], w[ch, 2, 1], w[ch, 2, 2])


@nb.njit(**_OPTS)
def _s1_3x3(x, w, bias, pt, pl, lo, hi, out, r0, r1, pad):
    _, h, wd = x.shape
    c = w.shape[0]
    oh, ow = out.shape[1], out.shape[2]
    pad[:, :] = 0  # the border stays zero; each row's fill rewrites the inside
    for r in range(r0, r1):
        ch = r % c
        _fill(x, r, pad, pt, pl)
        b = bias[ch]
        w00, w01, w02, w10, w11, w12, w20, w21, w22 = taps3x3(w, ch)
        for oy in range(oh):
            a0, a1, a2, o = pad[oy], pad[oy + 1], pad[oy + 2], out[r, oy]
            for ox in range(ow):
                v = (b + w00 * a0[ox] + w01 * a0[ox + 1] + w02 * a0[ox + 2]
                     + w10 * a1[ox] + w11 * a1[ox + 1] + w12 * a1[ox + 2]
                     + w20 * a2[ox] + w21 * a2[ox + 1] + w22 * a2[ox + 2])
                o[ox] = min(max(v, lo), hi)


@nb.njit(**_OPTS)
def _s2_3x3(x, w, bias, pt, pl, lo, hi, out, r0, r1, pad, ev, od):
    # the padded columns split into even and odd phases: column 2*ox + k is even[ox],
    # odd[ox], even[ox + 1] for k = 0, 1, 2, so every tap reads contiguously
    _, h, wd = x.shape
    c = w.shape[0]
    oh, ow = out.shape[1], out.shape[2]
    pad[:, :] = 0
    for r in range(r0, r1):
        ch = r % c
        _fill(x, r, pad, pt, pl)
        split_phases(pad, ev, od)
        b = bias[ch]
        w00, w01, w02, w10, w11, w12, w20, w21, w22 = taps3x3(w, ch)
        for oy in range(oh):
            y0 = 2 * oy
            e0, e1, e2, o = ev[y0], ev[y0 + 1], ev[y0 + 2], out[r, oy]
            d0, d1, d2 = od[y0], od[y0 + 1], od[y0 + 2]
            for ox in range(ow):
                v = (b + w00 * e0[ox] + w01 * d0[ox] + w02 * e0[ox + 1]
                     + w10 * e1[ox] + w11 * d1[ox] + w12 * e1[ox + 1]
                     + w20 * e2[ox] + w21 * d2[ox] + w22 * e2[ox + 1])
                o[ox] = min(max(v, lo), hi)


@nb.njit(**_OPTS)
def tap_row(acc, pad, w, b, ch, oy, sh, sw, dh, dw):
    """acc[ox] = b + the sum over channel ch's taps of w * the padded input they read, for output row oy."""
    kh, kw = w.shape[1], w.shape[2]
    acc[:] = b
    for ky in range(kh):
        row = pad[oy * sh + ky * dh]
        for kx in range(kw):
            wv = w[ch, ky, kx]
            off = kx * dw
            for ox in range(acc.shape[0]):
                acc[ox] += wv * row[ox * sw + off]


@nb.njit(**_OPTS)
def _general(x, w, bias, sh, sw, dh, dw, pt, pl, lo, hi, out, r0, r1, pad, acc):
    _, h, wd = x.shape
    c = w.shape[0]
    oh, ow = out.shape[1], out.shape[2]
    pad[:, :] = 0
    for r in range(r0, r1):
        ch = r % c
        _fill(x, r, pad, pt, pl)
        for oy in range(oh):
            tap_row(acc, pad, w, bias[ch], ch, oy, sh, sw, dh, dw)
            o = out[r, oy]
            for ox in range(ow):
                o[ox] = min(max(acc[ox], lo), hi)


def scratch_elems(x_shape, w_shape, g) -> int:
    """Elements of x's dtype that depthwise_rows needs as scratch for this convolution."""
    h, wd = x_shape[-2], x_shape[-1]
    (pt, pb), (pl, pr) = g.pads
    hp, wp = h + pt + pb, wd + pl + pr
    if _fast(w_shape, g) and g.sh == 2:
        wq = wp // 2 + 1
        return hp * 4 * wq
    return hp * wp + (wp - (w_shape[-1] - 1) * g.dw - 1) // g.sw + 1  # the padded plane, an output row


def _fast(w_shape, g) -> bool:
    return w_shape[-2] == 3 and w_shape[-1] == 3 and g.dh == 1 and g.dw == 1 and g.sh == g.sw and g.sh in (1, 2)


def depthwise_rows(x, w, bias, g, lo: float, hi: float, out, r0: int, r1: int, scratch=None) -> None:
    """Rows r0..r1 of out = clamp(depthwise(x, w) + bias, lo, hi); x [R, H, W], w [C, kh, kw],
    bias [C] or None, out [R, OH, OW] (contiguous), g the convolution's geometry (pads, strides,
    dilations). x, w, bias and out share one float dtype. scratch: a 1-D array of that dtype with
    at least scratch_elems(...) elements (an interpreter's arena); without it, one is allocated.
    Threads running row ranges at once each need their own."""
    (pt, pb), (pl, pr) = g.pads
    dt = x.dtype.type
    b = bias if bias is not None else np.zeros(w.shape[0], x.dtype)
    h, wd = x.shape[1], x.shape[2]
    hp, wp = h + pt + pb, wd + pl + pr
    need = scratch_elems(x.shape, w.shape, g)
    if scratch is None:
        scratch = np.empty(need, x.dtype)
    elif scratch.ndim != 1 or scratch.dtype != x.dtype or scratch.size < need:
        raise ValueError(f"depthwise scratch must be a 1-D {x.dtype} array of at least {need} elements, "
                         f"got {scratch.dtype} {scratch.shape}")
    if _fast(w.shape, g):
        if g.sh == 1:
            _s1_3x3(x, w, b, pt, pl, dt(lo), dt(hi), out, r0, r1, scratch[:hp * wp].reshape(hp, wp))
        else:
            wq = wp // 2 + 1
            pad = scratch[:hp * 2 * wq].reshape(hp, 2 * wq)
            ev = scratch[hp * 2 * wq:hp * 3 * wq].reshape(hp, wq)
            od = scratch[hp * 3 * wq:hp * 4 * wq].reshape(hp, wq)
            _s2_3x3(x, w, b, pt, pl, dt(lo), dt(hi), out, r0, r1, pad, ev, od)
    else:
        _general(x, w, b, g.sh, g.sw, g.dh, g.dw, pt, pl, dt(lo), dt(hi), out, r0, r1,
                 scratch[:hp * wp].reshape(hp, wp), scratch[hp * wp:hp * wp + out.shape[2]])


def range_args(x, w, bias, g, lo: float, hi: float, out) -> tuple:
    """The arguments of planes_range before its r0, r1 for depthwise_rows' convolution (the same
    kernel and scratch layout), for intra_op.par_rows."""
    (pt, pb), (pl, pr) = g.pads
    dt = x.dtype.type
    b = bias if bias is not None else np.zeros(w.shape[0], x.dtype)
    kind = (1 if g.sh == 1 else 2) if _fast(w.shape, g) else 0
    return (x, w, b, kind, g.sh, g.sw, g.dh, g.dw, pt, pl, x.shape[1] + pt + pb, x.shape[2] + pl + pr,
            dt(lo), dt(hi), out)


@nb.njit(**_OPTS)
def planes_range(x, w, b, kind, sh, sw, dh, dw, pt, pl, hp, wp, lo, hi, out, r0, r1):
    """depthwise_rows' rows r0..r1 as one compiled call with its own scratch (kind 1: 3x3 stride 1,
    2: 3x3 stride 2, 0: any other): the range form jit.par's drivers split; each row computed alone."""
    if kind == 1:
        _s1_3x3(x, w, b, pt, pl, lo, hi, out, r0, r1, np.empty((hp, wp), x.dtype))
    elif kind == 2:
        wq = wp // 2 + 1
        _s2_3x3(x, w, b, pt, pl, lo, hi, out, r0, r1, np.empty((hp, 2 * wq), x.dtype),
                np.empty((hp, wq), x.dtype), np.empty((hp, wq), x.dtype))
    else:
        _general(x, w, b, sh, sw, dh, dw, pt, pl, lo, hi, out, r0, r1, np.empty((hp, wp), x.dtype),
                 np.empty(out.shape[2], x.dtype))


_SUM_OPTS = dict(_OPTS, fastmath={"contract", "reassoc"})  # reassociation lets sums vectorize


@nb.njit(**_SUM_OPTS)
def _filter_grad_3x3(x, dy, sh, sw, pt, pl, pb, pr, acc, r0, r1):
    # per output row, nine sums over its columns (in x's dtype, vectorized), added into float64
    # per row: measured 5e-8 relative to a float64 reference on 32x144x24x24 (float32)
    _, h, wd = x.shape
    c = acc.shape[0]
    _, oh, ow = dy.shape
    pad = np.zeros((h + pt + pb, wd + pl + pr), x.dtype)
    zero = x.dtype.type(0)
    for r in range(r0, r1):
        ch = r % c
        _fill(x, r, pad, pt, pl)
        a00 = a01 = a02 = a10 = a11 = a12 = a20 = a21 = a22 = 0.0
        for oy in range(oh):
            y = oy * sh
            p0, p1, p2, g = pad[y], pad[y + 1], pad[y + 2], dy[r, oy]
            s00 = s01 = s02 = s10 = s11 = s12 = s20 = s21 = s22 = zero
            if sw == 1:
                for ox in range(ow):
                    d = g[ox]
                    s00 += d * p0[ox]
                    s01 += d * p0[ox + 1]
                    s02 += d * p0[ox + 2]
                    s10 += d * p1[ox]
                    s11 += d * p1[ox + 1]
                    s12 += d * p1[ox + 2]
                    s20 += d * p2[ox]
                    s21 += d * p2[ox + 1]
                    s22 += d * p2[ox + 2]
            else:
                for ox in range(ow):
                    d, q = g[ox], ox * sw
                    s00 += d * p0[q]
                    s01 += d * p0[q + 1]
                    s02 += d * p0[q + 2]
                    s10 += d * p1[q]
                    s11 += d * p1[q + 1]
                    s12 += d * p1[q + 2]
                    s20 += d * p2[q]
                    s21 += d * p2[q + 1]
                    s22 += d * p2[q + 2]
            a00 += s00
            a01 += s01
            a02 += s02
            a10 += s10
            a11 += s11
            a12 += s12
            a20 += s20
            a21 += s21
            a22 += s22
        acc[ch, 0, 0] += a00
        acc[ch, 0, 1] += a01
        acc[ch, 0, 2] += a02
        acc[ch, 1, 0] += a10
        acc[ch, 1, 1] += a11
        acc[ch, 1, 2] += a12
        acc[ch, 2, 0] += a20
        acc[ch, 2, 1] += a21
        acc[ch, 2, 2] += a22


@nb.njit(**_SUM_OPTS)
def _filter_grad(x, dy, sh, sw, dh, dw, pt, pl, pb, pr, acc, r0, r1):
    # any kernel: per tap and output row a sum over the row's columns, added into float64
    _, h, wd = x.shape
    c, kh, kw = acc.shape
    _, oh, ow = dy.shape
    pad = np.zeros((h + pt + pb, wd + pl + pr), x.dtype)
    zero = x.dtype.type(0)
    for r in range(r0, r1):
        ch = r % c
        _fill(x, r, pad, pt, pl)
        for ky in range(kh):
            for kx in range(kw):
                total = 0.0
                for oy in range(oh):
                    g, a = dy[r, oy], pad[oy * sh + ky * dh, kx * dw:]
                    s = zero
                    for ox in range(ow):
                        s += g[ox] * a[ox * sw]
                    total += s
                acc[ch, ky, kx] += total


class _Geometry:
    __slots__ = ("kh", "kw", "sh", "sw", "dh", "dw", "pads", "oh", "ow")

    def __init__(self, kh, kw, dh, dw, pads, oh, ow):
        self.kh, self.kw, self.sh, self.sw, self.dh, self.dw = kh, kw, 1, 1, dh, dw
        self.pads, self.oh, self.ow = pads, oh, ow


def input_grad_as_forward(dy, w, g, h: int, wd: int):
    """The input gradient of a depthwise convolution as a forward one, for depthwise_rows:
    -> (source [R, H', W'], flipped weights [C, kh, kw], geometry). dx[y] gathers w[k] * dy[o]
    over y + top = o*s + k*d: a stride-1 convolution of dy (zeros inserted between its values
    for a stride s > 1) with the weights flipped, padded (or cropped) to give H x W outputs."""
    (pt, _), (pl, _) = g.pads
    rows, oh, ow = dy.shape
    top, left = (g.kh - 1) * g.dh - pt, (g.kw - 1) * g.dw - pl
    eh, ew = (oh - 1) * g.sh + 1, (ow - 1) * g.sw + 1  # dy's extent with the zeros inserted
    bottom, right = h + pt - eh, wd + pl - ew
    wf = np.ascontiguousarray(w[:, ::-1, ::-1])
    if g.sh == g.sw == 1 and min(top, left, bottom, right) >= 0:  # the kernel pads as it goes
        return dy, wf, _Geometry(g.kh, g.kw, g.dh, g.dw, ((top, bottom), (left, right)), h, wd)
    src = np.zeros((rows, h + (g.kh - 1) * g.dh, wd + (g.kw - 1) * g.dw), dy.dtype)
    # dy's value (o, q) lands at (top + o*sh, left + q*sw) of src; rows and columns outside src are cut
    o0, q0 = max(0, -(-(-top) // g.sh)), max(0, -(-(-left) // g.sw))
    o1 = min(oh, (src.shape[1] - 1 - top) // g.sh + 1)
    q1 = min(ow, (src.shape[2] - 1 - left) // g.sw + 1)
    if o1 > o0 and q1 > q0:
        src[:, top + o0 * g.sh:top + (o1 - 1) * g.sh + 1:g.sh,
            left + q0 * g.sw:left + (q1 - 1) * g.sw + 1:g.sw] = dy[:, o0:o1, q0:q1]
    return src, wf, _Geometry(g.kh, g.kw, g.dh, g.dw, ((0, 0), (0, 0)), h, wd)


def depthwise_filter_grad_rows(x, dy, g, acc, r0: int, r1: int) -> None:
    """Adds rows r0..r1's share of the filter gradient into acc [C, kh, kw] (float64); rows of one
    channel from several images add into the same entry, so threads each need their own acc."""
    (pt, pb), (pl, pr) = g.pads
    if acc.shape[1] == 3 and acc.shape[2] == 3 and g.dh == 1 and g.dw == 1:
        _filter_grad_3x3(x, dy, g.sh, g.sw, pt, pl, pb, pr, acc, r0, r1)
    else:
        _filter_grad(x, dy, g.sh, g.sw, g.dh, g.dw, pt, pl, pb, pr, acc, r0, r1)
