"""The fixed-point requantization and its float64-GEMM folding, against plain int64 arithmetic,
including the extremes of the accumulator bound and exact rounding ties (to even, as LiteRT's XNNPACK)."""
import math

import numpy as np
import pytest

from isthmus.edge import EdgeModelError
from isthmus.edge.quant import (Requantizer, UniformRequantizer, bind_folded_output, fold_requantization,
                                 quantize_multiplier, shared_mantissa)


def reference(acc, bias, m, zp, lo, hi):
    mant, e = math.frexp(m)
    q = int(round(mant * 2 ** 31))
    if q == 2 ** 31:
        q, e = q // 2, e + 1
    s = 31 - e
    t = (acc.astype(np.int64) + bias) * q
    r = t >> s  # floor, then up past the half and to the even neighbour at the half
    frac, half = t - (r << s), 1 << (s - 1)
    r = r + (frac > half) + ((frac == half) & (r % 2 == 1))
    return np.clip(r + zp, lo, hi).astype(np.int8)


@pytest.mark.parametrize("m", [2.0 ** -31, 1e-7, 3.3e-4, 0.0123, 0.5, 1.0, 77.7])
def test_multiplier_is_a_31_bit_mantissa_and_a_shift(m):
    q, s = quantize_multiplier(m)
    assert 2 ** 30 <= q < 2 ** 31 and abs(q * 2.0 ** -s / m - 1) < 2 ** -30


@pytest.mark.parametrize("m", [0.0, -1.0, float("inf"), float("nan"), 2.0 ** -40, 2.0 ** 31])
def test_multiplier_out_of_range_is_refused(m):
    with pytest.raises(EdgeModelError):
        quantize_multiplier(m)


@pytest.mark.parametrize("seed", range(4))
def test_requantizer_and_folded_gemm_match_the_integer_definition(seed):
    rng = np.random.default_rng(seed)
    o, k = 6, 40
    w = rng.integers(-127, 128, (o, k))
    bound = 128 * int(np.abs(w).sum(axis=1).max())
    x = rng.integers(-128, 128, (k, 300))
    x[:, 0], x[:, 1] = 127 * np.sign(w[0]), -128 * np.sign(w[0])  # reach the bound for channel 0
    acc = w @ x
    ms = rng.uniform(1e-4, 1e-2, o)
    bias = rng.integers(-20000, 20000, o)
    zp, lo, hi = int(rng.integers(-20, 20)), -100, 90
    want = np.stack([reference(acc[i], bias[i], ms[i], zp, lo, hi) for i in range(o)])

    rq = Requantizer(ms, zp, lo, hi, bound, bias, (o, 1))
    assert rq.float_ok  # bound * q + |c| < 2^53: the float64 arithmetic is exact
    for dtype in (np.float32, np.float64, np.int64):  # float64 steps from float accumulators, int64 otherwise
        got = np.full((o, 300), 55, np.int8)
        rq.bind(acc.astype(dtype), got, np.empty((o, 300), np.int64))()
        np.testing.assert_array_equal(got, want)
    rq.float_ok = False  # the int64 steps from a float accumulator
    got = np.empty((o, 300), np.int8)
    rq.bind(acc.astype(np.float32), got, np.empty((o, 300), np.int64))()
    np.testing.assert_array_equal(got, want)

    folded = fold_requantization(w, ms, bias, zp, bound)
    assert folded is not None
    out = folded @ np.vstack([x, np.ones((1, 300))])
    got2 = np.empty((o, 300), np.int8)
    bind_folded_output(out, got2, lo, hi, zp)()
    np.testing.assert_array_equal(got2, want)


