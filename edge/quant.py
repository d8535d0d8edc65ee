"""Fixed-point arithmetic shared by the int8 kernels.

A real multiplier M (say s_x * s_w / s_y) is held as an int32 `q` in [2^30, 2^31) and a right
shift `s` with M ~= q * 2^-s. Requantizing an integer v is one rounding, half up, in int64:

    y = clamp(((v + bias) * q + 2^(s-1)) >> s) + zero_point, lo, hi)

(TFLite's single-rounding scheme). The tests write this definition out again in plain int64 numpy
and compare bit for bit. The kernels fold bias, rounding and zero point into one per-channel
constant c. Where |acc| q + |c| < 2^53 (nearly always) the same arithmetic runs in float64, exact:
v = acc q 2^-s + (c + 128 * 2^s) 2^-s, then clamp and truncate into the output's bytes, whose top
bit flips to give floor(v) - 128; float64 multiplies vectorize where int64 ones do not (AVX2).

int8 GEMMs run as float32 GEMMs on int8-valued arrays: exact while every partial sum stays below
2^24, which `exact_dtype` checks from a bound on the accumulator (float64, exact to 2^53, otherwise).
"""
from __future__ import annotations

import math
from typing import Sequence, Tuple, Union

import numpy as np

from .format import EdgeModelError
from .opcontext import clip_ufunc

F32_EXACT = 1 << 24
F64_EXACT = 1 << 53
MAX_SHIFT = 62
I64_LIMIT = 1 << 63


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


