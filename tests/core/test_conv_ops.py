"""Convolution and pooling against plain nested-loop numpy references; gradients by finite differences."""
import numpy as np
import pytest

import isthmus as ism

from .opcheck import check_forward, check_gradients

rng = np.random.default_rng(0)


def ref_conv(x, w, stride=(1, 1), pads=((0, 0), (0, 0)), dil=(1, 1), groups=1):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple(pads))
    oh = (xp.shape[2] - (kh - 1) * dil[0] - 1) // stride[0] + 1
    ow = (xp.shape[3] - (kw - 1) * dil[1] - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for b in range(n):
        for oc in range(o):
            gi = oc // og
            for i in range(oh):
                for j in range(ow):
                    acc = 0.0
                    for ci in range(cg):
                        for a in range(kh):
                            for e in range(kw):
                                acc += xp[b, gi * cg + ci, i * stride[0] + a * dil[0], j * stride[1] + e * dil[1]] * w[oc, ci, a, e]
                    out[b, oc, i, j] = acc
    return out


def ref_pool(x, k, s, pads, kind):
    fill = -np.inf if kind == "max" else np.nan
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple(pads), constant_values=fill)
    oh = (xp.shape[2] - k[0]) // s[0] + 1
    ow = (xp.shape[3] - k[1]) // s[1] + 1
    out = np.zeros(x.shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * s[0]:i * s[0] + k[0], j * s[1]:j * s[1] + k[1]]
            out[:, :, i, j] = win.max(axis=(2, 3)) if kind == "max" else np.nanmean(win, axis=(2, 3))
    return out


X = rng.standard_normal((2, 4, 6, 5))
CONV_CASES = [
    ("valid", dict(padding="VALID"), (3, 4, 3, 3), dict()),
    ("same", dict(padding="SAME"), (3, 4, 3, 3), dict(pads=((1, 1), (1, 1)))),
    ("same_stride2", dict(padding="SAME", strides=2), (5, 4, 3, 2), dict(stride=(2, 2), pads=((0, 1), (0, 1)))),
    ("explicit_dilated", dict(padding=((2, 0), (1, 2)), dilations=2), (2, 4, 2, 2),
     dict(pads=((2, 0), (1, 2)), dil=(2, 2))),
    ("grouped", dict(padding="VALID", groups=2), (6, 2, 2, 3), dict(groups=2)),
    ("depthwise", dict(padding="SAME", groups=4), (4, 1, 3, 3), dict(pads=((1, 1), (1, 1)), groups=4)),
    ("depthwise_mult2_strided", dict(padding="VALID", groups=4, strides=(2, 1)), (8, 1, 2, 2),
     dict(stride=(2, 1), groups=4)),
]


