"""Depthwise convolution gradients (Conv2DBackpropInput / Conv2DBackpropFilter with one filter per
channel) on both kernel paths, the compiled one (isthmus.jit) and numpy's (ISTHMUS_JIT=0), against
a float64 reference written tap by tap, and by finite differences."""
import itertools
import zlib

import numpy as np
import pytest

import isthmus as ism
from isthmus.core.ops import depthwise

from .opcheck import check_gradients
from .test_conv_forward import kernel_path  # noqa: F401  (the fixture: both kernel paths)


def ref_grads(x, w, dy, stride, pads, dil):
    """float64 dx and dw of y = depthwise_conv(x, w): each tap's strided input window times dy."""
    x, w, dy = (a.astype(np.float64) for a in (x, w, dy))
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple(pads))
    dxp = np.zeros_like(xp)
    dw = np.zeros(w.shape)
    oh, ow = dy.shape[2:]
    for a in range(kh):
        for e in range(kw):
            ys = slice(a * dil[0], a * dil[0] + (oh - 1) * stride[0] + 1, stride[0])
            xs = slice(e * dil[1], e * dil[1] + (ow - 1) * stride[1] + 1, stride[1])
            dxp[:, :, ys, xs] += dy * w[:, 0, a, e].reshape(1, c, 1, 1)
            dw[:, 0, a, e] = (xp[:, :, ys, xs] * dy).sum(axis=(0, 2, 3))
    (t, _), (l, _) = pads
    return dxp[:, :, t:t + h, l:l + wd], dw


def run_grads(x, w, dy, strides, padding, dil, dtype):
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder(dtype, x.shape, name="x")
        wt = ism.placeholder(dtype, w.shape, name="w")
        y = ism.conv2d(xt, wt, strides=strides, padding=padding, dilations=dil, groups=x.shape[1])
        dyt = ism.placeholder(dtype, tuple(y.shape), name="dy")
        gx, gw = ism.gradients(y, [xt, wt], grad_ys=[dyt])
        out = ism.Session(g).run([gx, gw], {xt: x, wt: w, dyt: dy})
    return out, y.node.attrs["pads"], tuple(y.shape)


CASES = list(itertools.product([(3, 3), (5, 5), (1, 3)], [1, 2, (2, 1), 3], ["SAME", "VALID", ((2, 0), (1, 2))],
                               [1, 2]))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("k,strides,padding,dil", CASES[::4] + [CASES[-1]])
def test_depthwise_gradients_against_reference(kernel_path, dtype, k, strides, padding, dil):  # noqa: F811
    rng = np.random.default_rng(zlib.crc32(repr((k, strides, padding, dil)).encode()))  # hash() of a str is salted per process
    c = 5
    x = rng.standard_normal((3, c, 11, 9)).astype(dtype)
    w = rng.standard_normal((c, 1) + k).astype(dtype)
    s = (strides, strides) if isinstance(strides, int) else strides
    with ism.Graph(seed=0).as_default():
        yshape = tuple(ism.conv2d(ism.placeholder(dtype, x.shape), ism.constant(w), strides=strides, padding=padding,
                                  dilations=dil, groups=c).shape)
    dy = rng.standard_normal(yshape).astype(dtype)
    (gx, gw), pads, _ = run_grads(x, w, dy, strides, padding, dil, dtype)
    want_x, want_w = ref_grads(x, w, dy, s, pads, (dil, dil))
    tol = 2e-5 if dtype == "float32" else 1e-12
    assert gx.dtype == np.dtype(dtype) and gw.dtype == np.dtype(dtype)
    np.testing.assert_allclose(gx, want_x, rtol=tol, atol=tol)
    np.testing.assert_allclose(gw, want_w, rtol=tol, atol=tol * 10)


def test_depthwise_gradients_by_finite_differences(kernel_path):  # noqa: F811
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 6, 5))
    w = rng.standard_normal((3, 1, 3, 3))
    for strides in (1, 2):
        check_gradients(lambda x_, w_: ism.conv2d(x_, w_, strides=strides, padding="SAME", groups=3), [x, w])


def test_compiled_gradients_on_threads_match_one_thread(monkeypatch):
    """Row ranges on threads (each with its own filter accumulator) give the one-thread result."""
    monkeypatch.setenv("ISTHMUS_JIT", "1")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((4, 6, 10, 10)).astype(np.float32)
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    dy = rng.standard_normal((4, 6, 5, 5)).astype(np.float32)
    monkeypatch.setattr(depthwise, "THREAD_MIN_MACS", 0)
    monkeypatch.setattr(depthwise, "_MAX_THREADS", 3)
    outs = {}
    for t in (1, 3):
        monkeypatch.setattr(depthwise, "intra_threads", lambda t=t: t)
        outs[t] = run_grads(x, w, dy, 2, "SAME", 1, "float32")[0]
    np.testing.assert_array_equal(outs[1][0], outs[3][0])  # input rows are independent: bit-identical
    np.testing.assert_allclose(outs[1][1], outs[3][1], rtol=1e-6)  # float64 partial sums, added in another order
    want_x, want_w = ref_grads(x, w, dy, (2, 2), run_grads(x, w, dy, 2, "SAME", 1, "float32")[1], (1, 1))
    np.testing.assert_allclose(outs[3][0], want_x, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(outs[3][1], want_w, rtol=2e-5, atol=2e-4)
