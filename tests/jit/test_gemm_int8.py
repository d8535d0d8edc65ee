"""jit.gemm_int8: the packed int8 GEMM against numpy's int64 product, bit for bit, and the
multiply-add instructions it is written for."""
import numpy as np
import pytest

pytest.importorskip("numba")
from isthmus.jit import gemm_int8 as g8  # noqa: E402

pytestmark = pytest.mark.skipif(not g8.supported(), reason="the micro-kernel needs x86 AVX2")


@pytest.mark.parametrize("o,k,p", [(1, 1, 1), (4, 2, 16), (5, 3, 17), (13, 27, 40), (96, 16, 2304 // 8), (7, 577, 33)])
def test_gemm_int32_equals_numpy(o, k, p):
    rng = np.random.default_rng(o * 1000 + k)
    w = rng.integers(-255, 256, (o, k))  # int8 less a zero point: int16 weights
    x = rng.integers(-128, 128, (k, p)).astype(np.int8)
    xp = np.full(g8.packed_shape(k, p), 12345, np.int32)  # stale scratch: padding must not matter
    g8.pack_rows(x, xp)
    w32 = g8.pack_weights(w)
    acc, out = np.full((w32.shape[0], g8.NR), 7, np.int32), np.empty((o, p), np.int32)
    g8.gemm_int32(w32, xp, acc, out)
    np.testing.assert_array_equal(out, w @ x.astype(np.int64))


@pytest.mark.parametrize("c,h,w,kh,kw,sh,sw,dh,dw,pads", [(2, 5, 6, 3, 2, 2, 1, 1, 2, (1, 1, 2, 1)),
                                                         (3, 7, 7, 3, 3, 2, 3, 1, 1, (0, 2, 4, 0)),
                                                         (1, 4, 3, 1, 5, 1, 1, 1, 1, (0, 0, 2, 2)),
                                                         (3, 9, 40, 3, 3, 2, 2, 1, 1, (1, 1, 1, 1)),
                                                         (32, 14, 14, 5, 5, 1, 1, 1, 1, (2, 2, 2, 2)),
                                                         (1, 3, 37, 2, 3, 1, 2, 2, 1, (0, 0, 0, 0))])
def test_im2col_pairs_pads_with_the_zero_point(c, h, w, kh, kw, sh, sw, dh, dw, pads):
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 128, (c, h, w)).astype(np.int8)
    zx, (pt, pb, pl, pr) = -3, pads
    oh, ow = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1, (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    k, p = c * kh * kw, oh * ow
    hp, wp = h + pt + pb, w + pl + pr
    flat = np.full(c * hp * wp + g8.cols_slack(sw), 77, np.int8)  # stale scratch
    xpad = flat[:c * hp * wp].reshape(c, hp, wp)
    g8.pad_planes(x, np.int8(zx), pt, pl, xpad)
    padded = np.pad(x, ((0, 0), (pt, pb), (pl, pr)), constant_values=zx)
    np.testing.assert_array_equal(xpad, padded)
    kp, p16 = g8.packed_shape(k, p)
    xq = np.full((kp + 1) * p16, 12345, np.int32)
    g8.im2col_pairs(flat, c, hp, wp, kh, kw, sh, sw, dh, dw, oh, ow, xq)
    cols = np.empty((k, p), np.int8)
    for ci in range(c):
        for i in range(kh):
            for j in range(kw):
                want = padded[ci, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
                cols[(ci * kh + i) * kw + j] = want.reshape(-1)
    packed = np.full((kp, p16), 12345, np.int32)
    g8.pack_rows(cols, packed)  # the two-pass packing: im2col columns, then pairs
    np.testing.assert_array_equal(xq.reshape(kp + 1, p16)[:kp, :p], packed[:, :p])


@pytest.mark.parametrize("o", [4, 8, 12, 16, 20, 28, 30, 64])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("p", [41, 36])  # last column block 9 wide (16-column tile) or 4 (8-column tile)
@pytest.mark.parametrize("flo,fhi", [(-129.0, 126.0), (-20.0, 50.0)])  # int8's own bounds (the packs clamp), or relu-like
def test_requantized_rows_in_six_and_four_row_tiles(o, dtype, p, flo, fhi):
    """gemm_requantize_float with rows in 6-row tiles, then 4-row tiles, then scalar rows (o % 4),
    and a last short column block: equal to the same float64 formula in numpy, rounded half to even
    before an odd zero point (3: cf holds its even part 2, off = -1 adds the rest)."""
    rng = np.random.default_rng(o)
    k = 37
    w = rng.integers(-255, 256, (o, k))
    x = rng.integers(-128, 128, (k, p)).astype(np.int8)
    xp = np.zeros(g8.packed_shape(k, p), np.int32)
    g8.pack_rows(x, xp)
    w32 = g8.pack_weights(w)
    e = rng.integers(9, 13, o)
    mf = np.ldexp(1.0, -e).astype(dtype)  # exact in float32 too
    cf = (rng.integers(-400, 400, o) * np.where(np.arange(o) % 2, 0.25, 1.0) + 2).astype(dtype)
    x[:, 0], x[0, 0] = 0, 1  # column 0: acc = w[:, 0] = odd 2^(e - 1), a tie in every row with an integer cf
    w[:, 0] = (2 * rng.integers(-3, 3, o) + 1) << (e - 1)
    xp[:] = 0
    g8.pack_rows(x, xp)
    w32 = g8.pack_weights(w)
    acc, out = np.zeros((w32.shape[0], g8.NR), np.int32), np.zeros(o * p, np.int8)
    g8.gemm_requantize_float(w32, xp, acc, mf, cf, flo, fhi, np.int32(-1), out, o, p, p, 1)
    t = (w @ x.astype(np.int64)).astype(np.float64) * mf[:, None].astype(np.float64) + cf[:, None].astype(np.float64)
    want = (np.rint(np.clip(t, flo, fhi)) + 1).astype(np.int8)
    assert np.count_nonzero(t % 2 == 0.5) >= 1 and np.count_nonzero(t % 2 == 1.5) >= 1  # exact ties, both parities
    np.testing.assert_array_equal(out.reshape(o, p), want)
    assert len(np.unique(want)) > 20 and np.any(t < flo) and np.any(t > fhi)  # both clamps bite


def test_the_micro_kernel_multiplies_pairs_into_int32():
    """pmaddwd (or, on VNNI hosts, its fused form vpdpwssd) in the compiled loop."""
    w32 = g8.pack_weights(np.ones((4, 2), np.int64))
    xp = np.zeros(g8.packed_shape(2, 16), np.int32)
    acc, out = np.zeros((4, g8.NR), np.int32), np.zeros((4, 16), np.int32)
    import numba
    fresh = numba.njit(g8.gemm_int32.py_func)  # not from numba's disk cache: that one cannot show its assembly
    fresh(w32, xp, acc, out)
    asm = "".join(fresh.inspect_asm(sig) for sig in fresh.signatures)
    assert "vpmaddwd" in asm or "vpdpwssd" in asm


def _conv_int64(x, w, zx, pads, strides, dil):
    """A plain numpy convolution of one image in int64: x [C, H, W] padded with zx, w [O, C, kh, kw]."""
    (pt, pb, pl, pr), (sh, sw), (dh, dw) = pads, strides, dil
    padded = np.pad(x.astype(np.int64), ((0, 0), (pt, pb), (pl, pr)), constant_values=zx)
    o, c, kh, kw = w.shape
    oh, ow = (padded.shape[1] - (kh - 1) * dh - 1) // sh + 1, (padded.shape[2] - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((o, oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            win = padded[:, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
            out += np.einsum("oc,cyx->oyx", w[:, :, i, j].astype(np.int64), win)
    return out


@pytest.mark.parametrize("c,h,w,o,kh,kw,sh,sw,dh,dw,pads", [(2, 5, 6, 5, 3, 2, 2, 1, 1, 2, (1, 1, 2, 1)),
                                                           (4, 7, 7, 7, 3, 3, 2, 3, 1, 1, (0, 2, 4, 0)),
                                                           (6, 9, 40, 13, 3, 3, 2, 2, 1, 1, (1, 1, 1, 1)),
                                                           (32, 14, 14, 64, 5, 5, 1, 1, 1, 1, (2, 2, 2, 2)),
                                                           (2, 3, 37, 3, 2, 3, 1, 2, 2, 1, (0, 0, 0, 0)),
                                                           (8, 6, 6, 9, 3, 3, 1, 1, 1, 1, (1, 1, 1, 1))])
def test_channel_pair_conv_equals_numpy(c, h, w, o, kh, kw, sh, sw, dh, dw, pads):
    """pad_channel_pairs + im2col_channel_pairs + the GEMM over pair_weights against a numpy int64
    convolution (zero point in the border, odd output sizes, strides 1-3, dilation, extremes)."""
    rng = np.random.default_rng(c * 7 + o)
    x = rng.choice(np.array([-128, -127, -1, 0, 1, 127], np.int8), (c, h, w))
    wt = rng.integers(-127, 128, (o, c, kh, kw))
    zx, (pt, pb, pl, pr) = -5, pads
    want = _conv_int64(x, wt, zx, pads, (sh, sw), (dh, dw))
    oh, ow = want.shape[1:]
    hp, wp = h + pt + pb, w + pl + pr
    xc = np.full(g8.channel_pairs_elems(c, hp, wp), 4321, np.int32)  # stale scratch
    g8.pad_channel_pairs(x, np.int8(zx), pt, pl, hp, wp, xc)
    kp, p16 = g8.packed_shape(c * kh * kw, oh * ow)
    xq = np.full((kp + 1) * p16, 12345, np.int32)
    g8.im2col_channel_pairs(xc, c // 2, hp, wp, kh, kw, sh, sw, dh, dw, oh, ow, xq)
    w32 = g8.pack_weights(g8.pair_weights(wt))
    got = np.zeros((o, oh * ow), np.int32)
    g8.gemm_int32(w32, xq.reshape(kp + 1, p16)[:kp], np.zeros((w32.shape[0], g8.NR), np.int32), got)
    np.testing.assert_array_equal(got, want.reshape(o, -1))


@pytest.mark.parametrize("c,pads,strides,k", [(4, (1, 2, 0, 1), (1, 1), 3), (3, (1, 1, 1, 1), (2, 2), 3),
                                              (6, (0, 0, 0, 0), (1, 1), 1)])
def test_one_call_convolutions_equal_numpy(c, pads, strides, k):
    """conv_channel_pairs_float (even C), conv_tap_pairs_float (odd C) and conv_pointwise_float (1x1)
    against a numpy int64 convolution requantized by the same float64 formula (exact: power-of-two
    multipliers), zero point in the border, ties at an odd zero point (off = -1)."""
    rng = np.random.default_rng(c + k)
    h, w, o = 7, 9, 11
    x = rng.integers(-128, 128, (c, h, w)).astype(np.int8)
    wt = rng.integers(-127, 128, (o, c, k, k))
    zx, (pt, pb, pl, pr), (sh, sw) = -7, pads, strides
    acc = _conv_int64(x, wt, zx, pads, strides, (1, 1))
    oh, ow = acc.shape[1:]
    mf, cf = np.ldexp(1.0, -rng.integers(5, 8, o)), rng.integers(-40, 40, o) * 0.5 + 2
    want = (np.rint(np.clip(acc * mf[:, None, None] + cf[:, None, None], -129.0, 126.0)) + 1).astype(np.int8)
    hp, wp, p = h + pt + pb, w + pl + pr, oh * ow
    geo = np.array([zx, pt, pl, hp, wp, c, k, k, sh, sw, 1, 1, oh, ow, o, p, -1], np.int64)
    assert len(geo) == len(g8.GEO_FIELDS)
    fl = np.array([-129.0, 126.0])
    kp, p16 = g8.packed_shape(c * k * k, p)
    out, acc32 = np.zeros(o * p, np.int8), np.zeros((-(-o // 4) * 4, g8.NR), np.int32)
    if k == 1:
        w32 = g8.pack_weights(wt.reshape(o, c))
        g8.conv_pointwise_float(x.reshape(c, -1), np.zeros((kp, p16), np.int32), w32, acc32, mf, cf, out, geo, fl)
    elif c % 2 == 0:
        xc = np.full(g8.channel_pairs_elems(c, hp, wp), 99, np.int32)
        w32 = g8.pack_weights(g8.pair_weights(wt))
        g8.conv_channel_pairs_float(x, xc, np.full((kp + 1) * p16, 7, np.int32), w32, acc32, mf, cf, out, geo, fl)
    else:
        flat = np.full(c * hp * wp + g8.cols_slack(sw), 5, np.int8)
        w32 = g8.pack_weights(wt.reshape(o, -1))
        g8.conv_tap_pairs_float(x, flat, np.full((kp + 1) * p16, 7, np.int32), w32, acc32, mf, cf, out, geo, fl)
    np.testing.assert_array_equal(out.reshape(o, oh, ow), want)
    assert len(np.unique(want)) > 20
