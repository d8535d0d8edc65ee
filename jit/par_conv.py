"""The row-tap convolutions' relayouts as compiled range kernels (core/ops/conv_rows.py runs them over
channel ranges, split by jit.par's prange drivers).

numpy builds row-tap columns in two strided copies per channel chunk: the input relaid [C, H, Wp, N]
(padded along W), then its window view copied to [kw, C, H, OW, N]. Here each (channel, row) of the
input, N x W values, is gathered once into a small [W, N] block in L1 and every kernel column's
run of N values is written from it, zero in the W padding: one pass over the columns, no padded
copy. Each output element is a copy, so results do not depend on how the channels are cut.
"""
from __future__ import annotations

import numba as nb  # this module is imported only when a compiled kernel first runs
import numpy as np

from . import par
from .bias_clamp import ohwn_to_nchw, ohwn_to_nchw_bias_add_clamp, ohwn_to_nchw_bias_clamp

_OPTS = dict(nogil=True, cache=True, boundscheck=False)


@nb.njit(**_OPTS)
def row_tap_columns_range(x, cols, left, sw, dw, c0, c1):
    """cols[j, c, h, ow, n] = x[n, c, h, ow*sw + j*dw - left] (0 outside the row) for channels
    [c0, c1); x [N, C, H, W], cols [kw, C, H, OW, N]."""
    n_, _, h_, w_ = x.shape
    kw, ow_ = cols.shape[0], cols.shape[3]
    buf = np.empty((w_, n_), x.dtype)
    for c in range(c0, c1):
        for h in range(h_):
            for n in range(n_):
                for w in range(w_):
                    buf[w, n] = x[n, c, h, w]
            for j in range(kw):
                for o in range(ow_):
                    iw = o * sw + j * dw - left
                    dst = cols[j, c, h, o]
                    if 0 <= iw < w_:
                        src = buf[iw]
                        for n in range(n_):
                            dst[n] = src[n]
                    else:
                        for n in range(n_):
                            dst[n] = 0


@nb.njit(**_OPTS)
def nchw_to_chwn_range(x, y, c0, c1):
    """y[c, h, w, n] = x[n, c, h, w] for channels [c0, c1): the batch innermost."""
    n_, _, h_, w_ = x.shape
    for c in range(c0, c1):
        for h in range(h_):
            for n in range(n_):
                for w in range(w_):
                    y[c, h, w, n] = x[n, c, h, w]


@nb.njit(**_OPTS)
def sum_parts_range(partial, row_of, rows, lo, hi):
    """rows[row_of[t], o] += partial[t, o] for every t in order, for o in [lo, hi) (rows zeroed by the
    caller): a filter gradient's parts summed per kernel row, each element in the order of t."""
    for t in range(partial.shape[0]):
        i = row_of[t]
        for o in range(lo, hi):
            src, dst = partial[t, o], rows[i, o]
            for j in range(src.shape[0]):
                dst[j] += src[j]


# conv_rows' finish (jit.bias_clamp's [O, rows, OW, N] -> NCHW passes) over output-row blocks
# [b0, b1) of acc4 [O, OH, OW, N], block r being rows [bounds[r], bounds[r+1])
@nb.njit(**_OPTS)
def finish_range(acc4, y, bounds, b0, b1):
    for r in range(b0, b1):
        ohwn_to_nchw(acc4[:, bounds[r]:bounds[r + 1]], y, bounds[r])


@nb.njit(**_OPTS)
def finish_bias_clamp_range(acc4, bias, lo, hi, y, bounds, b0, b1):
    for r in range(b0, b1):
        ohwn_to_nchw_bias_clamp(acc4[:, bounds[r]:bounds[r + 1]], bias, lo, hi, y, bounds[r])


@nb.njit(**_OPTS)
def finish_bias_add_clamp_range(acc4, bias, addend, lo, hi, y, bounds, b0, b1):
    for r in range(b0, b1):
        ohwn_to_nchw_bias_add_clamp(acc4[:, bounds[r]:bounds[r + 1]], bias, addend, lo, hi, y, bounds[r])


# the prange drivers (jit.par.register): kernel(*args, lo, hi) over prange(blocks)
@nb.njit(**par.PAR_OPTS)
def _row_tap_columns_par(blocks, total, x, cols, left, sw, dw):
    for b in nb.prange(blocks):
        row_tap_columns_range(x, cols, left, sw, dw, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _nchw_to_chwn_par(blocks, total, x, y):
    for b in nb.prange(blocks):
        nchw_to_chwn_range(x, y, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _sum_parts_par(blocks, total, partial, row_of, rows):
    for b in nb.prange(blocks):
        sum_parts_range(partial, row_of, rows, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _finish_par(blocks, total, acc4, y, bounds):
    for b in nb.prange(blocks):
        finish_range(acc4, y, bounds, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _finish_bias_clamp_par(blocks, total, acc4, bias, lo, hi, y, bounds):
    for b in nb.prange(blocks):
        finish_bias_clamp_range(acc4, bias, lo, hi, y, bounds, total * b // blocks, total * (b + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _finish_bias_add_clamp_par(blocks, total, acc4, bias, addend, lo, hi, y, bounds):
    for b in nb.prange(blocks):
        finish_bias_add_clamp_range(acc4, bias, addend, lo, hi, y, bounds, total * b // blocks,
                                    total * (b + 1) // blocks)


for _k, _d in ((row_tap_columns_range, _row_tap_columns_par), (nchw_to_chwn_range, _nchw_to_chwn_par),
               (sum_parts_range, _sum_parts_par), (finish_range, _finish_par),
               (finish_bias_clamp_range, _finish_bias_clamp_par),
               (finish_bias_add_clamp_range, _finish_bias_add_clamp_par)):
    par.register(_k, _d)


__all__ = ["row_tap_columns_range", "nchw_to_chwn_range", "sum_parts_range", "finish_range", "finish_bias_clamp_range",
           "finish_bias_add_clamp_range"]