@pytest.mark.parametrize("name,kw,wshape,refkw", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_forward(name, kw, wshape, refkw):
    w = rng.standard_normal(wshape)
    check_forward(lambda x, w_: ism.conv2d(x, w_, **kw), [X, w], lambda x, w_: ref_conv(x, w_, **refkw),
                  rtol=1e-9, atol=1e-10) if kw.get("padding") != "SAME" else None
    got = ism.Session(_g := ism.Graph()).run(_build(_g, lambda: ism.conv2d(ism.constant(X), ism.constant(w), **kw)))
    np.testing.assert_allclose(got, ref_conv(X, w, **refkw), rtol=1e-9, atol=1e-10)


def _build(g, fn):
    with g.as_default():
        return fn()


@pytest.mark.parametrize("name,kw,wshape,refkw", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_gradient(name, kw, wshape, refkw):
    x = rng.standard_normal((1, 4, 5, 4))
    w = rng.standard_normal(wshape)
    check_gradients(lambda x_, w_: ism.conv2d(x_, w_, **kw), [x, w])


POOL_CASES = [
    ("max_tiles", ism.max_pool, dict(ksize=2), "max", (2, 2), (2, 2), ((0, 0), (0, 0))),
    ("max_overlap_same", ism.max_pool, dict(ksize=3, strides=2, padding="SAME"), "max", (3, 3), (2, 2), ((0, 1), (0, 1))),
    ("avg_tiles", ism.avg_pool, dict(ksize=2), "avg", (2, 2), (2, 2), ((0, 0), (0, 0))),
    ("avg_same", ism.avg_pool, dict(ksize=3, strides=1, padding="SAME"), "avg", (3, 3), (1, 1), ((1, 1), (1, 1))),
    ("avg_valid_stride", ism.avg_pool, dict(ksize=(2, 3), strides=(1, 2)), "avg", (2, 3), (1, 2), ((0, 0), (0, 0))),
]


@pytest.mark.parametrize("name,fn,kw,kind,k,s,pads", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_pool_forward_and_gradient(name, fn, kw, kind, k, s, pads):
    x = rng.standard_normal((2, 3, 6, 6))
    check_forward(lambda x_: fn(x_, **kw), [x], lambda x_: ref_pool(x_, k, s, pads, kind), rtol=1e-12, atol=1e-12) \
        if "same" not in name else None
    g = ism.Graph()
    got = ism.Session(g).run(_build(g, lambda: fn(ism.constant(x), **kw)))
    np.testing.assert_allclose(got, ref_pool(x, k, s, pads, kind), rtol=1e-12)
    check_gradients(lambda x_: fn(x_, **kw), [x])


def test_global_avg_pool():
    x = rng.standard_normal((2, 3, 4, 5))
    check_forward(ism.global_avg_pool, [x], lambda x_: x_.mean(axis=(2, 3)))
    check_forward(lambda x_: ism.global_avg_pool(x_, keepdims=True), [x], lambda x_: x_.mean(axis=(2, 3), keepdims=True))
    check_gradients(ism.global_avg_pool, [x])


def test_fused_conv_matches_conv_bias_relu():
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        xp = ism.placeholder("float32", (None, 3, 7, 7))
        y = ism.relu(ism.bias_add(ism.conv2d(xp, ism.constant(w)), ism.constant(b), axis=1))
        y = y * 1.5
    on = ism.Session(g)
    assert "FusedConv2D" in {n.op for n in on.plan_for(y, {xp: None}).nodes}
    np.testing.assert_allclose(on.run(y, {xp: x}), ism.Session(g, optimize=False).run(y, {xp: x}), rtol=1e-5, atol=1e-5)


def test_conv_errors_name_the_node():
    with ism.Graph().as_default():
        x = ism.placeholder("float32", (1, 3, 8, 8))
        with pytest.raises(ism.ShapeError, match=r"'c1' \(Conv2D\).*groups=2"):
            ism.conv2d(x, np.zeros((4, 3, 3, 3), np.float32), groups=2, name="c1")
        with pytest.raises(ism.ShapeError, match="does not fit input"):
            ism.conv2d(x, np.zeros((4, 3, 9, 9), np.float32), padding="VALID")


# Both conv strategies on every case: row taps (one GEMM per kernel row, and the input gradient
# as a convolution) wherever the geometry allows, and the full im2col.
@pytest.fixture(params=["row_taps", "im2col"])
def conv_strategy(request, monkeypatch):
    from isthmus.core.ops import conv as conv_mod
    monkeypatch.setattr(conv_mod, "_ROW_TAPS_MIN_K", 1 if request.param == "row_taps" else 10 ** 9)
    return request.param


STRATEGY_CASES = CONV_CASES + [
    ("pad_beyond_kernel", dict(padding=((3, 0), (0, 3))), (3, 4, 2, 2), dict(pads=((3, 0), (0, 3)))),
    ("stride_w_only_dilated_h", dict(padding=((1, 1), (0, 1)), strides=(1, 2), dilations=(2, 1)), (3, 4, 2, 3),
     dict(stride=(1, 2), pads=((1, 1), (0, 1)), dil=(2, 1))),
]


@pytest.mark.parametrize("name,kw,wshape,refkw", STRATEGY_CASES, ids=[c[0] for c in STRATEGY_CASES])
def test_conv_strategies_forward_and_gradients(conv_strategy, name, kw, wshape, refkw):
    w = rng.standard_normal(wshape)
    g = ism.Graph()
    got = ism.Session(g).run(_build(g, lambda: ism.conv2d(ism.constant(X), ism.constant(w), **kw)))
    np.testing.assert_allclose(got, ref_conv(X, w, **refkw), rtol=1e-9, atol=1e-10)
    x = rng.standard_normal((1, 4, 5, 4))
    check_gradients(lambda x_, w_: ism.conv2d(x_, w_, **kw), [x, w])


@pytest.mark.parametrize("shape,keep", [((2, 5, 3, 4), False), ((1, 128, 6, 6), True), ((3, 2, 1, 1), False)])
def test_global_avg_pool_float32_against_float64(shape, keep):
    """The plane means as BLAS matrix-vector products, float32, against float64 numpy."""
    x = (np.random.default_rng(len(shape) + shape[1]).standard_normal(shape) + 3).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        got = ism.Session(g).run(ism.global_avg_pool(ism.constant(x), keepdims=keep))
    want = x.astype(np.float64).mean(axis=(2, 3), keepdims=keep)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
