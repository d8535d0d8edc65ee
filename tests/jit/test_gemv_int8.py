"""jit.gemv_int8: the int8 matrix-vector product against numpy's int64 product, bit for bit, its
two requantizations against a numpy reference, and the multiply-add instruction it is written for."""
import numpy as np
import pytest

pytest.importorskip("numba")
from isthmus.jit import gemm_int8 as g8  # noqa: E402
from isthmus.jit import gemv_int8 as gv  # noqa: E402

pytestmark = pytest.mark.skipif(not g8.supported(), reason="the kernel needs x86 AVX2")


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 16, 4), (3, 17, 5), (2, 33, 7), (1, 3136, 64), (1, 0, 3)])
def test_gemv_int32_equals_numpy(m, k, n):
    rng = np.random.default_rng(m * 100 + k + n)
    w = rng.integers(-128, 128, (n, k))
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    a16 = np.full(max(gv.activation_elems(k), 1), 31000, np.int16)  # stale scratch: its tail meets zero weights
    out = np.full((m, n), 5, np.int32)
    gv.gemv_int32(gv.pack_weights(w), a, a16, out)
    np.testing.assert_array_equal(out, a.astype(np.int64) @ w.T)


def test_extreme_values_accumulate_without_overflow():
    k = 4096  # (-128)(-128) 4096 times: 2^26, far inside int32 but beyond int16 pairs
    w, a = np.full((5, k), -128), np.full((1, k), -128, np.int8)
    out = np.zeros((1, 5), np.int32)
    gv.gemv_int32(gv.pack_weights(w), a, np.zeros(gv.activation_elems(k), np.int16), out)
    assert (out == 128 * 128 * k).all()


def _round_even_ref(t, s, zp):
    """t 2^-s (t holding zp 2^s) to nearest, ties to the even value less zp: floor, then the remainder."""
    r = t >> s
    frac, half = t - (r << s), np.int64(1) << (s - 1)
    return r + (frac > half) + ((frac == half) & ((r - zp) % 2 == 1))


@pytest.mark.parametrize("pow2,zp", [(False, -128), (True, 0), (True, 3), (True, -7)])
def test_requantizations_match_the_integer_definition(pow2, zp):
    """Both requantizations against a numpy reference, ties to even; pow2: power-of-two multipliers
    (exact ties in many outputs, both parities and signs)."""
    rng = np.random.default_rng(3)
    m, k, n = 3, 70, 40
    r = 5 if pow2 else 128  # power-of-two multipliers: small products, so that the ties are not clamped
    w = rng.integers(-r, r, (n, k))
    a = rng.integers(-r, r, (m, k)).astype(np.int8)
    acc = a.astype(np.int64) @ w.T
    q = np.full(n, 1 << 30) if pow2 else rng.integers(1 << 29, 1 << 30, n)
    s = rng.integers(36, 40, n) if not pow2 else np.full(n, 33 + np.arange(n) % 3)  # M = 2^-3 .. 2^-5
    c = (rng.integers(-30, 30, n) * q) + (np.int64(zp) << s)  # bias q + zp 2^s
    if not pow2:
        c = rng.integers(-1 << 36, 1 << 36, n) + (np.int64(zp) << s)
    t = acc * q + c
    want = np.clip(_round_even_ref(t, s, zp), -128, 127).astype(np.int8)
    if pow2:
        ties = (t & ((np.int64(1) << s) - 1)) == (np.int64(1) << (s - 1))
        assert ties.sum() >= 5 and len({int(v) % 2 for v in ((t >> s) - zp)[ties]}) == 2  # both parities
    w8, a16 = gv.pack_weights(w), np.zeros(gv.activation_elems(k), np.int16)
    got = np.zeros((m, n), np.int8)
    gv.gemv_requantize_int(w8, a, a16, q, c, s, np.int64(zp), -128, 127, got)
    np.testing.assert_array_equal(got, want)
    odd = zp & 1  # the float form: small products, M = 1/4, so that a quarter of the outputs are ties
    w, a = rng.integers(-4, 5, (n, k)), rng.integers(-4, 5, (m, k)).astype(np.int8)
    w8, acc = gv.pack_weights(w), a.astype(np.int64) @ w.T
    mf, cf = np.full(n, 0.25), rng.integers(-400, 400, n) * 0.25 + (zp - odd)
    flo, fhi = -128.0 - odd, 127.0 - odd
    x = acc * mf + cf
    want_f = (np.rint(np.clip(x, flo, fhi)) + odd).astype(np.int8)
    assert np.any(x % 1 == 0.5)  # ties
    gv.gemv_requantize_float(w8, a, a16, mf, cf, flo, fhi, np.int32(-odd), got)
    np.testing.assert_array_equal(got, want_f)


