"""Direct calls into the BLAS numpy itself links: C (+)= A @ B into strided views (cblas ?gemm with
beta 0 or 1) and y += a*x in one pass (cblas ?axpy).

numpy's matmul has no beta: accumulating a product into an existing array costs a temporary and an
add pass over the output. A convolution's row taps add kh products into one output (the CNN's second
layer: 5 products of [64, 160] @ [160, ~11000] into a 3 MB output), and the temporaries and adds were
a tenth of its time and most of what two threads did not speed up. cblas_sgemm with beta=1 adds
inside the GEMM's own tile updates. Operands are any 2-D views with a unit inner stride (leading
dimensions are passed), so column ranges of larger arrays need no copy.

axpy: an SGD update, var -= lr * grad, is two numpy passes through a temporary (a multiply, then a
subtract: 5 arrays' worth of memory traffic); axpy reads var and grad once and writes var once.

The library is numpy's own (the same handle, so core.threads' limits on its thread count hold; scipy's
BLAS would be a second thread pool), found from numpy's build record; where it cannot be found or
fails a self-check, accumulate() falls back to matmul and an add and axpy() reports False (the caller
then runs numpy's passes).
"""
from __future__ import annotations

import ctypes
import glob
import os
import threading

import numpy as np

_lock = threading.Lock()
_bound: list = []  # [] not yet tried; [None] unavailable; [{(name, dtype): ctypes function}]

_ROW_MAJOR, _NO_TRANS = 101, 111


def _numpy_blas():
    """numpy's OpenBLAS as a ctypes library and its symbol affixes, or None (another BLAS, no wheel layout)."""
    try:
        info = np.__config__.CONFIG["Build Dependencies"]["blas"]
    except (AttributeError, KeyError, TypeError):
        return None
    if info.get("name") != "scipy-openblas":
        return None
    ilp64 = "USE64BITINT" in str(info.get("openblas configuration", ""))
    libdir = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
    paths = sorted(glob.glob(os.path.join(libdir, "libscipy_openblas64_*.so*" if ilp64 else "libscipy_openblas*.so*")))
    if len(paths) != 1:
        return None
    try:
        lib = ctypes.CDLL(paths[0])
    except OSError:
        return None
    return lib, ("scipy_", "64_" if ilp64 else ""), ctypes.c_int64 if ilp64 else ctypes.c_int32


def _bind():
    found = _numpy_blas()
    if found is None:
        return None
    lib, (pre, suf), integer = found
    table = {}
    i, p = integer, ctypes.c_void_p
    for dtype, letter, scalar in ((np.float32, "s", ctypes.c_float), (np.float64, "d", ctypes.c_double)):
        for name, args in (("gemm", [i, i, i, i, i, i, scalar, p, i, p, i, scalar, p, i]),
                           ("axpy", [i, scalar, p, i, p, i])):
            fn = getattr(lib, f"{pre}cblas_{letter}{name}{suf}", None)
            if fn is None:
                return None
            fn.argtypes, fn.restype = args, None
            table[(name, np.dtype(dtype))] = fn
    return table if _self_check(table) else None


def _self_check(table) -> bool:
    """The bound functions compute what matmul computes on a small strided case (beta 0 and 1)."""
    rng = np.random.default_rng(0)
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        a = rng.standard_normal((3, 9)).astype(dtype)[:, 2:7]
        b = rng.standard_normal((5, 8)).astype(dtype)[:, 1:5]
        c = np.ones((3, 6), dtype)
        gemm = table[("gemm", dtype)]
        _call(gemm, a, b, c[:, 1:5], 1.0)
        want = 1.0 + a.astype(np.float64) @ b
        if not np.allclose(c[:, 1:5], want, rtol=1e-5, atol=1e-5) or not np.all(c[:, [0, 5]] == 1):
            return False
        _call(gemm, a, b, c[:, 1:5], 0.0)
        if not np.allclose(c[:, 1:5], want - 1.0, rtol=1e-5, atol=1e-5):
            return False
        x, y = rng.standard_normal(7).astype(dtype), np.ones(7, dtype)
        table[("axpy", dtype)](7, -0.5, x.ctypes.data, 1, y.ctypes.data, 1)
        if not np.allclose(y, 1.0 - 0.5 * x.astype(np.float64), rtol=1e-6, atol=1e-6):
            return False
    return True


def _call(fn, a, b, c, beta: float) -> None:
    m, k = a.shape
    n = b.shape[1]
    isz = a.itemsize
    fn(_ROW_MAJOR, _NO_TRANS, _NO_TRANS, m, n, k, 1.0, a.ctypes.data, a.strides[0] // isz,
       b.ctypes.data, b.strides[0] // isz, beta, c.ctypes.data, c.strides[0] // isz)


def _table():
    if not _bound:
        with _lock:
            if not _bound:
                _bound.append(_bind())
    return _bound[0]


def _blasable(x, isz) -> bool:
    return x.ndim == 2 and x.strides[1] == isz and x.strides[0] % isz == 0 and x.strides[0] >= max(1, x.shape[1]) * isz


def accumulate(a, b, c, add: bool) -> None:
    """c += a @ b (add) or c = a @ b, in place; a [M, K], b [K, N], c [M, N] numpy arrays of one
    float dtype. Views with a unit inner stride go to BLAS as they lie; anything else through matmul."""
    table = _table()
    fn = None if table is None else table.get(("gemm", c.dtype))
    if (fn is not None and a.dtype == b.dtype == c.dtype and a.shape[0] and b.shape[1] and a.shape[1]
            and _blasable(a, c.itemsize) and _blasable(b, c.itemsize) and _blasable(c, c.itemsize)):
        _call(fn, a, b, c, 1.0 if add else 0.0)
        return
    if add:
        c += np.matmul(a, b)
    else:
        np.matmul(a, b, out=c)


def axpy(a: float, x, y) -> bool:
    """y += a * x in place, one pass, for C-contiguous numpy arrays of one float dtype and size; False
    (nothing done) where BLAS is not reached or the arrays do not qualify."""
    table = _table()
    fn = None if table is None else table.get(("axpy", y.dtype))
    if (fn is None or x.dtype != y.dtype or x.size != y.size or not x.flags.c_contiguous
            or not y.flags.c_contiguous or not y.flags.writeable):
        return False
    if y.size:
        fn(y.size, a, x.ctypes.data, 1, y.ctypes.data, 1)
    return True


def sgemm():
    """The bound cblas_sgemm (a ctypes function, argtypes set: jit.par_blas calls it from compiled
    code), or None where BLAS is not reached directly."""
    return function("gemm", np.float32)


def function(name: str, dtype):
    """The bound cblas ?gemm or ?axpy (name "gemm" or "axpy") for float32/float64 as a ctypes
    function with argtypes set (compiled code may call it), or None where BLAS is not reached."""
    table = _table()
    return None if table is None else table.get((name, np.dtype(dtype)))


def available() -> bool:
    """Whether accumulate() and axpy() reach BLAS directly (else matmul and an add, numpy's passes)."""
    return _table() is not None


__all__ = ["accumulate", "axpy", "available", "sgemm", "function"]
