"""Strided-batched float32 GEMM straight through cuBLAS (cupy_backends.cuda.libs.cublas), for the
1x1 convolutions' per-image products. cupy.matmul's broadcasting path cost about 100 us of host time
a call on the H100 machine (MobileNetV2 b32 makes 41 such products a step, and 20 weight gradients
through tensordot at about 80 us), where the direct call takes a few.

Arguments are cuBLAS's own, column-major: C_i = op(A_i) @ op(B_i) for i < batch, each matrix at
offset i * stride (in elements) of its contiguous float32 array, with leading dimension ld. On the
CI stand-in GPU the same arguments run through numpy (`emulate`), so the column-major mapping of
every caller is checked by the stand-in's convolution tests.
"""
from __future__ import annotations

import numpy as np

N, T = 0, 1  # cublasOperation_t: as is, transposed
_ONE = np.ones(1, np.float32)
_ZERO = np.zeros(1, np.float32)


def gemm_batched(xp, transa: int, transb: int, m: int, n: int, k: int, a, lda: int, stride_a: int,
                 b, ldb: int, stride_b: int, c, ldc: int, stride_c: int, batch: int) -> None:
    """c's matrices = op(a's) @ op(b's); alpha 1, beta 0 (a stride of 0 repeats one matrix)."""
    if not hasattr(xp, "RawModule"):
        emulate(transa, transb, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch)
        return
    from cupy.cuda import device  # deferred: cupy
    from cupy_backends.cuda.libs import cublas  # deferred: cupy
    handle = device.get_cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)  # alpha and beta below are host values
    cublas.sgemmStridedBatched(handle, transa, transb, m, n, k, _ONE.ctypes.data, a.data.ptr, lda, stride_a,
                               b.data.ptr, ldb, stride_b, _ZERO.ctypes.data, c.data.ptr, ldc, stride_c, batch)


def _matrices(flat: np.ndarray, op: int, rows: int, cols: int, ld: int, stride: int, batch: int) -> np.ndarray:
    """op(X_i) for every i: the column-major rows x cols (before op) matrices of `flat` as one view."""
    r, c = (rows, cols) if op == N else (cols, rows)
    need = (batch - 1) * stride + (c - 1) * ld + r
    if r and c and batch and (need > flat.size or ld < r):
        raise ValueError(f"a {r}x{c} matrix with ld {ld} and stride {stride} x {batch} does not fit {flat.size} elements")
    s = flat.itemsize
    v = np.lib.stride_tricks.as_strided(flat, (batch, r, c), (stride * s, s, ld * s))
    return v if op == N else v.transpose(0, 2, 1)


def emulate(transa, transb, m, n, k, a, lda, stride_a, b, ldb, stride_b, c, ldc, stride_c, batch) -> None:
    """gemm_batched in numpy, on the arrays' buffers (the stand-in's arrays are ndarray subclasses)."""
    if not all(x.flags.c_contiguous for x in (a, b, c)):
        raise ValueError("gemm_batched takes contiguous arrays")
    flat = [np.asarray(x).view(np.ndarray).reshape(-1) for x in (a, b, c)]
    A = _matrices(flat[0], transa, m, k, lda, stride_a, batch)
    B = _matrices(flat[1], transb, k, n, ldb, stride_b, batch)
    C = _matrices(flat[2], N, m, n, ldc, stride_c, batch)
    C[...] = np.matmul(A, B)
