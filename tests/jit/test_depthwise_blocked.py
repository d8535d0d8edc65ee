"""jit.depthwise_blocked (3x3 depthwise, 8 channels a vector) against a float64 numpy reference:
strides 1 and 2 (and mixed), padding on any side, odd plane sizes (transposes with scalar tails),
channel counts that are not a multiple of 8, batches, a dirty scratch, NaN through the clamp."""
import numpy as np
import pytest

from isthmus.jit.gemm_int8 import supported

pytestmark = pytest.mark.skipif(not supported(), reason="the blocked kernel is written for AVX2")


def reference(x, w, b, sh, sw, pads, lo, hi):
    """float64 depthwise 3x3 of x [N*C, H, W] (channel = row % C), zero padded, clamped."""
    r, h, wd = x.shape
    c = w.shape[0]
    (pt, pb), (pl, pr) = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (pt, pb), (pl, pr)))
    oh, ow = (h + pt + pb - 3) // sh + 1, (wd + pl + pr - 3) // sw + 1
    ch = np.arange(r) % c
    out = np.zeros((r, oh, ow)) + b.astype(np.float64)[ch, None, None]
    for i in range(3):
        for j in range(3):
            out += xp[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw] * w[ch, i, j][:, None, None]
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(out), out, np.clip(out, lo, hi))


def blocked(x, c, w, b, sh, sw, pads, lo, hi, scratch_fill=0.0):
    from isthmus.jit.depthwise_blocked import block_weights, blocked_rows, blocked_scratch_elems
    r, h, wd = x.shape
    (pt, pb), (pl, pr) = pads
    hp, wp = h + pt + pb, wd + pl + pr
    oh, ow = (hp - 3) // sh + 1, (wp - 3) // sw + 1
    wb, bb = block_weights(w, b)
    sc = np.full(blocked_scratch_elems(hp, wp, oh, ow), scratch_fill, np.float32)
    out = np.full((r, oh, ow), np.nan, np.float32)
    blocked_rows(x, np.float32(0), c, wb, bb, pt, pl, wp, sh, sw, np.float32(lo), np.float32(hi), False, np.float32(0),
                 np.int32(0), out, sc[:hp * wp * 8], sc[hp * wp * 8:])
    return out


CASES = [  # images, channels, H, W, strides, pads ((top, bottom), (left, right))
    (1, 8, 12, 12, (1, 1), ((1, 1), (1, 1))),  # one full block
    (1, 13, 11, 9, (1, 1), ((1, 1), (1, 1))),  # a full block and a tail of 5; odd sizes
    (1, 21, 13, 17, (2, 2), ((0, 1), (0, 1))),  # stride 2, SAME pads at the end
    (1, 16, 13, 11, (2, 2), ((1, 1), (1, 1))),  # stride 2, odd sizes, two full blocks
    (2, 6, 10, 9, (1, 1), ((0, 0), (0, 0))),  # batch 2, tail only, no padding
    (2, 24, 6, 6, (1, 1), ((1, 1), (1, 1))),  # MobileNet's small planes, batch 2
    (1, 9, 9, 20, (2, 1), ((1, 0), (2, 1))),  # mixed strides, asymmetric pads
    (1, 32, 24, 24, (2, 2), ((1, 1), (1, 1))),  # 24 columns: three whole transposes a row
    # whole-plane transposes that wrap rows: under 8 columns (several wraps in one transpose, the
    # reciprocal division), 8 to 15 (at most one wrap), wide padding gaps
    (1, 16, 7, 5, (1, 1), ((1, 1), (1, 1))),
    (1, 8, 5, 3, (1, 2), ((2, 0), (0, 3))),
    (1, 8, 9, 7, (1, 1), ((0, 2), (3, 0))),
    (1, 8, 3, 13, (1, 1), ((1, 1), (1, 1))),
    (1, 8, 4, 16, (2, 1), ((1, 1), (4, 4))),
]


