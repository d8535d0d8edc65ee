"""Dilated pooling and max pooling on integers, against a nested-loop numpy reference;
gradients of dilated pools by finite differences."""
import numpy as np
import pytest

import isthmus as ism

from .opcheck import check_forward, check_gradients


def ref_pool(x, k, s, d, pads, kind):
    """Windows of k taps spaced d apart; the mean counts only real (unpadded) elements."""
    lo = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0)) + tuple(pads), constant_values=np.nan)
    oh = (xp.shape[2] - (k[0] - 1) * d[0] - 1) // s[0] + 1
    ow = (xp.shape[3] - (k[1] - 1) * d[1] - 1) // s[1] + 1
    out = np.zeros(x.shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * s[0]:i * s[0] + (k[0] - 1) * d[0] + 1:d[0], j * s[1]:j * s[1] + (k[1] - 1) * d[1] + 1:d[1]]
            out[:, :, i, j] = np.nanmax(np.nan_to_num(win, nan=lo), axis=(2, 3)) if kind == "max" \
                else np.nanmean(win, axis=(2, 3))
    return out.astype(x.dtype)


CASES = [  # name, kind, ksize, strides, dilations, pads
    ("max_d2", "max", (2, 2), (1, 1), (2, 2), ((0, 0), (0, 0))),
    ("max_d2x3_padded_stride2", "max", (3, 2), (2, 1), (2, 3), ((1, 2), (0, 1))),
    ("avg_d2", "avg", (2, 2), (1, 1), (2, 2), ((0, 0), (0, 0))),
    ("avg_d3x2_padded", "avg", (2, 3), (1, 2), (3, 2), ((2, 1), (1, 1))),
]


@pytest.mark.parametrize("name,kind,k,s,d,pads", CASES, ids=[c[0] for c in CASES])
def test_dilated_pool_forward_and_gradient(name, kind, k, s, d, pads):
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 8))
    fn = ism.max_pool if kind == "max" else ism.avg_pool
    build = lambda x_: fn(x_, ksize=k, strides=s, padding=pads, dilations=d)  # noqa: E731
    check_forward(build, [x], lambda x_: ref_pool(x_, k, s, d, pads, kind), rtol=1e-12, atol=1e-12)
    check_gradients(build, [x])


@pytest.mark.parametrize("dtype", [np.uint8, np.int32])
def test_max_pool_on_integers(dtype):
    x = np.random.default_rng(2).integers(0, 200, (1, 2, 5, 5)).astype(dtype)
    pads = ((2, 2), (1, 2))
    check_forward(lambda x_: ism.max_pool(x_, ksize=3, strides=2, padding=pads), [x],
                  lambda x_: ref_pool(x_, (3, 3), (2, 2), (1, 1), pads, "max"), rtol=0, atol=0)


def test_avg_pool_refuses_integers_and_bad_dilation():
    g = ism.Graph()
    with g.as_default():
        with pytest.raises(ism.ShapeError, match="AvgPool needs a float"):
            ism.avg_pool(ism.placeholder(np.uint8, (1, 1, 4, 4)), 2)
        with pytest.raises(ism.ShapeError, match="dilations"):
            ism.max_pool(ism.placeholder(np.float32, (1, 1, 4, 4)), 2, dilations=0)
        with pytest.raises(ism.ShapeError, match="does not fit"):
            ism.max_pool(ism.placeholder(np.float32, (1, 1, 4, 4)), 3, strides=1, dilations=2)
