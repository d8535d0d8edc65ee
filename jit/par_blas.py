"""GEMMs inside compiled code: BLAS's sgemm (numpy's own OpenBLAS, bound with ctypes by
core/ops/numpy_blas and passed in as the first argument) called from numba, so that jit.par's prange
drivers can split a product or a convolution's row blocks in one parallel call instead of a
thread-pool hand-off.

numba takes a ctypes function as an argument (its address is read at each call, so these kernels
and their drivers are cached on disk like the others). BLAS must run one-threaded inside them (the
caller holds it: intra_op.par_rows(blas_inside=True)). Operands are float32 2-D views with a unit
stride on one axis (a transposed view goes to BLAS flagged, as it lies: blasable); the output has
a unit inner stride.
"""
from __future__ import annotations

import numba as nb  # this module is imported only when a compiled kernel first runs
import numpy as np

from . import par
from .bias_clamp import bias_add_clamp_rows, bias_clamp_rows

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_OPTS = dict(nogil=True, cache=True, boundscheck=False)


def blasable(a) -> bool:
    """Whether `a` (2-D float32) has a unit stride on one axis and a leading dimension BLAS accepts."""
    if a.ndim != 2 or a.dtype.itemsize != 4 or any(st % 4 for st in a.strides):
        return False
    s0, s1 = a.strides[0] // 4, a.strides[1] // 4
    if s1 == 1 or a.shape[1] <= 1:
        return a.shape[0] <= 1 or s0 >= max(1, a.shape[1])
    return (s0 == 1 or a.shape[0] <= 1) and s1 >= max(1, a.shape[0])


