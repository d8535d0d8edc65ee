"""Instance, group and RMS normalization and LRN (core/ops/normalization.py): forward against numpy
written out, gradients of the composites against finite differences."""
import numpy as np
import pytest

import isthmus as ism

from .opcheck import check_forward, check_gradients

rng = np.random.default_rng(5)
X = rng.standard_normal((2, 4, 3, 2))
SC, BI = rng.standard_normal(4), rng.standard_normal(4)


def np_instance_norm(x, s, b, eps=1e-5):
    mu = x.mean((2, 3), keepdims=True)
    var = x.var((2, 3), keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * s.reshape(1, -1, 1, 1) + b.reshape(1, -1, 1, 1)


def np_group_norm(x, s, b, groups, eps=1e-5):
    n, c = x.shape[:2]
    g = x.reshape(n, groups, -1)
    y = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    return y * s.reshape(shape) + b.reshape(shape)


def np_rms_norm(x, s, axis, eps=1e-5):
    axes = tuple(range(axis % x.ndim, x.ndim))
    return x / np.sqrt((x ** 2).mean(axes, keepdims=True) + eps) * s


def np_lrn(x, size, alpha=1e-4, beta=0.75, bias=1.0):
    c = x.shape[1]
    sq = np.zeros_like(x)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + int(np.ceil((size - 1) / 2)))
        sq[:, ch] = (x[:, lo:hi + 1] ** 2).sum(1)
    return x / (bias + alpha / size * sq) ** beta


CASES = [
    ("instance_norm", lambda x, s, b: ism.instance_norm(x, s, b), [X, SC, BI], np_instance_norm),
    ("group_norm_2", lambda x, s, b: ism.group_norm(x, s, b, 2, 1e-3), [X, SC, BI],
     lambda x, s, b: np_group_norm(x, s, b, 2, 1e-3)),
    ("group_norm_4", lambda x, s, b: ism.group_norm(x, s, b, 4), [X, SC, BI], lambda x, s, b: np_group_norm(x, s, b, 4)),
    ("rms_norm_last", lambda x, s: ism.rms_norm(x, s), [X, rng.standard_normal(2)], lambda x, s: np_rms_norm(x, s, -1)),
    ("rms_norm_from_1", lambda x, s: ism.rms_norm(x, s, 1), [X, rng.standard_normal((4, 3, 2))],
     lambda x, s: np_rms_norm(x, s, 1)),
    ("lrn_3", lambda x: ism.lrn(x, 3, 0.5, 0.75, 2.0), [X], lambda x: np_lrn(x, 3, 0.5, 0.75, 2.0)),
    ("lrn_4", lambda x: ism.lrn(x, 4, 0.1), [X], lambda x: np_lrn(x, 4, 0.1)),
]


@pytest.mark.parametrize("name,build,inputs,ref", CASES, ids=[c[0] for c in CASES])
def test_forward(name, build, inputs, ref):
    check_forward(build, inputs, ref, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("name,build,inputs,ref", CASES, ids=[c[0] for c in CASES])
def test_gradient(name, build, inputs, ref):
    check_gradients(build, inputs)


def test_group_norm_refuses_uneven_groups():
    with ism.Graph().as_default():
        with pytest.raises(ism.ShapeError, match="groups"):
            ism.group_norm(ism.placeholder("float32", (1, 6, 2)), np.ones(6, np.float32), np.zeros(6, np.float32), 4)
