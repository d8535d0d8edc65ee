"""GEMMs inside compiled code: BLAS's sgemm (numpy's own OpenBLAS, bound with ctypes by
core/ops/numpy_blas and handed in) called from numba, so that jit.par's prange drivers can split a
product or a convolution's row blocks in one parallel call instead of a thread-pool hand-off.

numba calls a ctypes function directly (its address is compiled in), so these kernels are made per
process by kernels(gemm) and not cached on disk (about a second of compile at first use). BLAS
must run one-threaded inside them (the caller holds it: intra_op.par_rows(blas_inside=True)).
Operands are float32 2-D views with a unit inner stride; leading dimensions come from the strides.
"""
from __future__ import annotations

import threading

import numba as nb  # this module is imported only when a compiled kernel first runs

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_lock = threading.Lock()
_made: dict = {}  # id of the ctypes sgemm -> (the function, its kernels)


class Kernels:
    """The compiled range kernels bound to one sgemm."""

    def __init__(self, cols, rows, taps, tasks):
        self.gemm_cols_range, self.gemm_rows_range, self.row_taps_range = cols, rows, taps
        self.filter_tasks_range = tasks


@nb.njit(nogil=True, cache=True)
def _layout(a):
    """(BLAS transpose flag, leading dimension) of a float32 2-D view with a unit stride on one axis
    (a transposed view goes to BLAS as it lies, flagged; blasable() checks before any call)."""
    if a.strides[1] == 4 or a.shape[1] <= 1:
        return _NO_TRANS, max(1, a.strides[0] // 4, a.shape[1])
    return _TRANS, max(1, a.strides[1] // 4, a.shape[0])


def blasable(a) -> bool:
    """Whether `a` (2-D float32) has a unit stride on one axis and a leading dimension BLAS accepts."""
    if a.ndim != 2 or a.dtype.itemsize != 4 or any(st % 4 for st in a.strides):
        return False
    s0, s1 = a.strides[0] // 4, a.strides[1] // 4
    if s1 == 1 or a.shape[1] <= 1:
        return a.shape[0] <= 1 or s0 >= max(1, a.shape[1])
    return (s0 == 1 or a.shape[0] <= 1) and s1 >= max(1, a.shape[0])


def kernels(sgemm) -> Kernels:
    """The range kernels for `sgemm` (a ctypes cblas_sgemm with argtypes set), made once per function."""
    got = _made.get(id(sgemm))
    if got is None or got[0] is not sgemm:
        with _lock:
            got = _made.get(id(sgemm))
            if got is None or got[0] is not sgemm:
                got = _made[id(sgemm)] = (sgemm, _make(sgemm))
    return got[1]


def _make(sgemm) -> Kernels:
    @nb.njit(nogil=True, boundscheck=False)
    def gemm(a, b, c, beta):
        # c = a @ b + beta * c (beta 0: c is only written); empty products are the caller's to skip
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

    @nb.njit(nogil=True, boundscheck=False)
    def gemm_cols_range(a, b, c, beta, lo, hi):
        """c[:, lo:hi] = a @ b[:, lo:hi] (+ beta * c[:, lo:hi])."""
        gemm(a, b[:, lo:hi], c[:, lo:hi], beta)

    @nb.njit(nogil=True, boundscheck=False)
    def gemm_rows_range(a, b, c, beta, lo, hi):
        """c[lo:hi] = a[lo:hi] @ b (+ beta * c[lo:hi])."""
        gemm(a[lo:hi], b, c[lo:hi], beta)

    @nb.njit(nogil=True, boundscheck=False)
    def row_taps_range(wt, cols, acc, plan, run, bounds, zero, b0, b1):
        """conv_rows' GEMMs for output-row blocks [b0, b1): plan rows (kernel row i, first output row
        lo, end hi, first input row src, beta) in order; block r gets, of each kernel row, the output
        rows of [bounds[r], bounds[r+1]) it reaches, acc[:, rows] (+)= wt[i] @ cols[:, input rows].
        zero: the block's rows of acc are zeroed first (no kernel row covers every output row)."""
        for r in range(b0, b1):
            r0, r1 = bounds[r], bounds[r + 1]
            if zero:
                acc[:, r0 * run:r1 * run] = 0
            for p in range(plan.shape[0]):
                i, lo, hi, src, beta = plan[p, 0], plan[p, 1], plan[p, 2], plan[p, 3], plan[p, 4]
                lo2, hi2 = max(lo, r0), min(hi, r1)
                if hi2 > lo2:
                    s = src + lo2 - lo
                    gemm(wt[i], cols[:, s * run:(s + hi2 - lo2) * run], acc[:, lo2 * run:hi2 * run], float(beta))
    @nb.njit(nogil=True, boundscheck=False)
    def filter_tasks_range(dyt, cols, partial, tasks, t0, t1):
        """A row-tap filter gradient's products: for task t, (kernel row, first dy column d0, first cols
        column c0, columns k) in tasks[t], partial[t] = dyt[:, d0:d0+k] @ cols[:, c0:c0+k]^T."""
        for t in range(t0, t1):
            d0, c0, k = tasks[t, 1], tasks[t, 2], tasks[t, 3]
            dst = partial[t]
            m, n = dst.shape
            if k == 0:
                dst[...] = 0
                continue
            a, b = dyt[:, d0:d0 + k], cols[:, c0:c0 + k]
            sgemm(_ROW_MAJOR, _NO_TRANS, _TRANS, m, n, k, 1.0, a.ctypes.data, a.strides[0] // 4,
                  b.ctypes.data, b.strides[0] // 4, 0.0, dst.ctypes.data, dst.strides[0] // 4)
    return Kernels(gemm_cols_range, gemm_rows_range, row_taps_range, filter_tasks_range)


__all__ = ["Kernels", "kernels", "blasable"]
