"""jit.depthwise.depthwise_rows with caller-owned scratch (an interpreter's arena): a dirty buffer
gives the result of a fresh one, and a buffer too small or of another dtype is refused."""
import numpy as np
import pytest

from isthmus.jit.depthwise import depthwise_rows, scratch_elems  # numba is a dependency: no skip


class Geometry:
    def __init__(self, k, s, d, pads):
        self.kh = self.kw = k
        self.sh = self.sw = s
        self.dh = self.dw = d
        self.pads = pads


def reference(x, w, b, g, lo, hi):
    r, h, wd = x.shape
    c, kh, kw = w.shape
    (pt, pb), (pl, pr) = g.pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - (kh - 1) * g.dh - 1) // g.sh + 1
    ow = (wd + pl + pr - (kw - 1) * g.dw - 1) // g.sw + 1
    out = np.zeros((r, oh, ow)) + b[np.arange(r) % c, None, None]
    for i in range(kh):
        for j in range(kw):
            win = xp[:, i * g.dh:i * g.dh + (oh - 1) * g.sh + 1:g.sh, j * g.dw:j * g.dw + (ow - 1) * g.sw + 1:g.sw]
            out += win * w[np.arange(r) % c, i, j][:, None, None]
    return np.clip(out, lo, hi)


@pytest.mark.parametrize("k,s,d,pads", [(3, 1, 1, ((1, 1), (1, 1))), (3, 2, 1, ((0, 1), (0, 1))),
                                        (3, 2, 1, ((1, 1), (1, 1))), (5, 1, 2, ((4, 4), (4, 4))),
                                        (3, 3, 1, ((2, 0), (1, 2)))])
def test_dirty_scratch_gives_the_fresh_result(k, s, d, pads):
    rng = np.random.default_rng(k * 10 + s)
    x = rng.standard_normal((6, 11, 10)).astype(np.float32)
    w = rng.standard_normal((3, k, k)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    g = Geometry(k, s, d, pads)
    want = reference(x, w, b, g, 0.0, 6.0)
    fresh = np.empty(want.shape, np.float32)
    depthwise_rows(x, w, b, g, 0.0, 6.0, fresh, 0, 6)
    scratch = np.full(scratch_elems(x.shape, w.shape, g) + 5, np.nan, np.float32)  # an arena's leftovers
    dirty = np.empty(want.shape, np.float32)
    depthwise_rows(x, w, b, g, 0.0, 6.0, dirty, 0, 6, scratch)
    np.testing.assert_array_equal(dirty, fresh)
    np.testing.assert_allclose(fresh, want, rtol=2e-5, atol=2e-5)


def test_scratch_too_small_or_of_another_dtype_is_refused():
    g = Geometry(3, 1, 1, ((1, 1), (1, 1)))
    x = np.ones((2, 5, 5), np.float32)
    w = np.ones((2, 3, 3), np.float32)
    out = np.empty((2, 5, 5), np.float32)
    need = scratch_elems(x.shape, w.shape, g)
    with pytest.raises(ValueError, match=f"at least {need} elements"):
        depthwise_rows(x, w, None, g, 0.0, 6.0, out, 0, 2, np.empty(need - 1, np.float32))
    with pytest.raises(ValueError, match="float32"):
        depthwise_rows(x, w, None, g, 0.0, 6.0, out, 0, 2, np.empty(need, np.float64))