@nb.njit(**_OPTS)
def _layout(a):
    """(BLAS transpose flag, leading dimension) of a view blasable() accepts."""
    if a.strides[1] == 4 or a.shape[1] <= 1:
        return _NO_TRANS, max(1, a.strides[0] // 4, a.shape[1])
    return _TRANS, max(1, a.strides[1] // 4, a.shape[0])


@nb.njit(**_OPTS)
def gemm(sgemm, a, b, c, beta):
    """c = a @ b + beta * c (beta 0: c is only written)."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return
    if k == 0:
        if beta == 0:
            c[...] = 0
        return
    ta, lda = _layout(a)
    tb, ldb = _layout(b)
    sgemm(_ROW_MAJOR, ta, tb, m, n, k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb, beta,
          c.ctypes.data, c.strides[0] // 4)


@nb.njit(**_OPTS)
def gemm_cols_range(sgemm, a, b, c, beta, lo, hi):
    """c[:, lo:hi] = a @ b[:, lo:hi] (+ beta * c[:, lo:hi])."""
    gemm(sgemm, a, b[:, lo:hi], c[:, lo:hi], beta)


@nb.njit(**_OPTS)
def gemm_rows_range(sgemm, a, b, c, beta, lo, hi):
    """c[lo:hi] = a[lo:hi] @ b (+ beta * c[lo:hi])."""
    gemm(sgemm, a[lo:hi], b, c[lo:hi], beta)


@nb.njit(**_OPTS)
def row_taps_range(sgemm, wt, cols, acc, plan, run, bounds, zero, b0, b1):
    """conv_rows' GEMMs for output-row blocks [b0, b1): plan rows (kernel row i, first output row lo,
    end hi, first input row src, beta) in order; block r gets, of each kernel row, the output rows of
    [bounds[r], bounds[r+1]) it reaches, acc[:, rows] (+)= wt[i] @ cols[:, input rows]. zero: the
    block's rows of acc are zeroed first (no kernel row covers every output row)."""
    for r in range(b0, b1):
        r0, r1 = bounds[r], bounds[r + 1]
        if zero:
            acc[:, r0 * run:r1 * run] = 0
        for p in range(plan.shape[0]):
            i, lo, hi, src, beta = plan[p, 0], plan[p, 1], plan[p, 2], plan[p, 3], plan[p, 4]
            lo2, hi2 = max(lo, r0), min(hi, r1)
            if hi2 > lo2:
                s = src + lo2 - lo
                gemm(sgemm, wt[i], cols[:, s * run:(s + hi2 - lo2) * run], acc[:, lo2 * run:hi2 * run], float(beta))


@nb.njit(**_OPTS)
def stacked_rows_range(sgemm, wst, cols, acc, h, kh, dh, top, run, bounds, b0, b1):
    """conv_rows' stacked form (core/ops/conv_rows._input_row_products) for output-row blocks
    [b0, b1): per input row one GEMM over every kernel row that carries it into the block (wst
    [kh*O, kw*C]), each part written (its output row's first kernel row) or added into acc's row in
    increasing kernel-row order; rows no kernel row reaches are zeroed."""
    o = wst.shape[0] // kh
    buf = np.empty((kh * o, run), np.float32)
    for r in range(b0, b1):
        a, b = bounds[r], bounds[r + 1]
        for oh in range(a, b):
            reached = False
            for i in range(kh):
                if 0 <= oh + i * dh - top < h:
                    reached = True
            if not reached:
                acc[:, oh * run:(oh + 1) * run] = 0
        for hh in range(max(0, a - top), min(h, b - top + (kh - 1) * dh)):
            i0, i1 = -1, -1
            for i in range(kh):
                if a <= hh + top - i * dh < b:
                    if i0 < 0:
                        i0 = i
                    i1 = i
            if i0 < 0:
                continue
            big = buf[:(i1 + 1 - i0) * o]
            gemm(sgemm, wst[i0 * o:(i1 + 1) * o], cols[:, hh * run:(hh + 1) * run], big, 0.0)
            for i in range(i0, i1 + 1):
                oh = hh + top - i * dh
                first = 0
                while not (0 <= oh + first * dh - top < h):
                    first += 1
                dst, part = acc[:, oh * run:(oh + 1) * run], big[(i - i0) * o:(i - i0 + 1) * o]
                if i == first:
                    dst[...] = part
                else:
                    for q in range(o):
                        for c in range(run):
                            dst[q, c] += part[q, c]


@nb.njit(**_OPTS)
def filter_tasks_range(sgemm, dyt, cols, partial, tasks, t0, t1):
    """A row-tap filter gradient's products: for task t, (kernel row, first dy column d0, first cols
    column c0, columns k) in tasks[t], partial[t] = dyt[:, d0:d0+k] @ cols[:, c0:c0+k]^T."""
    for t in range(t0, t1):
        d0, c0, k = tasks[t, 1], tasks[t, 2], tasks[t, 3]
        gemm(sgemm, dyt[:, d0:d0 + k], cols[:, c0:c0 + k].T, partial[t], 0.0)


@nb.njit(**_OPTS)
def pointwise_blas_range(sgemm, w2, xs, out, bias, r, lo, hi, i0, i1):
    """A batch's 1x1 convolutions on BLAS, images i0 <= i < i1: out[i] = W [O, C] @ xs[i] [C, P], then
    bias, addend (r [N, O, P], or [0, 0, 0] for none) and clamp in one pass over out[i]: per image the
    sgemm call and the finish core.ops.conv_pointwise's numpy path makes, so the same bytes."""
    for i in range(i0, i1):
        gemm(sgemm, w2, xs[i], out[i], 0.0)
        if r.shape[0] > 0:
            bias_add_clamp_rows(out[i], bias, r[i], lo, hi)
        else:
            bias_clamp_rows(out[i], bias, lo, hi)


# the prange drivers (jit.par.register)
@nb.njit(**par.PAR_OPTS)
def _gemm_cols_par(blocks, total, sgemm, a, b, c, beta):
    for q in nb.prange(blocks):
        gemm_cols_range(sgemm, a, b, c, beta, total * q // blocks, total * (q + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _gemm_rows_par(blocks, total, sgemm, a, b, c, beta):
    for q in nb.prange(blocks):
        gemm_rows_range(sgemm, a, b, c, beta, total * q // blocks, total * (q + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _row_taps_par(blocks, total, sgemm, wt, cols, acc, plan, run, bounds, zero):
    for q in nb.prange(blocks):
        row_taps_range(sgemm, wt, cols, acc, plan, run, bounds, zero, total * q // blocks, total * (q + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _filter_tasks_par(blocks, total, sgemm, dyt, cols, partial, tasks):
    for q in nb.prange(blocks):
        filter_tasks_range(sgemm, dyt, cols, partial, tasks, total * q // blocks, total * (q + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _stacked_rows_par(blocks, total, sgemm, wst, cols, acc, h, kh, dh, top, run, bounds):
    for q in nb.prange(blocks):
        stacked_rows_range(sgemm, wst, cols, acc, h, kh, dh, top, run, bounds, total * q // blocks,
                           total * (q + 1) // blocks)


@nb.njit(**par.PAR_OPTS)
def _pointwise_blas_par(blocks, total, sgemm, w2, xs, out, bias, r, lo, hi):
    for q in nb.prange(blocks):
        pointwise_blas_range(sgemm, w2, xs, out, bias, r, lo, hi, total * q // blocks, total * (q + 1) // blocks)


for _k, _d in ((gemm_cols_range, _gemm_cols_par), (stacked_rows_range, _stacked_rows_par), (gemm_rows_range, _gemm_rows_par),
               (row_taps_range, _row_taps_par), (filter_tasks_range, _filter_tasks_par),
               (pointwise_blas_range, _pointwise_blas_par)):
    par.register(_k, _d)

__all__ = ["blasable", "gemm", "gemm_cols_range", "gemm_rows_range", "row_taps_range", "filter_tasks_range",
           "stacked_rows_range", "pointwise_blas_range"]
