"""Dense layers at small batch: y [M, N] = clamp(x [M, K] @ w [K, N] + bias, lo, hi) on jit.gemm_f32's
register tile, the weights packed once, for core's FusedMatMul with constant weights.

BLAS packs both operands on every call: for an MLP layer at batch 32 (32 x 784 @ 784 x 512) that is
all 400k weights repacked to be used 32 times, and numpy then adds the bias and applies the
activation in two more passes over y. Here the tile's roles are those of jit.rnn.lstm_steps_packed:
the examples are the tile's rows (x packed per call as [ceil(M/4), K + 1, 4], a small copy) and the
weights, packed once as W^T in 16-column panels, stream through it. The bias rides the product as
an extra contraction row (x's row K is 1, the panels' row K is the bias), and the clamp (relu,
relu6) is the tile's epilogue: one pass writes y. A single row (batch 1) is a matrix-vector
product instead (gemv_bias_clamp), on the weights as they are.
"""
from __future__ import annotations

import numba as nb  # imported only when a kernel is first bound
import numpy as np

from .gemm_f32 import MR, NR, _panels, supported
from .gemm_pixels import pack_weights_t

__all__ = ["pack_dense", "pack_rows", "dense_panels", "dense_panels_range", "dense", "dense_pays", "gemv_bias_clamp"]


def pack_dense(w: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """w [K, N] and bias [N] -> [ceil(N/16), K + 1, 16]: W^T's 16-column panels with the bias as row K."""
    k, n = w.shape
    wb = np.empty((n, k + 1), np.float32)
    wb[:, :k] = w.T
    wb[:, k] = bias
    return pack_weights_t(wb)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def pack_rows(x, a):
    """x [M, K] -> a [ceil(M/4), K + 1, 4]: four rows side by side per k, a 1 at k = K (the bias
    row), zeros in the rows past M."""
    m, k = x.shape
    for r in range(a.shape[0] * MR):
        dst, rr = a[r // MR], r % MR
        if r < m:
            src = x[r]
            for i in range(k):
                dst[i, rr] = src[i]
        else:
            for i in range(k):
                dst[i, rr] = 0
        dst[k, rr] = 1


@nb.njit(nogil=True, cache=True, boundscheck=False)
def dense_panels(a, wt, zeros, y, p0, p1, lo, hi):
    """y [4 ceil(M/4), 16 P] columns of panels p0 <= p < p1 = clamp(rows(a) @ panel p, lo, hi): a from
    pack_rows, wt from pack_dense, zeros [4 ceil(M/4)] (the tile's per-row bias: none here)."""
    rows, kk = a.shape[0] * MR, a.shape[1]
    n = y.shape[1]
    af, wtf, yf = a.reshape(a.size), wt.reshape(wt.size), y.reshape(y.size)
    for p in range(p0, p1):
        _panels(af, zeros, wtf, NR, p * kk * NR, yf, n, p * NR, rows, kk, lo, hi, False)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def dense_panels_range(a, wt, zeros, y, lo, hi, p0, p1):
    """dense_panels with its range last (the form jit.par's prange drivers split)."""
    dense_panels(a, wt, zeros, y, p0, p1, lo, hi)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def dense(x, a, wt, zeros, y, lo, hi):
    """pack_rows(x, a), then every panel of dense_panels: one call where the work is not split."""
    pack_rows(x, a)
    dense_panels(a, wt, zeros, y, 0, wt.shape[0], lo, hi)


@nb.njit(nogil=True, cache=True, boundscheck=False, fastmath={"contract"})
def gemv_bias_clamp(x, w, bias, lo, hi, y):
    """One row: y [N] = clamp(x [K] @ w [K, N] + bias, lo, hi), w as it is (row-major, nothing packed),
    four rows of w per pass over y (a quarter of y's loads and stores); the bias and the clamp are
    the first and last passes over y, which stays in L1. Against BLAS's sgemv plus numpy's bias
    and relu passes (one thread): 784 x 512, 512 x 512, 512 x 10 28.8, 20.1, 2.1 us against 30.8,
    24.6, 4.3 warm; 125, 88, 14 against 150, 101, 33 with w evicted to memory."""
    k, n = w.shape
    for j in range(n):
        y[j] = bias[j]
    i = 0
    while i + 4 <= k:
        x0, x1, x2, x3 = x[i], x[i + 1], x[i + 2], x[i + 3]
        w0, w1, w2, w3 = w[i], w[i + 1], w[i + 2], w[i + 3]
        for j in range(n):
            y[j] += x0 * w0[j] + x1 * w1[j] + x2 * w2[j] + x3 * w3[j]
        i += 4
    while i < k:
        xv, wr = x[i], w[i]
        for j in range(n):
            y[j] += xv * wr[j]
        i += 1
    for j in range(n):
        y[j] = min(max(y[j], lo), hi)


def dense_pays(m: int, k: int, n: int) -> bool:
    """Whether the tile beats BLAS plus numpy's bias and activation passes (one thread, this EPYC,
    load 2-3, y = relu(x @ w + b)): 2 to 4 rows 0.3-0.6x BLAS's time (OpenBLAS's small-M product
    packs everything), 32 x 784 x 512 0.83x, 64 x 784 x 512 0.98x, 512 x 64 x 256 0.68x; it loses
    once x's packed rows ([M, K + 1] floats) outgrow the L2 share it reads them from per panel
    (128 x 2048 x 512 1.04x, 512 x 2048 x 512 1.18x), and under 128 columns, where packing x costs
    more than the product gains (32 x 512 x 64 1.1x, x 10 1.8x with the call's overhead). One row:
    a tie (the tile's 4 rows, 3 of them idle), so BLAS keeps it. AVX2 only."""
    return m >= 2 and n >= 128 and m * (k + 1) <= 40_000 and supported()
