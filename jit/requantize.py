"""The short float32 requantization of the edge's int8 kernels in one compiled pass.

edge/quant.UniformRequantizer's short path turns a float32 accumulator into int8 in three numpy
passes (a clamp, an add of 1.5 * 2^23 + zero point that rounds to the integer, a narrowing copy of
the float's low byte); `requantize_rows` does the same arithmetic per element in one loop:
out = int8(int32(min(max(a, lo), hi) + magic) - base), base = 1.5 * 2^23 (the integer part of a
float32 in [2^23, 2^24) is its value, and its low byte the int8 result). The rows may be strided
in the accumulator (a wide im2col's junk columns are skipped) and are contiguous in the output.
"""
from __future__ import annotations

import numba as nb  # imported only when a compiled requantization is first bound
import numpy as np


@nb.njit(nogil=True, cache=True, boundscheck=False)
def requantize_rows(a, lo, hi, magic, base, out):
    """a: float32 [rows, >= cols] (C-contiguous; columns past out's are skipped), out: int8 [rows, cols].
    (Row slices, not flat indices: the flat-index loop did not vectorize, 3.5x slower.)"""
    for r in range(out.shape[0]):
        ar, orow = a[r], out[r]
        for i in range(orow.shape[0]):
            orow[i] = np.int8(np.int32(min(max(ar[i], lo), hi) + magic) - base)


@nb.njit(nogil=True, cache=True, boundscheck=False, fastmath={"contract"})
def add_requantize(a, b, m1, m2, k, lo, hi, out):
    """The int8 Add of edge/int8_elementwise.py in one pass, flat int8 arrays of one length:
    out = int8(int64(clamp(a m1 + b m2 + k, lo, hi)) - 128), in float64; every term is a multiple
    of 2^-S below 2^53 there (the caller checks), so the sums are exact in any order, and lo >= 0
    makes the truncation a floor."""
    for i in range(out.shape[0]):
        v = a[i] * m1 + b[i] * m2 + k
        out[i] = np.int8(np.int64(min(max(v, lo), hi)) - 128)