@pytest.mark.parametrize("n,c,h,wd,strides,pads", CASES)
def test_blocked_against_reference(n, c, h, wd, strides, pads):
    rng = np.random.default_rng(n * 1000 + c * 10 + h)
    x = rng.standard_normal((n * c, h, wd)).astype(np.float32)
    w = rng.standard_normal((c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    for lo, hi in ((-np.inf, np.inf), (0.0, 6.0)):
        want = reference(x, w, b, *strides, pads, lo, hi)
        got = blocked(x, c, w, b, *strides, pads, lo, hi)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dirty_scratch_and_nan():
    """Leftovers in the scratch (an arena's) change nothing; a NaN input gives NaN where it is read."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((11, 9, 10)).astype(np.float32)
    w = rng.standard_normal((11, 3, 3)).astype(np.float32)
    b = rng.standard_normal(11).astype(np.float32)
    pads = ((1, 1), (1, 1))
    clean = blocked(x, 11, w, b, 1, 1, pads, 0.0, 6.0)
    np.testing.assert_array_equal(blocked(x, 11, w, b, 1, 1, pads, 0.0, 6.0, scratch_fill=np.nan), clean)
    x[3, 4, 5] = np.nan
    got = blocked(x, 11, w, b, 1, 1, pads, 0.0, 6.0)
    want = reference(x, w, b, 1, 1, pads, 0.0, 6.0)
    assert np.isnan(got[3, 3:6, 4:7]).all() and np.isnan(got).sum() == 9
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n,c,h,wd,strides,pads", CASES)
def test_blocked_int8_requantized_exactly(n, c, h, wd, strides, pads):
    """int8 input less its zero point, integer weights scaled by 2^-4 (so the sums are exact in float32
    and not integers), requantized in the kernel: equal to an int32 numpy reference of the same rule,
    clamp(acc 2^-4, lo, hi) rounded half to even, plus the output zero point (odd here: the float32
    add of edge.quant.magic_pair's constant rounds before the zero point's odd part is added)."""
    from isthmus.edge.quant import magic_pair
    from isthmus.jit.depthwise_blocked import block_weights, blocked_rows, blocked_scratch_elems
    rng = np.random.default_rng(n * 999 + c * 7 + h)
    zx, zy = -7, 5
    magic, base = magic_pair(zy)
    x = rng.integers(-128, 128, (n * c, h, wd)).astype(np.int8)
    wi = rng.integers(-15, 16, (c, 3, 3)).astype(np.int32)
    bi = rng.integers(-500, 500, c).astype(np.int32)
    (pt, pb), (pl, pr) = pads
    sh, sw = strides
    hp, wp = h + pt + pb, wd + pl + pr
    oh, ow = (hp - 3) // sh + 1, (wp - 3) // sw + 1
    xp = np.pad(x.astype(np.int32) - zx, ((0, 0), (pt, pb), (pl, pr)))  # zero padding of x - zx
    ch = np.arange(n * c) % c
    acc = np.zeros((n * c, oh, ow), np.int32) + bi[ch, None, None]
    for i in range(3):
        for j in range(3):
            acc += xp[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw] * wi[ch, i, j][:, None, None]
    lo, hi = -128.0 - zy, 127.0 - zy
    want = (np.rint(np.clip(acc * 0.0625, lo, hi)) + zy).astype(np.int8)
    assert np.any((acc * 0.0625) % 2 == 0.5) and np.any((acc * 0.0625) % 2 == 1.5)  # ties, both parities
    wb, bb = block_weights((wi * 0.0625).astype(np.float32), (bi * 0.0625).astype(np.float32))
    sc = np.full(blocked_scratch_elems(hp, wp, oh, ow), np.nan, np.float32)
    got = np.zeros((n * c, oh, ow), np.int8)
    blocked_rows(x, np.float32(zx), c, wb, bb, pt, pl, wp, sh, sw, np.float32(lo), np.float32(hi), True,
                 np.float32(magic), np.int32(base), got, sc[:hp * wp * 8], sc[hp * wp * 8:])
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 50  # the clamp does not flatten the test
