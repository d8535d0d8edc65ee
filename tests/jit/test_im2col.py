"""jit.im2col's vector runs (8-element copies, the last one overlapping; stride 2 from 16-element
loads) against numpy's strided windows: run lengths around and past 8, strides 1, 2 and 3, a plane
that ends where the last window does (the stride-2 vector path must not read past it), int8 too."""
import numpy as np
import pytest

from isthmus import jit

pytestmark = pytest.mark.skipif(not jit.available(), reason="needs numba")


def windows(pad, kh, kw, sh, sw, dh, dw, oh, ow):
    return np.stack([pad[ch, ky * dh:ky * dh + (oh - 1) * sh + 1:sh, kx * dw:kx * dw + (ow - 1) * sw + 1:sw].reshape(-1)
                     for ch in range(pad.shape[0]) for ky in range(kh) for kx in range(kw)])


@pytest.mark.parametrize("ow", [1, 7, 8, 9, 14, 16, 17, 31])
@pytest.mark.parametrize("k,s,d", [(3, 1, 1), (5, 1, 1), (3, 2, 1), (2, 2, 1), (3, 3, 1), (3, 1, 2)])
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_runs_against_numpy(ow, k, s, d, dtype):
    from isthmus.jit.im2col import im2col
    rng = np.random.default_rng(ow * 10 + k + s)
    c, oh = 2, 3
    hp, wp = (oh - 1) * s + (k - 1) * d + 1, (ow - 1) * s + (k - 1) * d + 1  # the plane ends at the last window
    pad = rng.integers(-100, 100, (c, hp, wp)).astype(dtype)
    cols = np.full((c * k * k, oh * ow), 77, dtype)
    im2col(pad.reshape(c, hp * wp), wp, k, k, s, s, d, d, cols, oh, ow)
    np.testing.assert_array_equal(cols, windows(pad, k, k, s, s, d, d, oh, ow))


@pytest.mark.parametrize("h,w,t,b,l,r", [(14, 14, 2, 2, 2, 2), (9, 23, 1, 0, 0, 1), (16, 16, 0, 0, 0, 0)])
def test_padded_gather_against_numpy(h, w, t, b, l, r):
    from isthmus.jit.im2col import im2col_ld
    rng = np.random.default_rng(h + w)
    c, k, s = 3, 3, 1
    x = rng.standard_normal((c, h, w)).astype(np.float32)
    xp = np.pad(x, ((0, 0), (t, b), (l, r)))
    oh, ow = xp.shape[1] - k + 1, xp.shape[2] - k + 1
    cols = np.full((c * k * k, oh * ow + 5), np.nan, np.float32)
    geo = np.array([k, k, s, s, 1, 1, t, b, l, r, oh, ow], np.int64)
    im2col_ld(x.reshape(c, h * w), h, w, geo, cols)
    np.testing.assert_array_equal(cols[:, :oh * ow], windows(xp, k, k, s, s, 1, 1, oh, ow))
    assert np.isnan(cols[:, oh * ow:]).all()  # nothing written past the row's columns
