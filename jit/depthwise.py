"""Depthwise 2-D convolution (one filter per channel) with bias and a clamp, compiled.

`depthwise_rows(x, w, bias, geometry, lo, hi, out, r0, r1)` computes rows r0..r1 of
x [R, H, W] (R = images x channels, channel = row % C) against w [C, kh, kw] into out [R, OH, OW]:
out = clamp(bias + sum over taps of w * x, lo, hi), with zero padding. A clamp covers no
activation (-inf, inf), relu (0, inf) and relu6 (0, 6); NaN passes through as in numpy.

Each row is copied once into a zero-bordered plane so that no tap needs a bounds test; 3x3
kernels (dilation 1) at stride 1 or 2 have the nine products unrolled into one expression per
output (the loop over output columns vectorizes), other shapes loop over taps into a row
accumulator. The GIL is released, so disjoint row ranges run on threads.
"""
from __future__ import annotations

import numba as nb  # this module is imported only when a compiled kernel first runs
import numpy as np

_OPTS = dict(nogil=True, cache=True, fastmath={"contract"}, boundscheck=False)


@nb.njit(**_OPTS)
def _fill(x, r, pad, pt, pl):
    # through a view at the pad offset: runtime offsets in the index halve the speed here
    xr, inner = x[r], pad[pt:, pl:]
    for y in range(xr.shape[0]):
        for i in range(xr.shape[1]):
            inner[y, i] = xr[y, i]


@nb.njit(**_OPTS)
def _s1_3x3(x, w, bias, pt, pl, pb, pr, lo, hi, out, r0, r1):
    _, h, wd = x.shape
    c = w.shape[0]
    oh, ow = out.shape[1], out.shape[2]
    pad = np.zeros((h + pt + pb, wd + pl + pr), x.dtype)
    for r in range(r0, r1):
        ch = r % c
        _fill(x, r, pad, pt, pl)
        b = bias[ch]
        w00, w01, w02 = w[ch, 0, 0], w[ch, 0, 1], w[ch, 0, 2]
        w10, w11, w12 = w[ch, 1, 0], w[ch, 1, 1], w[ch, 1, 2]
        w20, w21, w22 = w[ch, 2, 0], w[ch, 2, 1], w[ch, 2, 2]
        for oy in range(oh):
            a0, a1, a2, o = pad[oy], pad[oy + 1], pad[oy + 2], out[r, oy]
            for ox in range(ow):
                v = (b + w00 * a0[ox] + w01 * a0[ox + 1] + w02 * a0[ox + 2]
                     + w10 * a1[ox] + w11 * a1[ox + 1] + w12 * a1[ox + 2]
                     + w20 * a2[ox] + w21 * a2[ox + 1] + w22 * a2[ox + 2])
                o[ox] = min(max(v, lo), hi)


@nb.njit(**_OPTS)
def _s2_3x3(x, w, bias, pt, pl, pb, pr, lo, hi, out, r0, r1):
    # the padded columns split into even and odd phases: column 2*ox + k is even[ox],
    # odd[ox], even[ox + 1] for k = 0, 1, 2, so every tap reads contiguously
    _, h, wd = x.shape
    c = w.shape[0]
    oh, ow = out.shape[1], out.shape[2]
    hp, wp = h + pt + pb, wd + pl + pr
    wq = wp // 2 + 1
    pad = np.zeros((hp, 2 * wq), x.dtype)
    ev = np.zeros((hp, wq), x.dtype)
    od = np.zeros((hp, wq), x.dtype)
    for r in range(r0, r1):
        ch = r % c
        _fill(x, r, pad, pt, pl)
        for y in range(hp):
            for k in range(wq):
                ev[y, k] = pad[y, 2 * k]
                od[y, k] = pad[y, 2 * k + 1]
        b = bias[ch]
        w00, w01, w02 = w[ch, 0, 0], w[ch, 0, 1], w[ch, 0, 2]
        w10, w11, w12 = w[ch, 1, 0], w[ch, 1, 1], w[ch, 1, 2]
        w20, w21, w22 = w[ch, 2, 0], w[ch, 2, 1], w[ch, 2, 2]
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
def _general(x, w, bias, sh, sw, dh, dw, pt, pl, pb, pr, lo, hi, out, r0, r1):
    _, h, wd = x.shape
    c, kh, kw = w.shape
    oh, ow = out.shape[1], out.shape[2]
    pad = np.zeros((h + pt + pb, wd + pl + pr), x.dtype)
    acc = np.empty(ow, x.dtype)
    for r in range(r0, r1):
        ch = r % c
        _fill(x, r, pad, pt, pl)
        for oy in range(oh):
            acc[:] = bias[ch]
            for ky in range(kh):
                row = pad[oy * sh + ky * dh]
                for kx in range(kw):
                    wv = w[ch, ky, kx]
                    off = kx * dw
                    for ox in range(ow):
                        acc[ox] += wv * row[ox * sw + off]
            o = out[r, oy]
            for ox in range(ow):
                o[ox] = min(max(acc[ox], lo), hi)


def depthwise_rows(x, w, bias, g, lo: float, hi: float, out, r0: int, r1: int) -> None:
    """Rows r0..r1 of out = clamp(depthwise(x, w) + bias, lo, hi); x [R, H, W], w [C, kh, kw],
    bias [C] or None, out [R, OH, OW] (contiguous), g the convolution's geometry (pads, strides,
    dilations). x, w, bias and out share one float dtype."""
    (pt, pb), (pl, pr) = g.pads
    dt = x.dtype.type
    b = bias if bias is not None else np.zeros(w.shape[0], x.dtype)
    if w.shape[1] == 3 and w.shape[2] == 3 and g.dh == 1 and g.dw == 1 and g.sh == g.sw and g.sh in (1, 2):
        kernel = _s1_3x3 if g.sh == 1 else _s2_3x3
        kernel(x, w, b, pt, pl, pb, pr, dt(lo), dt(hi), out, r0, r1)
    else:
        _general(x, w, b, g.sh, g.sw, g.dh, g.dw, pt, pl, pb, pr, dt(lo), dt(hi), out, r0, r1)