# acc * 0.25 for acc in -8..8: -2, -1.75, ..., 2, rounded half to even (the tie's parity before the zero point)
_TIES = [-2, -2, -2, -1, -1, -1, 0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("zp", [0, 3, -3, -128, 127])
def test_rounding_ties_go_to_even(zp):
    acc = np.arange(-8, 9, dtype=np.int64)  # acc * 0.25 hits every tie, both parities, both signs
    want = np.clip(np.array(_TIES) + zp, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(reference(acc, 0, 0.25, zp, -128, 127), want)
    got = np.empty(17, np.int8)
    Requantizer(0.25, zp, -128, 127, 8).bind(acc, got, np.empty(17, np.int64))()
    np.testing.assert_array_equal(got, want)
    Requantizer(0.25, zp, -128, 127, 8).bind(acc.astype(np.float32), got, np.empty(17, np.int64))()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(Requantizer(0.25, zp, -128, 127, 8).table(acc), want)
    folded = fold_requantization(np.ones((1, 1), np.int64), 0.25, None, zp, 8)
    out = (folded @ np.vstack([acc, np.ones(17)]).astype(np.float64)).reshape(17)
    bind_folded_output(out, got, -128, 127, zp)()
    np.testing.assert_array_equal(got, want)
    rq = UniformRequantizer(*quantize_multiplier(0.25), np.array([0]), zp, -128, 127, np.array([8]))
    for short in (False, True):
        got = np.empty((1, 17), np.int8)
        a = acc.reshape(1, 17) * (rq.m if short else 1.0)
        rq.bind(a.astype(np.float32), None if short else np.empty((1, 17)), lambda t: t, got, short=short)()
        np.testing.assert_array_equal(got[0], want)


def test_fold_declines_when_float64_would_round():
    w = np.full((1, 4000), 127)
    assert fold_requantization(w, 0.01, None, 0, 128 * 127 * 4000) is None


def test_requantizer_keeps_int64_where_float64_would_round():
    rq = Requantizer(0.3, 5, -128, 127, 1 << 23, [1 << 20])
    assert not rq.float_ok  # 2^23 * q ~ 2^54
    acc = np.array([-(1 << 23), -12345678 // 2, -3, 0, 7, 1 << 22, (1 << 23) - 1], np.float64)
    got = np.empty(len(acc), np.int8)
    rq.bind(acc, got, np.empty(len(acc), np.int64))()
    np.testing.assert_array_equal(got, reference(acc.astype(np.int64), 1 << 20, 0.3, 5, -128, 127))


def test_requantizer_refuses_what_could_overflow_int64():
    with pytest.raises(EdgeModelError, match="overflow"):
        Requantizer(0.5, 0, -128, 127, 1 << 40, [1 << 40])


# ---- one multiplier for channels whose scales differ by powers of two ------------------------------
@pytest.mark.parametrize("seed,m0,lo,hi", [(0, 3.1e-3, -128, 127), (1, 7.7e-3, -5, 60), (2, 0.61, -128, 127),
                                           (3, 1.7, -20, 100), (4, 2.0 ** -10, 0, 127)])
def test_uniform_requantizer_matches_the_integer_definition(seed, m0, lo, hi):
    """Channels with multipliers m0 2^-e_c: the GEMM result a = v 2^-e_c (float32 and float64),
    the clamp before the multiply (m0 < 1) or after it (m0 > 1, no integer threshold), a wide view
    whose junk columns are computed and never stored; every value against the int64 definition."""
    rng = np.random.default_rng(seed)
    o, n = 5, 400
    e = rng.integers(0, 5, o)  # s + e <= 44 for these m0
    e[0] = 0
    ms = m0 * np.ldexp(1.0, -e)
    sm = shared_mantissa(ms)
    assert sm is not None and list(sm[2]) == list(e)
    bound = 60000
    v = rng.integers(-bound, bound + 1, (o, n))
    v[:, 0], v[:, 1] = bound, -bound
    v[:, 2:40] = rng.integers(-3000, 3000, (o, 38))  # around zero, where most ties and clamps are
    zp = int(rng.integers(-20, 20))
    want = np.stack([reference(v[i], 0, ms[i], zp, lo, hi) for i in range(o)])
    rq = UniformRequantizer(*sm, zp, lo, hi, np.full(o, bound))
    assert rq.clamp_before == (m0 < 1)
    if m0 == 2.0 ** -10:  # a power-of-two multiplier: v = (2k + 1) 2^(9 + e_c) are ties, both parities and signs
        v[:, 40:46] = np.array([1, -1, 3, -3, 5, -7])[None, :] << (9 + e)[:, None]
        want = np.stack([reference(v[i], 0, ms[i], zp, lo, hi) for i in range(o)])
        assert np.all((v[:, 40:46] * ms[:, None]) % 1 == 0.5)
    for dtype in (np.float32, np.float64):
        a = (v * np.ldexp(1.0, -e)[:, None]).astype(dtype)
        assert np.array_equal(a.astype(np.float64) * np.ldexp(1.0, e)[:, None], v)  # exact
        wide = np.concatenate([a, np.full((o, 7), 1e6, dtype)], axis=1)  # 7 junk columns
        got = np.zeros((o, n), np.int8)
        tmp = None if dtype == np.float64 else np.empty(wide.shape)
        rq.bind(wide, tmp, lambda t: t[:, :n], got)()
        np.testing.assert_array_equal(got, want)


def test_shared_mantissa_declines_unrelated_multipliers():
    assert shared_mantissa([0.01, 0.013]) is None
    assert shared_mantissa([0.01, 0.005, 0.0025 / 1024])[2].tolist() == [0, 1, 12]
    with pytest.raises(EdgeModelError, match="round"):
        UniformRequantizer(*quantize_multiplier(0.5), np.array([0]), 0, -128, 127, np.array([1 << 30]))
    m = 1.2345 * 2.0 ** -13  # s + e = 50: v q 2^-50 + 128.5 would round, and q is no short multiplier
    with pytest.raises(EdgeModelError, match="round"):
        UniformRequantizer(*quantize_multiplier(m), np.array([0, 7]), 0, -128, 127, np.array([99, 99]))
    rq = UniformRequantizer(*quantize_multiplier(2.0 ** -13), np.array([0, 7]), 0, -128, 127, np.array([99, 99]))
    assert rq.short and not rq.f64_ok  # a power of two: the float32 path is exact where float64's is not
    with pytest.raises(EdgeModelError, match="short"):
        rq.bind(np.zeros((2, 3), np.float32), np.zeros((2, 3)), lambda a: a, np.zeros((2, 3), np.int8))


@pytest.mark.parametrize("seed,mq,f,lo,hi", [(0, 13, 14, -128, 127), (1, 5, 9, -5, 60), (2, 1, 12, 0, 127),
                                             (3, 15, 18, -128, 100)])
def test_short_requantization_matches_the_integer_definition(seed, mq, f, lo, hi):
    """A few-bit multiplier M_c = mq 2^-(f + e_c): the float32 path takes x = v M_c (what the
    kernel's GEMM yields, eps_c being 0), clamps, rounds by 1.5 * 2^23 and keeps the low byte; ties
    (v M_c = k + 1/2, common with such multipliers) go to even as the definition says."""
    rng = np.random.default_rng(seed)
    o, n = 4, 600
    e = rng.integers(0, 4, o)
    e[0] = 0
    ms = mq * np.ldexp(1.0, -(f + e))
    sm = shared_mantissa(ms)
    bound = (1 << 23) // (2 * mq) - 1
    rq = UniformRequantizer(*sm, int(rng.integers(-20, 20)), lo, hi, np.full(o, bound))
    assert rq.short
    v = rng.integers(-bound, bound + 1, (o, n))
    v[:, :200] = rng.integers(-(1 << f), 1 << f, (o, 200))  # around zero: ties and both clamps
    half = 1 << (f + e - 1)  # v = +-2^(f + e_c - 1): v M_c = +-mq / 2, an exact half, a tie
    ties = half <= bound
    v[ties, 200], v[ties, 201] = half[ties], -half[ties]
    v[ties, 202], v[ties, 203] = 3 * half[ties], -3 * half[ties]  # the other parity
    want = np.stack([reference(v[i], 0, ms[i], rq.zp, lo, hi) for i in range(o)])
    x = v * ms[:, None] + rq.eps[:, None]
    scale = np.ldexp(1.0, f + e)[:, None]
    assert np.array_equal((x.astype(np.float32).astype(np.float64) - rq.eps[:, None]) * scale, v * mq)  # exact
    got = np.zeros((o, n), np.int8)
    rq.bind(x.astype(np.float32), None, lambda a: a, got, short=True)()
    np.testing.assert_array_equal(got, want)
    assert ties.any() and np.all((v[ties, 200:204] * ms[ties, None]) % 1 == 0.5)
    assert not rq.eps.any()