def test_weights_outside_int8_are_refused():
    with pytest.raises(ValueError, match="int8"):
        gv.pack_weights(np.array([[128]]))


def test_the_loop_multiplies_pairs_into_int32_on_256_bit_vectors():
    import numba
    fresh = numba.njit(gv.gemv_int32.py_func)  # not from numba's disk cache: that one cannot show its assembly
    fresh(gv.pack_weights(np.ones((4, 16))), np.ones((1, 16), np.int8), np.zeros(16, np.int16),
          np.zeros((1, 4), np.int32))
    asm = "".join(fresh.inspect_asm(sig) for sig in fresh.signatures)
    assert "vpmaddwd" in asm and "ymm" in asm


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 31, 4), (3, 33, 5), (2, 65, 7), (1, 3136, 66), (1, 0, 3)])
def test_sign_loop_equals_numpy(m, k, n):
    """The sign loop (|a| times w sign(a) in pmaddubsw) against numpy's int64 product at the extremes:
    a = -128 (|a| = 128 as an unsigned byte) and w = +-127 in every pair, odd K and N."""
    rng = np.random.default_rng(m * 1000 + k + n)
    w = rng.choice(np.array([-127, -126, -1, 0, 1, 126, 127]), (n, k))
    a = rng.choice(np.array([-128, -127, -1, 0, 1, 126, 127], np.int8), (m, k))
    w8 = gv.pack_weights(w)
    assert gv.signable(w8)
    ab = np.full(2 * max(gv.activation_elems(k), 1), 77, np.uint8)  # stale scratch
    out = np.full((m, n), 5, np.int32)
    gv.gemv_sign_int32(gv.interleave(w8), a, ab, out)
    np.testing.assert_array_equal(out, a.astype(np.int64) @ w.T)


def test_sign_loop_requantizes_like_the_widening_loop():
    rng = np.random.default_rng(11)
    m, k, n = 2, 300, 37
    w = rng.integers(-127, 128, (n, k))
    a = rng.integers(-128, 128, (m, k)).astype(np.int8)
    w8 = gv.pack_weights(w)
    a16 = np.zeros(gv.activation_elems(k), np.int16)
    q, s = rng.integers(1 << 29, 1 << 30, n), rng.integers(36, 40, n)
    c = rng.integers(-1 << 36, 1 << 36, n) + (np.int64(-3) << s)
    want, got = np.zeros((m, n), np.int8), np.ones((m, n), np.int8)
    gv.gemv_requantize_int(w8, a, a16, q, c, s, np.int64(-3), -128, 127, want)
    gv.gemv_sign_requantize_int(gv.interleave(w8), a, a16.view(np.uint8), q, c, s, np.int64(-3), -128, 127, got)
    np.testing.assert_array_equal(got, want)
    mf, cf = np.full(n, 2.0 ** -9), rng.integers(-400, 400, n) * 0.25
    gv.gemv_requantize_float(w8, a, a16, mf, cf, -128.0, 127.0, np.int32(0), want)
    gv.gemv_sign_requantize_float(gv.interleave(w8), a, a16.view(np.uint8), mf, cf, -128.0, 127.0, np.int32(0), got)
    np.testing.assert_array_equal(got, want)
    assert not gv.signable(gv.pack_weights(np.array([[-128, 3]])))
