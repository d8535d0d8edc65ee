"""Softmax and layer normalization over the last axis of a float32 matrix, one compiled loop per row.

numpy runs each as five to nine passes, with reductions along a short axis: at a transformer's
batch-1 sizes (softmax over [128, 32] attention rows, layer norm over [32, 64]) the calls, not the
arithmetic, are the node's time. Here a row is read once into registers and cache and written once;
exp is fastexp's vectorized one, and the row statistics accumulate in float64.
"""
from __future__ import annotations

import math

import numba as nb  # imported only when a compiled kernel is first bound
import numpy as np

from .fastexp import FAST, exp_scaled

# the row sums may be reassociated (vectorized): float64 accumulators over rows of tens to
# thousands keep the difference from numpy's pairwise float32 sums far below float32's rounding
_ROWS = dict(FAST, fastmath={"contract", "reassoc"})


@nb.njit(**_ROWS)
def softmax_rows(x, out):
    """out[r] = exp(x[r] - max x[r]) / sum(...), x and out [R, L] float32 C-contiguous. A row of
    -inf gives NaN, as numpy's (-inf - -inf); NaN anywhere in a row makes the row NaN."""
    rows, n = x.shape
    for r in range(rows):
        xr, o = x[r], out[r]
        m = xr[0]
        for j in range(1, n):
            v = xr[j]
            m = v if v > m or v != v else m  # NaN wins, as numpy's maximum
        for j in range(n):
            o[j] = xr[j] - m
    flat = out.reshape(-1)
    exp_scaled(flat, 0, flat.size, np.float32(1.0), np.empty(flat.size, np.int32))  # one vectorized pass
    for r in range(rows):
        o = out[r]
        s = 0.0
        for j in range(n):
            s += o[j]
        inv = np.float32(1.0 / s)
        for j in range(n):
            o[j] *= inv


@nb.njit(**_ROWS)
def layer_norm_rows(x, gamma, beta, eps, out):
    """out[r] = (x[r] - mean) / sqrt(var + eps) * gamma + beta, x and out [R, L] float32, gamma and
    beta [L]; mean and (two-pass) variance in float64."""
    rows, n = x.shape
    for r in range(rows):
        xr, o = x[r], out[r]
        s = 0.0
        for j in range(n):
            s += xr[j]
        mean = s / n
        q = 0.0
        for j in range(n):
            d = xr[j] - mean
            q += d * d
        inv = 1.0 / math.sqrt(q / n + eps)
        mf, invf = np.float32(mean), np.float32(inv)
        for j in range(n):
            o[j] = (xr[j] - mf) * invf * gamma[j] + beta[j]
