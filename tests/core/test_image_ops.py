"""Resize (nearest, linear) against per-pixel loops written from the ONNX formulas; gradients by
finite differences; run-time scales/sizes; Range against numpy."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core.ops.arange import arange
from isthmus.core.ops.image import resize

from .opcheck import check_forward, check_gradients


def _coord(mode, o, n, m, s):
    if mode == "half_pixel":
        return (o + 0.5) / s - 0.5
    if mode == "align_corners":
        return 0.0 if n * s <= 1 else o * (n - 1) / (n * s - 1)
    if mode == "asymmetric":
        return o / s
    return (o + 0.5) / s - 0.5 if n * s > 1 else 0.0  # pytorch_half_pixel


def ref_resize_2d(x, out_hw, scales, mode, coord):
    """Per output pixel: bilinear from the 4 clamped neighbours, or the nearest (round half down)."""
    n, c, h, w = x.shape
    oh, ow = out_hw
    y = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            yi, xj = _coord(coord, i, h, oh, scales[0]), _coord(coord, j, w, ow, scales[1])
            if mode == "nearest":
                a = int(min(max(np.ceil(yi - 0.5), 0), h - 1))
                b = int(min(max(np.ceil(xj - 0.5), 0), w - 1))
                y[:, :, i, j] = x[:, :, a, b]
                continue
            yi, xj = min(max(yi, 0), h - 1), min(max(xj, 0), w - 1)
            a0, b0 = int(np.floor(yi)), int(np.floor(xj))
            a1, b1 = min(a0 + 1, h - 1), min(b0 + 1, w - 1)
            fa, fb = yi - a0, xj - b0
            y[:, :, i, j] = ((1 - fa) * (1 - fb) * x[:, :, a0, b0] + (1 - fa) * fb * x[:, :, a0, b1]
                             + fa * (1 - fb) * x[:, :, a1, b0] + fa * fb * x[:, :, a1, b1])
    return y


CASES = [  # mode, coordinate mode, scales (h, w)
    ("nearest", "asymmetric", (2.0, 3.0)),
    ("nearest", "half_pixel", (0.5, 1.5)),
    ("linear", "half_pixel", (2.0, 1.75)),
    ("linear", "align_corners", (1.5, 0.6)),
    ("linear", "pytorch_half_pixel", (0.5, 2.0)),
    ("linear", "asymmetric", (3.0, 0.75)),
]


@pytest.mark.parametrize("mode,coord,sc", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_resize_forward_and_gradient(mode, coord, sc):
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5))
    out = (int(4 * sc[0]), int(5 * sc[1]))
    build = lambda x_: resize(x_, scales=(1.0, 1.0) + sc, mode=mode, coordinate_mode=coord)  # noqa: E731
    check_forward(build, [x], lambda x_: ref_resize_2d(x_, out, sc, mode, coord), rtol=1e-12, atol=1e-12)
    check_gradients(build, [x])


def test_resize_run_time_sizes_and_scales():
    x = np.random.default_rng(1).standard_normal((1, 2, 3, 4)).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        xp = ism.placeholder(np.float32, (None, 2, None, None))
        sz = ism.placeholder(np.int64, (2,))
        sc = ism.placeholder(np.float32, (4,))
        a = resize(xp, param=sz, param_kind="sizes", axes=(2, 3), mode="linear")
        b = resize(xp, param=sc, param_kind="scales", mode="nearest", coordinate_mode="asymmetric")
        assert a.shape == (None, 2, None, None)
    sess = ism.Session(g)
    for size in ((6, 8), (2, 7)):
        got = sess.run(a, {xp: x, sz: np.array(size, np.int64)})
        np.testing.assert_allclose(got, ref_resize_2d(x.astype(np.float64), size, (size[0] / 3, size[1] / 4),
                                                      "linear", "half_pixel"), rtol=1e-5, atol=1e-6)
    got = sess.run(b, {xp: x, sc: np.array([1, 1, 2, 2], np.float32)})
    np.testing.assert_array_equal(got, x.repeat(2, axis=2).repeat(2, axis=3))
    with pytest.raises(ism.IsthmusError, match="scale"):
        sess.run(b, {xp: x, sc: np.array([1, 1, -2, 2], np.float32)})
    with pytest.raises(ism.IsthmusError, match="more than 2"):  # refused before allocating
        sess.run(b, {xp: x, sc: np.array([1, 1, 3e4, 3e4], np.float32)})


def ref_cubic_1d(v, m, scale, a=-0.75, exclude=False):
    """Keys' cubic convolution along the last axis, half_pixel, one output at a time."""
    n = v.shape[-1]
    out = np.zeros(v.shape[:-1] + (m,))
    for o in range(m):
        x = (o + 0.5) / scale - 0.5
        x0 = int(np.floor(x))
        acc, norm = 0.0, 0.0
        for k in range(-1, 3):
            d = abs(x - (x0 + k))
            w = ((a + 2) * d - (a + 3)) * d * d + 1 if d <= 1 else ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
            if exclude and not 0 <= x0 + k < n:
                continue
            acc = acc + w * v[..., min(max(x0 + k, 0), n - 1)]
            norm += w
        out[..., o] = acc / norm if exclude else acc
    return out


@pytest.mark.parametrize("a,exclude", [(-0.75, False), (-0.5, True)])
def test_cubic_resize_forward_and_gradient(a, exclude):
    x = np.random.default_rng(3).standard_normal((1, 2, 5, 6))
    build = lambda x_: resize(x_, scales=(1, 1, 1.6, 0.5), mode="cubic", cubic_coeff_a=a,  # noqa: E731
                              exclude_outside=exclude)
    ref = lambda x_: np.swapaxes(ref_cubic_1d(np.swapaxes(ref_cubic_1d(x_, 3, 0.5, a, exclude), 2, 3), 8, 1.6, a,  # noqa: E731
                                                           exclude), 2, 3)
    check_forward(build, [x], ref, rtol=1e-10, atol=1e-12)
    check_gradients(build, [x])


def test_resize_rejects_unknown_modes():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(np.float32, (1, 1, 2, 2))
        with pytest.raises(ism.ShapeError, match="lanczos"):
            resize(x, scales=(1, 1, 2, 2), mode="lanczos")
        with pytest.raises(ism.ShapeError, match="4 .*rank-4|1 scales"):
            resize(x, scales=(2.0,))


@pytest.mark.parametrize("start,limit,delta,dtype", [(0, 10, 3, np.int32), (10, -2, -4, np.int64),
                                                     (1.0, 2.0, 0.3, np.float32), (5, 1, 1, np.int32)])
def test_range(start, limit, delta, dtype):
    vals = [np.array(v, dtype) for v in (start, limit, delta)]
    want = vals[0] + np.arange(max(int(np.ceil((float(limit) - start) / delta)), 0)).astype(dtype) * vals[2]
    check_forward(lambda a, b, c: arange(a, b, c), vals, lambda a, b, c: want.astype(dtype), rtol=1e-6, atol=0)
    g = ism.Graph()
    with g.as_default():
        r = arange(ism.constant(vals[0]), ism.constant(vals[1]), ism.constant(vals[2]))
    assert r.shape == want.shape  # constant bounds: a known length


def test_range_zero_delta_is_a_clear_error():
    g = ism.Graph()
    with g.as_default():
        d = ism.placeholder(np.int32, ())
        r = arange(0, 5, d)
    with pytest.raises(ism.IsthmusError, match="delta is 0"):
        ism.Session(g).run(r, {d: np.int32(0)})
