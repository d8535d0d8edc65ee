"""Reductions: forward against numpy, gradients against finite differences."""
import numpy as np
import pytest

import isthmus as ism

from .opcheck import check_forward, check_gradients

rng = np.random.default_rng(0)
X = rng.standard_normal((3, 4, 5))

CASES = [
    ("sum_all", lambda x: ism.reduce_sum(x), lambda x: np.sum(x)),
    ("sum_axis1", lambda x: ism.reduce_sum(x, 1), lambda x: np.sum(x, 1)),
    ("sum_axes_keep", lambda x: ism.reduce_sum(x, (0, 2), keepdims=True), lambda x: np.sum(x, (0, 2), keepdims=True)),
    ("mean_all", lambda x: ism.reduce_mean(x), lambda x: np.mean(x)),
    ("mean_neg_axis", lambda x: ism.reduce_mean(x, -1), lambda x: np.mean(x, -1)),
    ("mean_keep", lambda x: ism.reduce_mean(x, (1,), keepdims=True), lambda x: np.mean(x, 1, keepdims=True)),
    ("max_axis0", lambda x: ism.reduce_max(x, 0), lambda x: np.max(x, 0)),
    ("min_keep", lambda x: ism.reduce_min(x, 2, keepdims=True), lambda x: np.min(x, 2, keepdims=True)),
]


@pytest.mark.parametrize("name,build,ref", CASES, ids=[c[0] for c in CASES])
def test_forward(name, build, ref):
    check_forward(build, [X], ref, rtol=1e-12, atol=1e-12)
    check_forward(build, [X.astype(np.float32)], lambda x: ref(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,build,ref", CASES, ids=[c[0] for c in CASES])
def test_gradient(name, build, ref):
    check_gradients(build, [X])


def test_max_gradient_splits_ties():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float64", (4,))
        y = ism.reduce_max(x)
        (dx,) = ism.gradients(y, [x])
        got = ism.Session(g).run(dx, {x: np.array([1.0, 3.0, 3.0, 0.0])})
    np.testing.assert_array_equal(got, [0, 0.5, 0.5, 0])


def test_mean_gradient_with_unknown_dims():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float64", (None, 3))
        (dx,) = ism.gradients(ism.reduce_mean(x, 0), [x])
        got = ism.Session(g).run(dx, {x: np.ones((4, 3))})
    np.testing.assert_allclose(got, np.full((4, 3), 0.25))


def test_argmax_argmin():
    a = rng.standard_normal((4, 6)).astype(np.float32)
    check_forward(lambda x: ism.argmax(x, 1), [a], lambda x: np.argmax(x, 1))
    check_forward(lambda x: ism.argmin(x, 0, output_type="int32"), [a], lambda x: np.argmin(x, 0).astype(np.int32))


def test_bad_axis_names_node():
    with ism.Graph().as_default():
        x = ism.placeholder("float32", (2, 3))
        with pytest.raises(ism.ShapeError, match=r"'total' \(ReduceSum\).*axis 5 out of range"):
            ism.reduce_sum(x, 5, name="total")
