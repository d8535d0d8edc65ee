"""jit.requantize's compiled passes and jit.gemm_int8's int64 requantization on inputs built to hit
exact ties (both parities, both signs, odd and even zero points), against a reference written with
Python's exact fractions: rounding to nearest, ties to even before the zero point is added (what
LiteRT's XNNPACK does for conv, depthwise and dense), or after it (its int8 MEAN)."""
from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("numba")
from isthmus.edge.quant import MAGIC, magic_pair  # noqa: E402
from isthmus.jit import requantize as jr  # noqa: E402


def rne(x: Fraction) -> int:
    return round(x)  # Python rounds a Fraction half to even


def want_of(xs, zp, lo=-128, hi=127, tie_with_zp=False):
    """clamp(rne(x) + zp) (or clamp(rne(x + zp))) for exact fractions xs."""
    return np.array([min(hi, max(lo, rne(x + zp) if tie_with_zp else rne(x) + zp)) for x in xs], np.int8)


def tie_values(denominator: int, n: int = 200, seed: int = 0) -> np.ndarray:
    """Integers v with v / denominator spread around zero, every other one a tie (odd * denominator / 2)."""
    rng = np.random.default_rng(seed)
    v = rng.integers(-40 * denominator, 40 * denominator, n)
    v[::2] = (2 * rng.integers(-40, 40, n // 2) + 1) * (denominator // 2)
    return v


@pytest.mark.parametrize("zp", [0, 3, -5, -128, 127])
def test_short_rows_round_ties_to_even_before_the_zero_point(zp):
    """requantize_rows: float32 x (x = v / 4, exact), clamped to [lo - zp, hi - zp], rounded by magic_pair."""
    v = tie_values(4)
    x = (v / 4).astype(np.float32).reshape(2, -1)
    out = np.zeros(x.shape, np.int8)
    magic, base = magic_pair(zp)
    jr.requantize_rows(x, np.zeros(1, np.float32), np.float32(-128 - zp), np.float32(127 - zp), np.float32(magic),
                       np.int32(base), out)
    np.testing.assert_array_equal(out.ravel(), want_of([Fraction(int(t), 4) for t in v], zp))


@pytest.mark.parametrize("zp,lo,hi", [(0, -128, 127), (3, 3, 127), (-7, -128, 20)])
def test_uniform_rows_round_ties_to_even_before_the_zero_point(zp, lo, hi):
    """uniform_requantize_rows' magic form: t = a m + 1.5 2^52 + even, clamped, low bits + odd."""
    v = tie_values(8, seed=1)
    a = v.astype(np.float32).reshape(4, -1)
    odd = zp & 1
    out = np.zeros(a.shape, np.int8)
    jr.uniform_requantize_rows(a, np.float32(0), np.float32(0), False, 0.125, MAGIC + zp - odd, MAGIC + lo - odd,
                               MAGIC + hi - odd, True, MAGIC, np.int32(-odd), out)
    np.testing.assert_array_equal(out.ravel(), want_of([Fraction(int(t), 8) for t in v], zp, lo, hi))


@pytest.mark.parametrize("zp", [0, 5, -6])
def test_channel_rows_round_ties_to_even_before_the_zero_point(zp):
    """channel_requantize_rows: a multiplier and a constant per channel (the zero point's even part in
    it), rint after the clamp, the odd part added after."""
    v = tie_values(16, 240, seed=2).reshape(6, 40)
    mf = np.array([1 / 16, 1 / 8, 1 / 4, 1 / 16, 1 / 2, 1 / 16])
    bias = np.array([0, 3, -5, 8, 1, -8])  # bias / 16, ties kept where bias is a multiple of 16 / m
    odd = zp & 1
    cf = bias / 16 + (zp - odd)
    out = np.zeros(v.shape, np.int8)
    jr.channel_requantize_rows(v.astype(np.float64), 1, mf, cf, float(-128 - odd), float(127 - odd), np.int32(-odd),
                               out)
    want = np.stack([want_of([Fraction(int(t)) * Fraction(mf[c]) + Fraction(int(bias[c]), 16) for t in v[c]], zp)
                     for c in range(6)])
    np.testing.assert_array_equal(out, want)
    assert sum(Fraction(int(t)) * Fraction(mf[0]) % 1 == Fraction(1, 2) for t in v[0]) > 5  # ties in channel 0


@pytest.mark.parametrize("zp", [4, 3, -3])
def test_sum_rows_round_ties_to_even_after_the_zero_point(zp):
    """sum_requantize_rows (GlobalAvgPool): ((sum x) q + c) 2^-s with c holding zp 2^s, ties to even of the
    sum with the zero point (LiteRT's MEAN), parity zero point 0."""
    rng = np.random.default_rng(3)
    x = rng.integers(-128, 128, (64, 4)).astype(np.int8)
    q, s = 1 << 30, 32  # M = 1/4: the mean of 4, a quarter of the rows ties
    c = np.int64(zp) << s
    out = np.zeros(64, np.int8)
    jr.sum_requantize_rows(x, np.int64(q), c, np.int64(s), np.int64(0), np.int64(-128), np.int64(127), out)
    sums = x.astype(np.int64).sum(axis=1)
    np.testing.assert_array_equal(out, want_of([Fraction(int(t), 4) for t in sums], zp, tie_with_zp=True))
    assert np.any(sums % 4 == 2)


@pytest.mark.parametrize("zp", [0, 1, -2, 7])
def test_gemm_int64_requantization_rounds_ties_to_even(zp):
    """jit.gemm_int8.gemm_requantize_int: shift_round_even on acc q + bias q + zp 2^s."""
    from isthmus.jit import gemm_int8 as g8
    if not g8.supported():
        pytest.skip("the kernel needs x86 AVX2")
    rng = np.random.default_rng(4)
    o, k, p = 6, 9, 40
    w = rng.integers(-4, 5, (o, k))
    x = rng.integers(-4, 5, (k, p)).astype(np.int8)
    xp = np.zeros(g8.packed_shape(k, p), np.int32)
    g8.pack_rows(x, xp)
    w32 = g8.pack_weights(w)
    q = np.full(o, 1 << 30, np.int64)
    s = 31 + np.arange(o) % 3  # M = 1/2, 1/4, 1/8
    bias = rng.integers(-9, 9, o)
    c = bias * q + (np.int64(zp) << s)
    acc, out = np.zeros((w32.shape[0], g8.NR), np.int32), np.zeros(o * p, np.int8)
    g8.gemm_requantize_int(w32, xp, acc, q, c, s, np.int64(zp), -128, 127, out, o, p, p, 1)
    a = w @ x.astype(np.int64) + bias[:, None]
    want = np.stack([want_of([Fraction(int(t), 2 ** int(s[r] - 30)) for t in a[r]], zp) for r in range(o)])
    np.testing.assert_array_equal(out.reshape(o, p), want)
    assert np.any(a[0] % 2 == 1) and np.any(a[1] % 4 == 2)  # ties in both scales
