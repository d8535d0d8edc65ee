"""Fixed-point arithmetic shared by the int8 kernels.

A real multiplier M (say s_x * s_w / s_y) is held as an int32 `q` in [2^30, 2^31) and a right
shift `s` with M ~= q * 2^-s. Requantizing an integer v is one rounding, to nearest with ties to
even (what LiteRT's XNNPACK does: its "fp32" requantization rounds v * M in float32 by the current
rounding mode, exact for the quantizer's short multipliers, where exact ties are common), in int64:

    y = clamp(rne(((v + bias) * q) * 2^-s) + zero_point, lo, hi)

with rne(t 2^-s) = (t + 2^(s-1) - 1 + ((t >> s) & 1)) >> s (`shift_round_even`). The tie is
decided before the zero point is added: with an odd zero point, rounding the sum to even would
round the value to odd. The tests write this definition out again in plain int64 numpy and compare
bit for bit. The kernels fold bias and zero point into one per-channel constant c. Where
|acc| q + |c| < 2^53 (nearly always) the same arithmetic runs in float64, exact: t = acc q 2^-s
+ c 2^-s, clamped, then rounded by adding 1.5 * 2^52 (the float unit's ties-to-even), whose low
bits are the value; float64 multiplies vectorize where int64 ones do not (AVX2). Float paths fold
only the even part of the zero point (`split_zero_point`) before rounding, and add its low bit after.

That is the rule of conv, depthwise, dense and mul. Other ops round as LiteRT runs them (measured
against LiteRT 2.3.0 with tie-heavy single-op models): MEAN (GlobalAvgPool) ties to even after the
zero point (EVEN_SUM); int8 -> int8 QUANTIZE (requantizing reshapes, concatenations, ...) and
LEAKY_RELU with XNNPACK's 8-bit multipliers, half up (`convert_table`); ADD with its 21-bit ones,
half up (`add_multipliers`); a requantizing RELU half up (UP); AVERAGE_POOL_2D half away from zero
(int8_kernels.avg_pool).

int8 GEMMs run as float32 GEMMs on int8-valued arrays: exact while every partial sum stays below
2^24, which `exact_dtype` checks from a bound on the accumulator (float64, exact to 2^53, otherwise).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import numpy as np

from .format import EdgeModelError
from .opcontext import clip_ufunc

MAGIC = 1.5 * 2.0 ** 52  # float64 + MAGIC rounds to an integer held in the low bits
MAGIC32 = 1.5 * 2.0 ** 23  # the same in float32 (|value| < 2^22)
F32_EXACT = 1 << 24
F64_EXACT = 1 << 53
MAX_SHIFT = 62
I64_LIMIT = 1 << 63


def split_zero_point(zero_point: int) -> Tuple[int, int]:
    """(even, odd) with even + odd = zero_point and odd in {0, 1}: float paths round t + even (an
    even offset keeps the tie's parity) and add odd after the rounding."""
    odd = int(zero_point) & 1
    return int(zero_point) - odd, odd


def shift_round_even(t, s):
    """t * 2^-s rounded to nearest, ties to even (t int or int64 array, s >= 1): branch free."""
    return (t + ((1 << (s - 1)) - 1) + ((t >> s) & 1)) >> s


def magic_pair(zero_point: int, magic: float = MAGIC32) -> Tuple[float, int]:
    """(add, base) for the magic-constant rounding of x into int8 with an output zero point:
    int(x + add) - base = rne(x) + zero_point (add holds only the zero point's even part)."""
    even, odd = split_zero_point(zero_point)
    return magic + even, int(magic) - odd


def quantize_multiplier(m: float) -> Tuple[int, int]:
    """(q, s) with m ~= q * 2^-s and q in [2^30, 2^31)."""
    if not (math.isfinite(m) and m > 0):
        raise EdgeModelError(f"requantization multiplier {m!r} must be positive and finite")
    mant, e = math.frexp(m)  # m = mant * 2^e, mant in [0.5, 1)
    q = int(round(mant * (1 << 31)))
    if q == 1 << 31:
        q, e = q >> 1, e + 1
    s = 31 - e
    if not 1 <= s <= MAX_SHIFT:
        raise EdgeModelError(f"requantization multiplier {m:g} is outside [2^-31, 2^30)")
    return q, s


def add_multipliers(s1: float, s2: float, sy: float) -> Tuple[int, int, int]:
    """(q1, q2, S) for an int8 Add y = ((x1 - z1) q1 + (x2 - z2) q2 + 2^(S-1)) >> S + z_y (half up).
    As LiteRT's XNNPACK builds them (qs8 add): the ratios r_i = s_i / s_y divided in float32, a
    21-bit multiplier for the larger (S = 20 - floor(log2 max r_i)), each q_i = round(r_i 2^S),
    where XNNPACK takes the op (ratios in [2^-10, 2^8)); elsewhere 31-bit multipliers."""
    r1, r2 = (float(np.float32(v) / np.float32(sy)) for v in (s1, s2))
    big = max(r1, r2)
    if 2.0 ** -10 <= big < 2.0 ** 8 and min(r1, r2) >= 2.0 ** -10:
        shift = 20 - (math.frexp(big)[1] - 1)
    else:
        _, shift = quantize_multiplier(max(s1, s2) / sy)
        r1, r2 = s1 / sy, s2 / sy
    return round(math.ldexp(r1, shift)), round(math.ldexp(r2, shift)), shift


def convert_table(s1: float, z1: int, s2: float, z2: int, values: np.ndarray,
                  slope: Optional[float] = None) -> Optional[np.ndarray]:
    """int8 -> int8 requantization of `values` (int64) as LiteRT's XNNPACK converts (qs8 convert, the
    QUANTIZE op between int8 tensors) or, with a slope, applies LEAKY_RELU: 8-bit fractions
    m = round(256 r), r = s1 / s2 divided in float32 (times the slope in float32 below the zero
    point), y = clamp(((x - z1) m + 128) >> 8 + z2), half up; None outside the ratios XNNPACK
    takes ([2^-8, 2^7] in magnitude)."""
    r = np.float32(s1) / np.float32(s2)
    neg = r if slope is None else r * np.float32(slope)
    if not (2.0 ** -8 <= float(r) <= 2.0 ** 7 and 2.0 ** -8 <= abs(float(neg)) <= 2.0 ** 7 - 2.0 ** -8):
        return None
    mp, mn = round(256.0 * float(r)), round(256.0 * float(neg))  # exact products, rounded ties to even (lrintf)
    d = values.astype(np.int64) - z1
    v = (d * np.where(d >= 0, mp, mn) + 128 + (int(z2) << 8)) >> 8
    return np.clip(v, -128, 127).astype(np.int8)


def exact_dtype(acc_bound: float) -> np.dtype:
    """float32 when a GEMM whose partial sums are bounded by acc_bound is exact in it, else float64."""
    if acc_bound < F32_EXACT:
        return np.dtype(np.float32)
    if acc_bound < 1 << 53:
        return np.dtype(np.float64)
    raise EdgeModelError(f"int8 accumulator bound {acc_bound:g} exceeds 2^53")


def int8_range(zero_point: int) -> int:
    """max |x - zero_point| over int8 x."""
    return max(127 - zero_point, zero_point + 128)


def activation_bounds(activation: str, scale: float, zero_point: int) -> Tuple[int, int]:
    """The int8 clamp [lo, hi] of a fused activation in the output's quantized domain."""
    lo, hi = -128, 127
    if activation in ("relu", "relu6"):
        lo = max(lo, zero_point)
    if activation == "relu6":
        hi = min(hi, zero_point + int(round(6.0 / scale)))
    elif activation not in ("none", "", "relu"):
        raise EdgeModelError(f"fused activation {activation!r} has no int8 kernel (none, relu, relu6)")
    if lo > hi:
        raise EdgeModelError(f"activation {activation} with scale {scale} and zero point {zero_point} "
                             "leaves no int8 values")
    return lo, hi


# How an op's requantization rounds a tie, as LiteRT runs that op (measured against LiteRT 2.3.0 with
# tie-heavy inputs): EVEN, ties to even before the zero point (XNNPACK's fp32 requantization: conv,
# depthwise, fully connected, mul); EVEN_SUM, ties to even after it (MEAN); UP, half up (int8 -> int8
# QUANTIZE, which requantizing reshapes and concatenations become).
EVEN, EVEN_SUM, UP = "even", "even_sum", "up"


class Requantizer:
    """out = clamp(rne((acc + bias) * q 2^-s) + zp, lo, hi), per channel along one axis (ties to even;
    `rounding` EVEN_SUM: rne(... + zp), UP: floor(... + 1/2) + zp).

    multipliers: one per channel (or one); bias: per channel ints (or None); acc_bound: max |acc|,
    used to prove int64 never overflows; channel_shape: the broadcast shape of a per-channel vector.
    """

    def __init__(self, multipliers: Union[float, Sequence[float]], zero_point: int, lo: int, hi: int,
                 acc_bound: int, bias=None, channel_shape: Tuple[int, ...] = (-1,), rounding: str = EVEN):
        ms = np.atleast_1d(np.asarray(multipliers, dtype=np.float64))
        qs = [quantize_multiplier(float(m)) for m in ms]
        b = [0] if bias is None else [int(v) for v in np.atleast_1d(bias)]
        n = max(len(qs), len(b))
        if len(qs) not in (1, n) or len(b) not in (1, n):
            raise EdgeModelError(f"{len(qs)} multipliers and {len(b)} biases for {n} channels")
        qs, b = qs * (n // len(qs)), b * (n // len(b))
        self.zp = int(zero_point)
        if rounding not in (EVEN, EVEN_SUM, UP):
            raise EdgeModelError(f"requantization rounding {rounding!r} is none of {EVEN}, {EVEN_SUM}, {UP}")
        # the tie's parity is that of the value less `pz` (the zero point for EVEN: decided before it)
        self.pz, self.pm = (self.zp if rounding == EVEN else 0), (0 if rounding == UP else 1)
        even, odd = split_zero_point(self.zp) if rounding == EVEN else (self.zp, 0)
        consts = [bv * q + (self.zp << s) for (q, s), bv in zip(qs, b)]  # t = acc q + c; y = rne(t 2^-s)
        if max(int(acc_bound) * q + abs(c) + (1 << s) for (q, s), c in zip(qs, consts)) >= I64_LIMIT:
            raise EdgeModelError("requantization could overflow int64 (bias, zero point or multiplier out of range)")
        self.lo, self.hi = int(lo), int(hi)
        # the same arithmetic in float64 when every value stays exact: t = acc * q 2^-s + (bias q + even 2^s) 2^-s
        # is then a multiple of 2^-s below 2^(53 - s); clamped to [lo - odd, hi - odd] and rounded
        # (ties to even: the offset `even` keeps the parity), + odd is the requantized value
        # (float64 multiplies vectorize; int64 ones do not, before AVX-512)
        shifted = [bv * qv + (even << sv) for (qv, sv), bv in zip(qs, b)]
        self.float_ok = rounding != UP and all(int(acc_bound) * qv + abs(cv) < F64_EXACT
                                               for (qv, _), cv in zip(qs, shifted))
        self.flo, self.fhi, self.odd = float(self.lo - odd), float(self.hi - odd), odd
        mf = np.array([math.ldexp(qv, -sv) for qv, sv in qs], np.float64)
        cf = np.array([math.ldexp(float(cv), -sv) if abs(cv) < F64_EXACT else 0.0 for (_, sv), cv in zip(qs, shifted)])
        if len(set(mf.tolist())) == 1 and len(set(cf.tolist())) == 1:
            self.mf, self.cf = np.float64(mf[0]), np.float64(cf[0])
        else:
            self.mf, self.cf = mf.reshape(channel_shape), cf.reshape(channel_shape)
        if len(set(qs)) == 1 and len(set(consts)) == 1:
            self.q, self.c, self.s = np.int64(qs[0][0]), np.int64(consts[0]), np.int64(qs[0][1])
        else:
            self.q = np.array([q for q, _ in qs], np.int64).reshape(channel_shape)
            self.c = np.array(consts, np.int64).reshape(channel_shape)
            shifts = {s for _, s in qs}
            self.s = np.int64(shifts.pop()) if len(shifts) == 1 else \
                np.array([s for _, s in qs], np.int64).reshape(channel_shape)
        # half less one: t + h1 + parity, shifted, rounds ties to even (UP: the half, no parity)
        self.h1 = (np.int64(1) << (self.s - 1)) - self.pm

    def bind(self, acc: np.ndarray, out: np.ndarray, tmp: np.ndarray):
        """A zero-argument step: acc (integer-valued float or int) -> out (int8), through tmp (int64,
        or its bytes as float64). Every ufunc runs on one dtype: a casting ufunc would allocate
        iteration buffers per call (and is slower than a separate copyto)."""
        copyto, multiply, add, right_shift, clip = np.copyto, np.multiply, np.add, np.right_shift, clip_ufunc
        odd = np.int8(self.odd)
        if self.float_ok and acc.dtype.kind == "f":
            t, mf, cf, low = tmp.view(np.float64), self.mf, self.cf, tmp.view(np.int64)
            src = acc if acc.dtype == np.float64 else None  # float32 first widens into t
            flo, fhi, magic = self.flo, self.fhi, np.float64(MAGIC)

            def run_float():
                if src is None:
                    copyto(t, acc)
                    multiply(t, mf, out=t)
                else:
                    multiply(src, mf, out=t)
                add(t, cf, out=t)
                clip(t, flo, fhi, out=t)
                add(t, magic, out=t)  # rounds to the integer (ties to even), held in the low bits
                copyto(out, low, casting="unsafe")  # the low byte: the value less `odd`, modulo 256
                if odd:
                    add(out, odd, out=out)
            return run_float
        q, c, s, h1, lo, hi = self.q, self.c, self.s, self.h1, self.lo, self.hi
        zp, pm = np.int64(self.pz), np.int64(self.pm)
        load = acc is not tmp
        par = np.empty_like(tmp, dtype=np.int64)  # the parity of the truncated quotient (a fallback path's own buffer)
        bitwise_and, bitwise_xor = np.bitwise_and, np.bitwise_xor

        def run():
            if load:
                copyto(tmp, acc, casting="unsafe")
            multiply(tmp, q, out=tmp)
            add(tmp, c, out=tmp)
            right_shift(tmp, s, out=par)
            bitwise_xor(par, zp, out=par)  # the tie's parity is the value's, before the zero point
            bitwise_and(par, pm, out=par)
            add(par, h1, out=par)
            add(tmp, par, out=tmp)
            right_shift(tmp, s, out=tmp)
            clip(tmp, lo, hi, out=tmp)
            copyto(out, tmp, casting="unsafe")
        return run

    def table(self, values: np.ndarray) -> np.ndarray:
        """The requantization of each value (int64 in, int8 out) computed once, for lookup tables."""
        t = values.astype(np.int64) * self.q + self.c
        v = (t + self.h1 + (((t >> self.s) ^ self.pz) & self.pm)) >> self.s
        return np.clip(v, self.lo, self.hi).astype(np.int8)


def fold_requantization(w: np.ndarray, multipliers, bias, zero_point: int, acc_bound: int):
    """Fold Requantizer's per-channel arithmetic into float64 GEMM weights, or None when not exact.

    w: integer weights [O, K]. Returns [O, K + 1] float64: row o is w[o] * q_o * 2^-s_o, and its last
    column (against a row of ones) is (bias_o * q_o + even * 2^s_o) * 2^-s_o, `even` the zero point's
    even part (split_zero_point). Every product and partial sum of the GEMM is then a multiple of
    2^-s_o below 2^(53 - s_o), so exact, and bind_folded_output's clamp and rounding give the
    requantized value: the whole requantization becomes part of the GEMM but a clip, an add and a cast.
    """
    ms = np.atleast_1d(np.asarray(multipliers, np.float64))
    o = w.shape[0]
    if len(ms) == 1:
        ms = np.full(o, ms[0])
    b = np.zeros(o, np.int64) if bias is None else np.broadcast_to(np.asarray(bias, np.int64), (o,))
    even, _ = split_zero_point(zero_point)
    out = np.empty((o, w.shape[1] + 1), np.float64)
    for i in range(o):
        q, s = quantize_multiplier(float(ms[i]))
        n = int(b[i]) * q + (even << s)
        if int(acc_bound) * q + abs(n) >= F64_EXACT or int(np.abs(w[i]).max(initial=0)) * q >= F64_EXACT:
            return None
        scale = math.ldexp(1.0, -s)
        out[i, :-1] = (w[i].astype(np.int64) * q).astype(np.float64) * scale
        out[i, -1] = float(n) * scale
    return out


def bind_folded_output(acc: np.ndarray, out: np.ndarray, lo: int, hi: int, zero_point: int):
    """The end of a folded requantization (acc float64, clamped and rounded in place): clip to
    [lo, hi] less the zero point's odd part, add 1.5 * 2^52 (rounds ties to even, the value in the
    low bits), take the low byte, and add the odd part back."""
    _, odd = split_zero_point(zero_point)
    low, odd8 = acc.view(np.int64), np.int8(odd)
    clip, copyto, add, magic = clip_ufunc, np.copyto, np.add, np.float64(MAGIC)
    flo, fhi = float(lo - odd), float(hi - odd)

    def run():
        clip(acc, flo, fhi, out=acc)
        add(acc, magic, out=acc)
        copyto(out, low, casting="unsafe")
        if odd:
            add(out, odd8, out=out)
    return run


def shared_mantissa(multipliers) -> Optional[Tuple[int, int, np.ndarray]]:
    """(q, s, e) when every multiplier is q * 2^-(s + e_c) with one q (the channels' scales differ by
    powers of two, as quantize_to_edge's pow2 weight scales make them), else None. The power of two
    2^-e_c then folds exactly into float weights, and the requantization after the GEMM is one
    multiplier and one constant for the whole tensor (UniformRequantizer)."""
    qs = [quantize_multiplier(float(m)) for m in np.atleast_1d(np.asarray(multipliers, np.float64))]
    if len({q for q, _ in qs}) != 1:
        return None
    s = min(sv for _, sv in qs)
    e = np.array([sv - s for _, sv in qs], np.int64)
    if int(e.max()) > 60:  # 2^-e would leave float32's normal range for tiny weights
        return None
    return qs[0][0], s, e


class UniformRequantizer:
    """out = clamp(rne(a * q 2^-s) + zp, lo, hi) for a GEMM result a = v_c 2^-e_c, v_c the integer
    accumulator (bias included) of channel c: Requantizer's arithmetic for multipliers q 2^-(s + e_c),
    with the powers of two already in the weights. Every multiplier and constant is one scalar, so
    each pass is a plain streaming loop (a per-channel vector makes numpy run one short broadcast
    loop per row, 2-2.5x slower here).

    In float64: x = a q 2^-s is v_c q 2^-(s + e_c), exact while |v_c| q < 2^53; adding
    1.5 * 2^52 + even (split_zero_point) rounds x + even once, ties to even, and leaves the integer
    in the low bits, which an int64 -> int8 cast takes directly; the odd part is added after. A clamp
    after that add is exact whatever x is (rounding is monotone).
    The clamp moves before the multiply, onto a (float32 when the GEMM is): a -> y(a) is monotone,
    so clamping a to integers t_lo, t_hi with y(t_lo) = lo and y(t_hi) = hi (found in exact integer
    arithmetic) gives the same outputs; where no such integer exists (a multiplier above 1) the
    clamp stays in float64.

    bounds: per channel, a bound on |v_c|; e: per channel shifts (shared_mantissa)."""

    def __init__(self, q: int, s: int, e: np.ndarray, zero_point: int, lo: int, hi: int, bounds: np.ndarray):
        self.q, self.s = int(q), int(s)
        e = np.asarray(e, np.int64)
        bounds = [int(b) for b in np.broadcast_to(np.asarray(bounds, np.int64), e.shape)]
        self.f64_ok = not any(b * self.q >= F64_EXACT or self.s + int(ev) > 44 for b, ev in zip(bounds, e))
        tz = (self.q & -self.q).bit_length() - 1
        self.short = 2 * (self.q >> tz) * max(bounds) + 1 < (1 << 24) and int(e.max()) + self.s - tz < 120
        if not (self.f64_ok or self.short):
            raise EdgeModelError("uniform requantization would round in float64")
        self.lo, self.hi, self.zp = int(lo), int(hi), int(zero_point)
        self.even, self.odd = split_zero_point(self.zp)
        self.m = math.ldexp(self.q, -self.s)
        big = max(bounds)  # |a| <= max_c bound_c 2^-e_c <= big

        def y(t: int) -> int:  # rne(t q 2^-s) + zp + 128, the requantized value of a = t, + 128
            return shift_round_even(t * self.q, self.s) + self.zp + 128
        lo8, hi8 = self.lo + 128, self.hi + 128
        k = ((self.zp + 128) << self.s) + (1 << (self.s - 1))  # half up's largest/smallest t, then ties to even's
        t_lo = -((-(((lo8 + 1) << self.s) - k)) // self.q) - 1  # the largest t with y(t) <= lo8
        t_hi = -((-((hi8 << self.s) - k)) // self.q)  # the smallest t with y(t) >= hi8
        for _ in range(4):  # ties to even rounds down where half up does not: at most a step or two on
            t_lo += y(t_lo + 1) <= lo8
            t_hi += y(t_hi) < hi8
        self.clamp_before = True
        if t_lo < -big:
            t_lo = -big  # no a lies below: a no-op
        elif t_lo > big or y(t_lo) != lo8 or y(t_lo + 1) <= lo8:
            self.clamp_before = False
        if t_hi > big:
            t_hi = big
        elif t_hi < -big or y(t_hi) != hi8 or y(t_hi - 1) >= hi8:
            self.clamp_before = False
        self.t_lo, self.t_hi = t_lo, t_hi
        self.needs_clamp = not self.clamp_before or t_lo > -big or t_hi < big
        # A short multiplier (quantize_to_edge's short activation scales make q = odd * 2^tz with a
        # few-bit odd part): M_c = (q >> tz) 2^-f_c, f_c = s + e_c - tz, folds into float32 weights
        # exactly, and the GEMM yields x = v M_c exactly while (q >> tz) |v| < 2^24. Clamping x to
        # [lo - zp, hi - zp] and adding 1.5 * 2^23 + even rounds it in float32, ties to even
        # (magic_pair): `short`, the whole requantization in float32, a clamp, an add and a narrowing cast.
        # (eps_c: what the bias adds besides; zero now that ties round to even, as the kernels expect.)
        self.eps = np.zeros(e.shape)

    def bind(self, acc: np.ndarray, tmp: Optional[np.ndarray], view, out: np.ndarray, short: bool = False):
        """A zero-argument step. acc: the GEMM's contiguous result (float32 or float64, clamped in
        place); tmp: float64 of acc's shape (None when acc is float64: it is then worked in place);
        view(a) -> the output-shaped view of the real outputs in an acc-shaped array (a wide
        im2col's junk columns are computed and never stored); out: the int8 output, view(acc)'s
        shape; short: acc holds v M_c + eps_c instead (see `short`). (Measured: taking the passes, or the GEMM with them, by blocks of rows that fit in
        L2 gained nothing here, nor a float32 x float64 multiply instead of a widening copy.)"""
        if not short and not self.f64_ok:
            raise EdgeModelError("uniform requantization would round in float64; only the short one is exact")
        t = acc if tmp is None else tmp
        copyto, multiply, add, clip = np.copyto, np.multiply, np.add, clip_ufunc
        odd = np.int8(self.odd)
        if short:  # acc is v M_c + eps_c in float32 (the kernel folded both in)
            if not self.short or acc.dtype != np.float32:
                raise EdgeModelError("the short requantization needs a float32 v M + eps (UniformRequantizer.short)")
            slo, shi = np.float32(self.lo - self.zp), np.float32(self.hi - self.zp)
            c32, bits = np.float32(MAGIC32 + self.even), view(acc).view(np.int32)
            # cycle: edge.quant <-> edge.compiled
            from .compiled import bind_short_requantization  # (compiled.py imports this module)
            fused = bind_short_requantization(acc, view, out, slo, shi, self.zp)
            if fused is not None:  # the same arithmetic in one compiled pass
                return fused

            def run_short():
                clip(acc, slo, shi, out=acc)
                add(acc, c32, out=acc)  # rounds to the integer (ties to even), held in the low bits
                copyto(out, bits, casting="unsafe")  # the low byte: the value less `odd`
                if odd:
                    add(out, odd, out=out)
            return run_short
        # cycle: edge.quant <-> edge.compiled
        from .compiled import bind_uniform_requantization  # (compiled.py imports this module)
        fused = bind_uniform_requantization(self, acc, view, out)
        if fused is not None:  # the same arithmetic in one compiled pass
            return fused
        if tmp is not None and tmp.size != acc.size:  # the kernel planned on the compiled pass
            raise EdgeModelError("uniform requantization: no compiled pass for this layout, and no temporary")
        tlo, thi = acc.dtype.type(self.t_lo), acc.dtype.type(self.t_hi)
        before, after, widen = self.clamp_before and self.needs_clamp, not self.clamp_before, tmp is not None
        m, c = np.float64(self.m), np.float64(MAGIC + self.even)
        flo, fhi = MAGIC + self.lo - self.odd, MAGIC + self.hi - self.odd
        src = view(t).view(np.int64)

        def run():
            if before:
                clip(acc, tlo, thi, out=acc)
            if widen:
                copyto(t, acc)
            multiply(t, m, out=t)
            add(t, c, out=t)  # rounds x + even to the integer (ties to even), held in the low bits
            if after:
                clip(t, flo, fhi, out=t)
            copyto(out, src, casting="unsafe")  # the low byte of the int64 bits: the value less `odd`
            if odd:
                add(out, odd, out=out)
        return run