class Requantizer:
    """out = clamp(((acc + bias) * q + 2^(s-1)) >> s) + zp, lo, hi), per channel along one axis.

    multipliers: one per channel (or one); bias: per channel ints (or None); acc_bound: max |acc|,
    used to prove int64 never overflows; channel_shape: the broadcast shape of a per-channel vector.
    """

    def __init__(self, multipliers: Union[float, Sequence[float]], zero_point: int, lo: int, hi: int,
                 acc_bound: int, bias=None, channel_shape: Tuple[int, ...] = (-1,)):
        ms = np.atleast_1d(np.asarray(multipliers, dtype=np.float64))
        qs = [quantize_multiplier(float(m)) for m in ms]
        b = [0] if bias is None else [int(v) for v in np.atleast_1d(bias)]
        n = max(len(qs), len(b))
        if len(qs) not in (1, n) or len(b) not in (1, n):
            raise EdgeModelError(f"{len(qs)} multipliers and {len(b)} biases for {n} channels")
        qs, b = qs * (n // len(qs)), b * (n // len(b))
        consts, worst = [], 0
        for (q, s), bv in zip(qs, b):
            c = bv * q + (1 << (s - 1)) + (int(zero_point) << s)
            consts.append(c)
            worst = max(worst, int(acc_bound) * q + abs(c))
        if worst >= I64_LIMIT:
            raise EdgeModelError("requantization could overflow int64 (bias, zero point or multiplier out of range)")
        self.lo, self.hi = int(lo), int(hi)
        # the same arithmetic in float64 when every value stays exact: v = acc * q 2^-s + (c + 128 * 2^s) 2^-s
        # is then a multiple of 2^-s below 2^(53 - s), and floor(v) - 128 the requantized value
        # (float64 multiplies vectorize; int64 ones do not, before AVX-512)
        shifted = [cv + (128 << sv) for (_, sv), cv in zip(qs, consts)]
        self.float_ok = all(int(acc_bound) * qv + abs(cv) < F64_EXACT for (qv, _), cv in zip(qs, shifted))
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

    def bind(self, acc: np.ndarray, out: np.ndarray, tmp: np.ndarray):
        """A zero-argument step: acc (integer-valued float or int) -> out (int8), through tmp (int64,
        or its bytes as float64). Every ufunc runs on one dtype: a casting ufunc would allocate
        iteration buffers per call (and is slower than a separate copyto)."""
        copyto, multiply, add, right_shift, clip = np.copyto, np.multiply, np.add, np.right_shift, clip_ufunc
        if self.float_ok and acc.dtype.kind == "f":
            t, u8, mf, cf = tmp.view(np.float64), out.view(np.uint8), self.mf, self.cf
            src = acc if acc.dtype == np.float64 else None  # float32 first widens into t
            flo, fhi, top, xor = float(self.lo + 128), float(self.hi + 128), np.uint8(128), np.bitwise_xor

            def run_float():
                if src is None:
                    copyto(t, acc)
                    multiply(t, mf, out=t)
                else:
                    multiply(src, mf, out=t)
                add(t, cf, out=t)
                clip(t, flo, fhi, out=t)
                copyto(u8, t, casting="unsafe")  # truncation: a floor, all values are >= 0 here
                xor(u8, top, out=u8)
            return run_float
        q, c, s, lo, hi = self.q, self.c, self.s, self.lo, self.hi
        load = acc is not tmp

        def run():
            if load:
                copyto(tmp, acc, casting="unsafe")
            multiply(tmp, q, out=tmp)
            add(tmp, c, out=tmp)
            right_shift(tmp, s, out=tmp)
            clip(tmp, lo, hi, out=tmp)
            copyto(out, tmp, casting="unsafe")
        return run

    def table(self, values: np.ndarray) -> np.ndarray:
        """The requantization of each value (int64 in, int8 out) computed once, for lookup tables."""
        v = (values.astype(np.int64) * self.q + self.c) >> self.s
        return np.clip(v, self.lo, self.hi).astype(np.int8)



def fold_requantization(w: np.ndarray, multipliers, bias, zero_point: int, acc_bound: int):
    """Fold Requantizer's per-channel arithmetic into float64 GEMM weights, or None when not exact.

    w: integer weights [O, K]. Returns [O, K + 1] float64: row o is w[o] * q_o * 2^-s_o, and its last
    column (against a row of ones) is (bias_o * q_o + 2^(s_o - 1) + (zp + 128) * 2^s_o) * 2^-s_o.
    Every product and partial sum of the GEMM is then a multiple of 2^-s_o below 2^(53 - s_o), so
    exact, and floor(result) - 128 is the requantized value before its clamp: the whole
    requantization becomes part of the GEMM, and what remains is a clip and a cast.
    """
    ms = np.atleast_1d(np.asarray(multipliers, np.float64))
    o = w.shape[0]
    if len(ms) == 1:
        ms = np.full(o, ms[0])
    b = np.zeros(o, np.int64) if bias is None else np.broadcast_to(np.asarray(bias, np.int64), (o,))
    out = np.empty((o, w.shape[1] + 1), np.float64)
    for i in range(o):
        q, s = quantize_multiplier(float(ms[i]))
        n = int(b[i]) * q + (1 << (s - 1)) + ((int(zero_point) + 128) << s)
        if int(acc_bound) * q + abs(n) >= F64_EXACT or int(np.abs(w[i]).max(initial=0)) * q >= F64_EXACT:
            return None
        scale = math.ldexp(1.0, -s)
        out[i, :-1] = (w[i].astype(np.int64) * q).astype(np.float64) * scale
        out[i, -1] = float(n) * scale
    return out


def bind_folded_output(acc: np.ndarray, out: np.ndarray, lo: int, hi: int):
    """The end of a folded requantization: clip to [lo, hi] + 128, truncate (a floor: all values are
    now >= 0) into the output's bytes, and flip the top bit (u - 128 as int8)."""
    u8 = out.view(np.uint8)
    clip, copyto, xor, flo, fhi, top = clip_ufunc, np.copyto, np.bitwise_xor, float(lo + 128), float(hi + 128), np.uint8(128)

    def run():
        clip(acc, flo, fhi, out=acc)
        copyto(u8, acc, casting="unsafe")
        xor(u8, top, out=u8)
    return run
