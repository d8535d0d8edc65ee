"""Reductions (core/ops/reduce.py): forward against numpy, gradients against finite differences,
ties, unknown dims, dtypes and errors at construction."""
import numpy as np
import pytest

import isthmus as ism

from .opcheck import check_forward, check_gradients, run_op

rng = np.random.default_rng(0)
X = rng.standard_normal((3, 4, 5))

# name, builder, numpy reference, differentiable (all run on X)
TABLE = [
    ("sum_all", lambda x: ism.reduce_sum(x), np.sum, True),
    ("sum_axis1", lambda x: ism.reduce_sum(x, 1), lambda x: np.sum(x, 1), True),
    ("sum_axes_keep", lambda x: ism.reduce_sum(x, (0, 2), keepdims=True), lambda x: np.sum(x, (0, 2), keepdims=True), True),
    ("sum_no_axes", lambda x: ism.reduce_sum(x, ()), lambda x: x, True),
    ("sum_all_keep", lambda x: ism.reduce_sum(x, keepdims=True), lambda x: np.sum(x, keepdims=True), True),
    ("mean_all", lambda x: ism.reduce_mean(x), np.mean, True),
    ("mean_neg_axis", lambda x: ism.reduce_mean(x, -1), lambda x: np.mean(x, -1), True),
    ("mean_keep", lambda x: ism.reduce_mean(x, (1,), keepdims=True), lambda x: np.mean(x, 1, keepdims=True), True),
    ("mean_dup_axes", lambda x: ism.reduce_mean(x, (2, -1, 0)), lambda x: np.mean(x, (0, 2)), True),
    ("max_all", lambda x: ism.reduce_max(x), np.max, True),
    ("max_axis0", lambda x: ism.reduce_max(x, 0), lambda x: np.max(x, 0), True),
    ("max_axes", lambda x: ism.reduce_max(x, (0, 2)), lambda x: np.max(x, (0, 2)), True),
    ("min_keep", lambda x: ism.reduce_min(x, 2, keepdims=True), lambda x: np.min(x, 2, keepdims=True), True),
    ("min_all", lambda x: ism.reduce_min(x), np.min, True),
    ("argmax_last", lambda x: ism.argmax(x), lambda x: np.argmax(x, -1), False),
    ("argmax_axis1_int32", lambda x: ism.argmax(x, 1, "int32"), lambda x: np.argmax(x, 1).astype(np.int32), False),
    ("argmin_axis0", lambda x: ism.argmin(x, 0), lambda x: np.argmin(x, 0), False),
    ("argmax_1d", lambda x: ism.argmax(ism.reshape(x, (-1,)), 0), lambda x: np.asarray(np.argmax(x)), False),
]
DIFF = [c for c in TABLE if c[3]]
CASES = [c[:3] for c in DIFF]  # (name, build, ref): the shape test_gradient_coverage reads


@pytest.mark.parametrize("name,build,ref,diff", TABLE, ids=[c[0] for c in TABLE])
def test_forward(name, build, ref, diff):
    check_forward(build, [X], ref, rtol=1e-12, atol=1e-12)
    check_forward(build, [X.astype(np.float32)], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,build,ref,diff", DIFF, ids=[c[0] for c in DIFF])
def test_gradient(name, build, ref, diff):
    check_gradients(build, [X])


@pytest.mark.parametrize("name,build,ref,diff", DIFF, ids=[c[0] for c in DIFF])
def test_gradient_with_unknown_dims(name, build, ref, diff):
    """Means over unknown dims divide by the count taken at run time."""
    def grad(static):
        g = ism.Graph()
        with g.as_default():
            x = ism.placeholder("float64", X.shape if static else (None, None, None))
            (dx,) = ism.gradients(ism.reduce_sum(ism.square(build(x))), [x])
            return ism.Session(g).run(dx, {x: X})
    np.testing.assert_allclose(grad(False), grad(True), rtol=1e-12)


@pytest.mark.parametrize("build", [ism.reduce_max, ism.reduce_min])
def test_extreme_gradient_splits_ties_evenly(build):
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float64", (2, 4))
        (dx,) = ism.gradients(build(x, 1), [x])
        got = ism.Session(g).run(dx, {x: np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]]) * (
            1 if build is ism.reduce_max else -1)})
    np.testing.assert_array_equal(got, [[0, 0.5, 0.5, 0], [0.25] * 4])


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "float16"])
def test_reductions_keep_the_dtype(dtype):
    a = (np.arange(24).reshape(2, 3, 4) % 7).astype(dtype)
    for build, ref in [(ism.reduce_sum, np.sum), (ism.reduce_max, np.max), (ism.reduce_min, np.min),
                       (lambda x: ism.reduce_mean(x, 2), lambda x: np.mean(x, 2))]:
        (got,), (t,) = run_op(build, [a])
        want = np.asarray(ref(a))
        want = np.trunc(want).astype(dtype) if dtype != "float16" else want.astype(dtype)
        assert got.dtype == t.dtype == np.dtype(dtype)
        np.testing.assert_allclose(got, want, rtol=1e-3)


