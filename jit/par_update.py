"""Optimizer updates as compiled range kernels (core/ops/training.py runs them over element ranges,
split by jit.par's prange drivers): var -= a * x as BLAS's own axpy (numpy's OpenBLAS, passed in as a
ctypes function), over ranges cut at multiples of CHUNK elements.

BLAS's axpy runs twice as fast here as a plain compiled loop (which LLVM does not vectorize for
arrays that may alias: 3.2M floats 1.0 ms against 1.9). Its vector body and its scalar tail may
round differently, so ranges start at multiples of CHUNK: every element is computed by the same
instructions wherever the whole range is cut, and as one axpy over the whole array computes it.
"""
from __future__ import annotations

import numba as nb  # this module is imported only when a compiled kernel first runs

from . import par

CHUNK = 256  # elements per unit of range: a multiple of any vector body's width


@nb.njit(nogil=True, cache=True, boundscheck=False)
def axpy_range(axpy, var, x, a, lo, hi):
    """var[i] += a * x[i] for the elements of units [lo, hi) (unit u: [u*CHUNK, (u+1)*CHUNK) clipped
    to the array), var and x contiguous 1-D arrays of one dtype."""
    i0, i1 = lo * CHUNK, min(hi * CHUNK, var.shape[0])
    if i1 > i0:
        isz = var.itemsize
        axpy(i1 - i0, a, x.ctypes.data + i0 * isz, 1, var.ctypes.data + i0 * isz, 1)


@nb.njit(**par.PAR_OPTS)
def _axpy_par(blocks, total, axpy, var, x, a):  # the prange driver (jit.par.register)
    for b in nb.prange(blocks):
        axpy_range(axpy, var, x, a, total * b // blocks, total * (b + 1) // blocks)


par.register(axpy_range, _axpy_par)


def units(n: int) -> int:
    """The units of CHUNK elements an array of n elements has (the `total` of a split)."""
    return -(-n // CHUNK)


__all__ = ["CHUNK", "axpy_range", "units"]
