"""Bias and a clamp over a convolution's output rows in one compiled pass (for row-tap convolutions,
with their relayout to NCHW).

After a 1x1 convolution's GEMM, numpy adds the bias and clamps (relu6) in two passes over the
output, which at batch 1 cost about 40% of MobileNetV2's expansion layers here (96 x 2304 outputs:
GEMM 135 us, add 52 us, clip 38 us); one loop does both while the row is in registers.
"""
from __future__ import annotations

import numba as nb  # imported only when the pass is first bound
import numpy as np  # noqa: F401  (numba resolves the dtypes)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def bias_clamp_rows(y, bias, lo, hi):
    """y [R, L] in place: y[r] = min(max(y[r] + bias[r % C], lo), hi), C = len(bias); the clamp
    (-inf, inf) for no activation, (0, inf) relu, (0, 6) relu6. NaN stays NaN as in numpy."""
    c = bias.shape[0]
    for r in range(y.shape[0]):
        row, b = y[r], bias[r % c]
        for i in range(row.shape[0]):
            row[i] = min(max(row[i] + b, lo), hi)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def ohwn_to_nchw_bias_clamp(src, bias, lo, hi, y, a):
    """y[n, o, a + r, w] = min(max(src[o, r, w, n] + bias[o], lo), hi) for src [O, R, W, N] (a
    row-tap convolution's output rows, batch innermost, any strides) into y [N, O, H, W]: the layout
    change, the bias and the clamp in one pass, a [W, N] tile at a time (read in runs of N, written
    in runs of W)."""
    o_, r_, w_, n_ = src.shape
    for o in range(o_):
        b = bias[o]
        for r in range(r_):
            tile = src[o, r]
            for n in range(n_):
                d = y[n, o, a + r]
                for w in range(w_):
                    d[w] = min(max(tile[w, n] + b, lo), hi)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def ohwn_to_nchw(src, y, a):
    """y[n, o, a + r, w] = src[o, r, w, n]: ohwn_to_nchw_bias_clamp's layout change alone (an input
    gradient's rows: no bias, no activation, every value kept bit for bit)."""
    o_, r_, w_, n_ = src.shape
    for o in range(o_):
        for r in range(r_):
            tile = src[o, r]
            for n in range(n_):
                d = y[n, o, a + r]
                for w in range(w_):
                    d[w] = tile[w, n]


@nb.njit(nogil=True, cache=True, boundscheck=False)
def add_clamp(y, r, lo, hi):
    """y (flat) in place: y[i] = min(max(y[i] + r[i], lo), hi): a residual addend and the clamp in
    one pass over a finished convolution's output (r any flat array of y's length)."""
    for i in range(y.shape[0]):
        y[i] = min(max(y[i] + r[i], lo), hi)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def bias_add_clamp_rows(y, bias, r, lo, hi):
    """y [R, L] in place: y[i] = min(max(y[i] + bias[i % C] + r[i], lo), hi), r [R, L] the residual
    addend: bias_clamp_rows with the addend read in the same pass."""
    c = bias.shape[0]
    for i in range(y.shape[0]):
        row, add, b = y[i], r[i], bias[i % c]
        for j in range(row.shape[0]):
            row[j] = min(max(row[j] + b + add[j], lo), hi)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def ohwn_to_nchw_bias_add_clamp(src, bias, r, lo, hi, y, a):
    """ohwn_to_nchw_bias_clamp with a residual addend r of y's shape [N, O, H, W] read in the same
    pass: y[n, o, a + i, w] = min(max(src[o, i, w, n] + bias[o] + r[n, o, a + i, w], lo), hi)."""
    o_, r_, w_, n_ = src.shape
    for o in range(o_):
        b = bias[o]
        for i in range(r_):
            tile = src[o, i]
            for n in range(n_):
                d, add = y[n, o, a + i], r[n, o, a + i]
                for w in range(w_):
                    d[w] = min(max(tile[w, n] + b + add[w], lo), hi)