def test_full_reductions_give_arrays():
    (s, m, a), _ = run_op(lambda x: [ism.reduce_sum(x), ism.reduce_max(x), ism.argmax(x[0, 0])], [X])
    assert all(isinstance(v, np.ndarray) and v.shape == () for v in (s, m, a))


@pytest.mark.parametrize("build,msg", [
    (lambda x: ism.reduce_sum(x, 5, name="total"), r"node 'total' \(ReduceSum\).*axis 5 out of range for rank 2"),
    (lambda x: ism.reduce_mean(x > 0.0, name="m"), r"node 'm' \(ReduceMean\).*bool"),
    (lambda x: ism.reduce_sum(x[0, 0], 0, name="s"), r"node 's' \(ReduceSum\).*cannot reduce a scalar"),
    (lambda x: ism.reduce_max(x[:, :0], 1, name="e"), r"node 'e' \(ReduceMax\).*empty axis"),
    (lambda x: ism.argmax(x, 2, name="a"), r"node 'a' \(ArgMax\).*axis 2 out of range"),
    (lambda x: ism.argmin(x, output_type="float32", name="a"), r"node 'a' \(ArgMin\).*integer dtype"),
])
def test_errors_at_construction(build, msg):
    with ism.Graph().as_default():
        x = ism.placeholder("float32", (2, 3))
        with pytest.raises(ism.ShapeError, match=msg):
            build(x)


def test_tensor_axes_are_rejected():
    with ism.Graph().as_default():
        x = ism.placeholder("float32", (2, 3))
        with pytest.raises(TypeError, match="static ints"):
            ism.reduce_sum(x, ism.constant(1))


def test_reduce_over_run_time_axes():
    from .opcheck import check_forward
    ax = lambda v: ism.constant(np.array(v, np.int64))  # noqa: E731
    check_forward(lambda x: ism.reduce_dynamic(x, ax([0, -1]), "sum", keepdims=False), [X], lambda x: x.sum((0, 2)))
    check_forward(lambda x: ism.reduce_dynamic(x, ax([1]), "max", keepdims=True), [X], lambda x: x.max(1, keepdims=True))
    check_forward(lambda x: ism.reduce_dynamic(x, ax(np.zeros(0, np.int64)), "mean", keepdims=False), [X],
                  lambda x: np.asarray(x.mean()))
    check_forward(lambda x: ism.reduce_dynamic(x, ax(np.zeros(0, np.int64)), "min", noop_with_empty_axes=True), [X],
                  lambda x: x)


@pytest.mark.parametrize("axis,keep", [(1, False), ((0, 2), True), (None, False), (-1, True)])
def test_float32_mean_is_numpys_bit_for_bit(axis, keep):
    """The float mean kernel skips numpy's wrapper but keeps its arithmetic: the same bits."""
    x = np.random.default_rng(5).standard_normal((3, 32, 65)).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        got = ism.Session(g).run(ism.reduce_mean(ism.constant(x), axis=axis, keepdims=keep))
    want = x.mean(axis=axis, keepdims=keep)
    assert got.dtype == np.float32 and np.shape(got) == np.shape(want)
    np.testing.assert_array_equal(got, want)
