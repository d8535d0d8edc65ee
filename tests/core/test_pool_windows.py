"""The compiled max pool over any window (jit.pool_windows) against a window-by-window numpy
reference: strides, dilations, asymmetric and SAME padding, batch 1 and 32, NaN, float64; 3x3 float32
pools on 16+ planes through the channel-blocked kernel (jit.pool_blocked), the others per plane."""
import numpy as np
import pytest

import isthmus as ism
from isthmus import jit
from isthmus.core.ops import pool
from isthmus.jit.gemm_int8 import supported

pytestmark = [pytest.mark.skipif(not jit.available(), reason="needs numba"), pytest.mark.cpu]


def ref_max_pool(x, k, s, d, pads):
    """Each window's maximum, one output element at a time over a -inf padded copy (np.max: a NaN
    in the window gives NaN)."""
    (t, b), (l, r) = pads
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=-np.inf)
    oh = (xp.shape[2] - (k[0] - 1) * d[0] - 1) // s[0] + 1
    ow = (xp.shape[3] - (k[1] - 1) * d[1] - 1) // s[1] + 1
    out = np.empty(x.shape[:2] + (oh, ow), x.dtype)
    for i in range(oh):
        for j in range(ow):
            ys = slice(i * s[0], i * s[0] + (k[0] - 1) * d[0] + 1, d[0])
            xs = slice(j * s[1], j * s[1] + (k[1] - 1) * d[1] + 1, d[1])
            out[:, :, i, j] = xp[:, :, ys, xs].max(axis=(2, 3))
    return out


def _run(x, k, s, d, padding):
    g = ism.Graph()
    with g.as_default():
        xt = ism.placeholder(x.dtype, x.shape, name="x")
        y = ism.max_pool(xt, ksize=k, strides=s, padding=padding, dilations=d)
    return ism.Session(g).run(y, {xt: x}), y.node.attrs["pads"]


CASES = [  # ksize, strides, dilations, padding, shape
    ((3, 3), (2, 2), (1, 1), "VALID", (1, 64, 47, 47)),  # SqueezeNet's pools (odd plane)
    ((3, 3), (2, 2), (1, 1), "VALID", (32, 8, 12, 12)),
    ((3, 3), (1, 1), (1, 1), "SAME", (1, 24, 16, 16)),  # Inception's branch pool
    ((3, 3), (1, 1), (1, 1), "SAME", (32, 5, 8, 8)),
    ((3, 3), (2, 2), (1, 1), "SAME", (2, 3, 9, 10)),
    ((2, 3), (3, 1), (2, 2), ((1, 2), (0, 1)), (2, 3, 11, 9)),  # dilated, asymmetric padding, stride 3
    ((1, 1), (1, 1), (1, 1), "VALID", (1, 2, 5, 5)),
    ((5, 4), (1, 3), (1, 1), ((2, 2), (3, 0)), (1, 2, 6, 7)),  # windows that reach only padding rows
    ((2, 2), (2, 2), (1, 1), ((1, 1), (1, 1)), (2, 4, 6, 6)),  # padded 2x2: not the tiled fast path
    ((3, 3), (2, 2), (1, 1), ((0, 1), (0, 1)), (1, 16, 12, 12)),  # SqueezeNet's ceil-mode pad, row by row
    ((5, 3), (2, 3), (1, 2), ((4, 4), (1, 2)), (1, 2, 5, 7)),  # stride 2: windows of only padding rows
    ((4, 1), (3, 2), (2, 1), ((3, 0), (0, 0)), (2, 3, 10, 6)),  # 4 dilated rows (the general row loop)
    # 3x3 float32 on 16+ planes: 8 channels at a time (jit.pool_blocked), a short last block of 5
    ((3, 3), (2, 2), (1, 1), ((0, 1), (0, 1)), (1, 21, 12, 12)),
    ((3, 3), (1, 1), (1, 1), "SAME", (2, 12, 7, 9)),
    ((3, 3), (2, 1), (1, 1), ((2, 0), (1, 2)), (1, 16, 5, 6)),  # rows of only padding, asymmetric
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k,s,d,padding,shape", CASES)
def test_compiled_max_pool_matches_the_window_reference(k, s, d, padding, shape, dtype, monkeypatch):
    calls = []
    for name in ("_max_pool_windows_compiled", "_blocked_runner"):
        real = getattr(pool, name)
        monkeypatch.setattr(pool, name, lambda a, g, _real=real, _n=name: calls.append(_n) or _real(a, g))
    x = np.random.default_rng(len(calls) + shape[2]).standard_normal(shape).astype(dtype)
    got, pads = _run(x, k, s, d, padding)
    np.testing.assert_array_equal(got, ref_max_pool(x, k, s, d, pads))
    blocked = (k, d) == ((3, 3), (1, 1)) and dtype == np.float32 and shape[0] * shape[1] >= 16 and supported()
    assert calls == ["_blocked_runner" if blocked else "_max_pool_windows_compiled"], calls


@pytest.mark.parametrize("channels", [2, 16])  # the plane kernel and the blocked one
def test_a_nan_in_a_window_gives_nan_there_only(channels):
    x = np.random.default_rng(7).standard_normal((1, channels, 9, 9)).astype(np.float32)
    x[0, 1, 4, 4] = np.nan
    got, pads = _run(x, (3, 3), (2, 2), (1, 1), "VALID")
    want = ref_max_pool(x, (3, 3), (2, 2), (1, 1), pads)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).sum() == 4  # (4, 4) lies in four 3x3 windows at stride 2
    np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def test_integers_keep_the_numpy_taps():
    x = np.random.default_rng(2).integers(-100, 100, (1, 3, 7, 7)).astype(np.int32)
    got, pads = _run(x, (3, 3), (2, 2), (1, 1), "SAME")
    np.testing.assert_array_equal(got, ref_max_pool(x.astype(np.float64), (3, 3), (2, 2), (1, 1), pads)
                                  .astype(np.int32))


def test_blocked_runner_is_reused_and_jit_off_leaves_it(monkeypatch):
    """The runner built for a shape serves its later calls; ISTHMUS_JIT=0 takes numpy's taps."""
    made = []
    real = pool._blocked_runner
    monkeypatch.setattr(pool, "_blocked_runner", lambda shape, g: made.append(shape) or real(shape, g))
    g = ism.Graph()
    with g.as_default():
        xt = ism.placeholder("float32", (1, 16, 9, 9), name="x")
        y = ism.max_pool(xt, ksize=3, strides=2, padding="SAME")
    sess = ism.Session(g)
    rng = np.random.default_rng(4)
    for _ in range(3):
        x = rng.standard_normal((1, 16, 9, 9)).astype(np.float32)
        np.testing.assert_array_equal(sess.run(y, {xt: x}), ref_max_pool(x, (3, 3), (2, 2), (1, 1), y.node.attrs["pads"]))
    monkeypatch.setenv("ISTHMUS_JIT", "0")
    x = rng.standard_normal((1, 16, 9, 9)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(y, {xt: x}), ref_max_pool(x, (3, 3), (2, 2), (1, 1), y.node.attrs["pads"]))
    assert made == ([(1, 16, 9, 9)] if supported() else [])
