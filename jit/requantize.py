"""The short float32 requantization of the edge's int8 kernels in one compiled pass.

edge/quant.UniformRequantizer's short path turns a float32 accumulator into int8 in three numpy
passes (a clamp, an add of 1.5 * 2^23 + the zero point's even part that rounds to the integer,
ties to even, a narrowing copy of the float's low byte); `requantize_rows` does the same arithmetic
per element in one loop: out = int8(int32(min(max(a, lo), hi) + magic) - base), (magic, base) =
edge/quant.magic_pair(zero point) (the integer part of a float32 in [2^23, 2^24) is its value,
base takes 1.5 * 2^23 off and adds the zero point's odd part), after adding a per-row
bias where the caller left it out of the GEMM. The rows may be strided in the accumulator (a wide
im2col's junk columns are skipped) and are contiguous in the output.
"""
from __future__ import annotations

import numba as nb  # imported only when a compiled requantization is first bound
import numpy as np


@nb.njit(nogil=True, cache=True, boundscheck=False)
def requantize_rows(a, bias, lo, hi, magic, base, out):
    """a: float32 [rows, >= cols] (C-contiguous; columns past out's are skipped), bias: float32 [C]
    added to row r as bias[r % C] first (the caller makes that sum exact), out: int8 [rows, cols].
    (Row slices, not flat indices: the flat-index loop did not vectorize, 3.5x slower.)"""
    c = bias.shape[0]
    for r in range(out.shape[0]):
        ar, orow, b = a[r], out[r], bias[r % c]
        for i in range(orow.shape[0]):
            orow[i] = np.int8(np.int32(min(max(ar[i] + b, lo), hi) + magic) - base)


@nb.njit(nogil=True, cache=True, boundscheck=False)  # no contraction: the multiply and the add round as numpy's
def uniform_requantize_rows(a, tlo, thi, before, m, c, flo, fhi, after, sub, off, out):
    """edge/quant.UniformRequantizer's float64 path per element: clamp a to [tlo, thi] in its own
    dtype (before), t = float64(a) * m + c, clamp t to [flo, fhi] (after), out = int8(int32(t - sub) - off):
    c = 1.5 * 2^52 + the zero point's even part rounds (ties to even), sub = 1.5 * 2^52, off = -(its
    odd part).
    a: [rows, >= cols] C-contiguous float32 or float64, out: int8 [rows, cols]."""
    for r in range(out.shape[0]):
        ar, orow = a[r], out[r]
        for i in range(orow.shape[0]):
            v = ar[i]
            if before:
                v = min(max(v, tlo), thi)
            t = np.float64(v) * m + c
            if after:
                t = min(max(t, flo), fhi)
            # t - sub is exact (t an integer of sub's binade, or sub = 0) and small: int32 converts
            # packed (AVX2 has no packed float64 -> int64: that made this loop scalar, 4x slower)
            orow[i] = np.int8(np.int32(t - sub) - off)


@nb.njit(nogil=True, cache=True, boundscheck=False, fastmath={"contract"})
def add_requantize(a, b, m1, m2, k, lo, hi, out):
    """The int8 Add of edge/int8_elementwise.py in one pass, flat int8 arrays of one length:
    out = int8(int32(clamp(a m1 + b m2 + k, lo, hi)) - 128), in float64; every term is a multiple
    of 2^-S below 2^53 there (the caller checks), so the sums are exact in any order, and lo >= 0
    makes the truncation a floor."""
    for i in range(out.shape[0]):
        v = a[i] * m1 + b[i] * m2 + k
        out[i] = np.int8(np.int32(min(max(v, lo), hi)) - 128)  # int32: packed conversion (AVX2 has no float64 -> int64)


@nb.njit(nogil=True, cache=True, boundscheck=False)
def quantize_flat(x, s, lo, hi, z, out):
    """float32 -> int8 as edge/int8_elementwise.py's Quantize per tensor: out = rint(clamp(x / s,
    lo, hi)) + z (rint: half to even; lo = -128 - z, hi = 127 - z), flat arrays of one length."""
    for i in range(out.shape[0]):
        out[i] = np.int8(np.int32(np.rint(min(max(x[i] / s, lo), hi)) + z))


@nb.njit(nogil=True, cache=True, boundscheck=False)
def dequantize_flat(x, z, s, out):
    """out = (float32(x) - z) * s in float32, each step rounded as numpy's (Dequantize, per tensor)."""
    for i in range(x.shape[0]):
        out[i] = (np.float32(x[i]) - z) * s


@nb.njit(inline="always")
def shift_round_even(t, s, zp):
    """edge/quant.Requantizer's int64 rounding: t 2^-s (t holding zp 2^s) to nearest, ties to the
    value (less zp) that is even; branch free: (t + 2^(s-1) - 1 + parity) >> s."""
    return (t + ((np.int64(1) << (s - 1)) - 1) + (((t >> s) ^ zp) & 1)) >> s


@nb.njit(nogil=True, cache=True, boundscheck=False)
def sum_requantize_rows(x, q, c, s, zp, lo, hi, out):
    """edge's int8 GlobalAvgPool: out[r] = clamp(shift_round_even((sum x[r]) * q + c, s, zp), lo, hi) in
    int64 (edge/quant.Requantizer's integer path with one multiplier, the zero points folded into c)."""
    for r in range(x.shape[0]):
        row = x[r]
        v = np.int64(0)
        for i in range(row.shape[0]):
            v += np.int64(row[i])
        out[r] = np.int8(min(max(shift_round_even(v * q + c, s, zp), lo), hi))


@nb.njit(nogil=True, cache=True, boundscheck=False)  # no contraction: the multiply and the add round as numpy's
def channel_requantize_rows(a, per, mf, cf, flo, fhi, off, out):
    """edge/quant.Requantizer's float64 path with a multiplier and a constant per channel, row r
    being channel r // per: t = float64(a) * mf + cf, clamped to [flo, fhi], out = rint(t) - off
    (rint: ties to even; cf holds the zero point's even part, -off its odd part).
    a: float [rows, cols] (rows may be strided), out: int8 [rows, cols]."""
    for r in range(out.shape[0]):
        ch = r // per
        m, c = mf[ch], cf[ch]
        ar, orow = a[r], out[r]
        for i in range(orow.shape[0]):
            t = np.float64(ar[i]) * m + c
            # int32: AVX2 has no packed float64 -> int64
            orow[i] = np.int8(np.int32(np.rint(min(max(t, flo), fhi))) - off)
