"""core/gpu_kernels/blas.py: cuBLAS's column-major strided-batched GEMM. `emulate` (the stand-in's
path) against matrices read element by element from their column-major definition; on a real GPU
(`pytest -m gpu`) cuBLAS against `emulate`, the same arguments."""
import itertools

import numpy as np
import pytest

from isthmus.core import gpu
from isthmus.core.gpu_kernels import blas


def _colmajor(flat, off, rows, cols, ld):
    """Element (r, c) of a column-major matrix is flat[off + r + c * ld]."""
    return np.array([[flat[off + r + c * ld] for c in range(cols)] for r in range(rows)], np.float64)


CASES = [(ta, tb, m, n, k, batch, sb0)
         for (ta, tb), (m, n, k), batch, sb0 in itertools.product(
             [(blas.N, blas.N), (blas.N, blas.T), (blas.T, blas.N), (blas.T, blas.T)],
             [(3, 4, 5), (1, 7, 2)], [1, 3], [False, True])]


def _args(ta, tb, m, n, k, batch, sb0, rng):
    ar, ac = (m, k) if ta == blas.N else (k, m)
    br, bc = (k, n) if tb == blas.N else (n, k)
    lda, ldb, ldc = ar + 1, br + 2, m + 1  # padded leading dimensions
    sa, sb, sc = lda * ac + 3, (0 if sb0 else ldb * bc + 1), ldc * n + 2
    a = rng.standard_normal(sa * (batch - 1) + lda * ac).astype(np.float32)
    b = rng.standard_normal(sb * (batch - 1) + ldb * bc).astype(np.float32)
    c = np.full(sc * (batch - 1) + ldc * n, 7.0, np.float32)
    return (ar, ac, br, bc), (a, lda, sa, b, ldb, sb, c, ldc, sc)


@pytest.mark.parametrize("ta,tb,m,n,k,batch,sb0", CASES)
def test_emulate_is_the_column_major_product(ta, tb, m, n, k, batch, sb0):
    rng = np.random.default_rng(0)
    (ar, ac, br, bc), (a, lda, sa, b, ldb, sb, c, ldc, sc) = _args(ta, tb, m, n, k, batch, sb0, rng)
    blas.emulate(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch)
    touched = np.zeros(c.size, bool)
    for i in range(batch):
        A = _colmajor(a, i * sa, ar, ac, lda)
        B = _colmajor(b, i * sb, br, bc, ldb)
        want = (A if ta == blas.N else A.T) @ (B if tb == blas.N else B.T)
        np.testing.assert_allclose(_colmajor(c, i * sc, m, n, ldc), want, rtol=1e-5, atol=1e-5)
        for col in range(n):
            touched[i * sc + col * ldc: i * sc + col * ldc + m] = True
    assert (c[~touched] == 7.0).all()  # the padding between columns and matrices is left alone


def test_emulate_refuses_matrices_that_overrun_their_array():
    a = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="does not fit"):
        blas.emulate(blas.N, blas.N, 3, 3, 3, a, 3, 9, a, 3, 0, a, 3, 0, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu.gpu_available(), reason=f"no GPU: {gpu.unavailable_reason()}")
@pytest.mark.parametrize("ta,tb,m,n,k,batch,sb0", CASES)
def test_cublas_matches_emulate(ta, tb, m, n, k, batch, sb0):
    cp = gpu.array_module("GPU")
    rng = np.random.default_rng(1)
    _, (a, lda, sa, b, ldb, sb, c, ldc, sc) = _args(ta, tb, m, n, k, batch, sb0, rng)
    dc = cp.asarray(c)
    blas.gemm_batched(cp, ta, tb, m, n, k, cp.asarray(a), lda, sa, cp.asarray(b), ldb, sb, dc, ldc, sc, batch)
    blas.emulate(ta, tb, m, n, k, a, lda, sa, b, ldb, sb, c, ldc, sc, batch)
    np.testing.assert_allclose(dc.get(), c, rtol=1e-5, atol=1e-5)
