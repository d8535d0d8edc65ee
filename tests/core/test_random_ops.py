"""Random ops (core/ops/random.py): seeded and reproducible, right moments and dtypes, fresh draws
per run, never merged by graph passes, and bad arguments refused at construction."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core import registry


def _draw(build, runs=1, seed=7):
    g = ism.Graph(seed=seed)
    with g.as_default():
        t = build()
    sess = ism.Session(g)
    return [sess.run(t) for _ in range(runs)], t


# name, builder, mean, std, dtype
CASES = [
    ("normal", lambda: ism.random_normal((200, 200), 1.0, 2.0), 1.0, 2.0, np.float32),
    ("normal_f64", lambda: ism.random_normal((200, 200), dtype="float64"), 0.0, 1.0, np.float64),
    ("normal_f16", lambda: ism.random_normal((200, 200), -1.0, 0.5, dtype="float16"), -1.0, 0.5, np.float16),
    ("uniform", lambda: ism.random_uniform((200, 200), -1.0, 3.0), 1.0, 4.0 / np.sqrt(12), np.float32),
    ("uniform_f64", lambda: ism.random_uniform((200, 200), dtype="float64"), 0.5, 1 / np.sqrt(12), np.float64),
    ("truncated", lambda: ism.truncated_normal((200, 200)), 0.0, 0.88, np.float32),
    ("truncated_scaled", lambda: ism.truncated_normal((200, 200), 2.0, 3.0), 2.0, 3 * 0.88, np.float32),
    ("uniform_int", lambda: ism.random_uniform_int((200, 200), 0, 10), 4.5, np.sqrt(99 / 12), np.int32),
    ("uniform_int_via_dtype", lambda: ism.random_uniform((200, 200), 0, 10, "int64"), 4.5, np.sqrt(99 / 12), np.int64),
]


@pytest.mark.parametrize("name,build,mean,std,dtype", CASES, ids=[c[0] for c in CASES])
def test_moments_and_dtype(name, build, mean, std, dtype):
    (x,), t = _draw(build)
    assert x.dtype == dtype == t.dtype and x.shape == t.shape
    assert abs(x.mean() - mean) < 0.05 * max(std, 1) and abs(x.std() - std) < 0.05 * max(std, 1)


def test_ranges():
    (t,), _ = _draw(lambda: ism.truncated_normal((100, 100), 1.0, 0.5))
    assert np.abs(t - 1.0).max() <= 1.0
    (u,), _ = _draw(lambda: ism.random_uniform((100, 100), 2.0, 3.0))
    assert u.min() >= 2.0 and u.max() < 3.0
    (i,), _ = _draw(lambda: ism.random_uniform_int((1000,), 3, 7))
    assert i.min() == 3 and i.max() == 6


def test_reproducible_across_sessions_and_fresh_per_run():
    a, _ = _draw(lambda: ism.random_normal((4,)), runs=2)
    b, _ = _draw(lambda: ism.random_normal((4,)), runs=2)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], a[1])
    c, _ = _draw(lambda: ism.random_normal((4,)), seed=8)
    assert not np.array_equal(a[0], c[0])


def test_op_seed_and_node_name_pick_the_stream():
    s1, _ = _draw(lambda: ism.random_normal((3,), seed=5), seed=1)
    s2, _ = _draw(lambda: ism.random_normal((3,), seed=5, name="other"), seed=1)
    s3, _ = _draw(lambda: ism.random_normal((3,), seed=6), seed=1)
    np.testing.assert_array_equal(s1[0], s2[0])  # an op seed overrides the name
    assert not np.array_equal(s1[0], s3[0])
    n1, _ = _draw(lambda: ism.random_normal((3,), name="a"))
    n2, _ = _draw(lambda: ism.random_normal((3,), name="b"))
    assert not np.array_equal(n1[0], n2[0])


def test_two_identical_random_nodes_differ_and_are_not_merged():
    g = ism.Graph(seed=0)
    with g.as_default():
        a, b = ism.random_normal((5,)), ism.random_normal((5,))
    va, vb = ism.Session(g).run([a, b])
    assert not np.array_equal(va, vb)
    for op in ("RandomNormal", "RandomUniform", "TruncatedNormal", "RandomUniformInt"):
        assert registry.get(op).stateful and registry.get(op).attrs["seed"] is None


def test_static_shape_tensor():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (2, 3))
        r = ism.random_normal(ism.shape(x))
        assert r.shape == (2, 3)
        with pytest.raises(ism.ShapeError, match="static"):
            ism.random_normal(ism.placeholder("int32", (2,)))


@pytest.mark.parametrize("build,err,msg", [
    (lambda: ism.random_normal((None, 3), name="r"), ism.ShapeError, r"node 'r' \(RandomNormal\).*fully known"),
    (lambda: ism.random_normal((2,), dtype="int32", name="r"), ism.ShapeError, r"node 'r' \(RandomNormal\).*int32"),
    (lambda: ism.random_uniform_int((2,), 0, 3, dtype="float32", name="r"), ism.ShapeError,
     r"node 'r' \(RandomUniformInt\).*float32"),
    (lambda: ism.random_normal((2,), stddev=-1.0), ValueError, "stddev"),
    (lambda: ism.truncated_normal((2,), stddev=-1.0), ValueError, "stddev"),
    (lambda: ism.random_uniform((2,), 1.0, 0.0), ValueError, "minval <= maxval"),
    (lambda: ism.random_uniform_int((2,), 3, 3), ValueError, "minval < maxval"),
    (lambda: ism.random_uniform((2,), 0, dtype="int32"), ValueError, "needs maxval"),
])
def test_bad_arguments_fail_at_construction(build, err, msg):
    with ism.Graph().as_default():
        with pytest.raises(err, match=msg):
            build()
