"""cond and while_loop: semantics, shape invariants, gradients (finite differences and unrolled)."""
import numpy as np
import pytest

import isthmus as ism

from .opcheck import check_gradients


def test_cond_runs_only_the_taken_branch():
    g = ism.Graph()
    with g.as_default():
        p = ism.placeholder("bool", (), name="p")
        x = ism.placeholder("float64", (3,), name="x")
        v = ism.Variable(np.zeros(()), name="count")
        def t():
            with ism.control_dependencies([v.assign_add(np.float64(1.0))]):
                return x * 2.0
        y = ism.cond(p, t, lambda: x - 1.0)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
        xv = np.array([1.0, 2.0, 3.0])
        np.testing.assert_array_equal(sess.run(y, {p: True, x: xv}), xv * 2)
        np.testing.assert_array_equal(sess.run(y, {p: False, x: xv}), xv - 1)
        assert sess.run(v) == 1.0  # the false run did not touch the counter


def test_cond_branches_must_agree():
    with ism.Graph().as_default():
        p = ism.placeholder("bool", ())
        with pytest.raises(ism.ShapeError, match="float32 and int32"):
            ism.cond(p, lambda: ism.constant(1.0), lambda: ism.constant(1))


def test_while_loop_runtime_trip_count_and_captures():
    g = ism.Graph()
    with g.as_default():
        n = ism.placeholder("int32", (), name="n")
        step = ism.placeholder("float64", (2,), name="step")
        i, acc = ism.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, a + step),
                                [ism.constant(0), ism.constant(np.zeros(2))])
        sess = ism.Session(g)
        for trips in (0, 1, 7):
            iv, av = sess.run([i, acc], {n: trips, step: np.array([1.0, 0.5])})
            assert iv == trips
            np.testing.assert_array_equal(av, [trips, trips * 0.5])


def test_while_loop_shape_invariants():
    with ism.Graph().as_default():
        x = ism.constant(np.zeros((1, 2)))
        body = lambda a: ism.concat([a, a], axis=0)  # noqa: E731
        with pytest.raises(ism.ShapeError, match="declare a shape invariant"):
            ism.while_loop(lambda a: ism.constant(False), body, [x])
    g = ism.Graph()
    with g.as_default():
        x = ism.constant(np.ones((1, 2)))
        [out] = ism.while_loop(lambda a: ism.less(ism.shape(a)[0], 8), body, [x], shape_invariants=[(None, 2)])
        assert out.shape == (None, 2)
        assert ism.Session(g).run(out).shape == (8, 2)


def test_maximum_iterations():
    g = ism.Graph()
    with g.as_default():
        [x] = ism.while_loop(lambda a: ism.constant(True), lambda a: a * 2.0, [ism.constant(1.0)], maximum_iterations=5)
        assert ism.Session(g).run(x) == 32.0


def test_nested_loops():
    g = ism.Graph()
    with g.as_default():
        def outer_body(i, total):
            _, inner = ism.while_loop(lambda j, s: j < i, lambda j, s: (j + 1, s + 1.0), [ism.constant(0), total])
            return i + 1, inner
        _, total = ism.while_loop(lambda i, t: i < 5, outer_body, [ism.constant(0), ism.constant(0.0)])
        assert ism.Session(g).run(total) == 0 + 1 + 2 + 3 + 4


def _rnn(steps):
    def build(x, h0, w, u):
        def body(t, h):
            xt = ism.gather(x, t)
            return t + 1, ism.tanh(xt @ w + h @ u)
        _, h = ism.while_loop(lambda t, h: t < steps, body, [ism.constant(0), h0])
        return h
    return build


def test_while_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 2, 3)) * 0.5
    h0 = rng.standard_normal((2, 3)) * 0.5
    w = rng.standard_normal((3, 3)) * 0.5
    u = rng.standard_normal((3, 3)) * 0.5
    check_gradients(_rnn(4), [x, h0, w, u])


def test_while_gradient_equals_unrolled_graph():
    rng = np.random.default_rng(1)
    vals = [rng.standard_normal(s) * 0.5 for s in [(6, 2, 3), (2, 3), (3, 3), (3, 3)]]
    results = []
    for unrolled in (False, True):
        g = ism.Graph()
        with g.as_default():
            x, h0, w, u = [ism.constant(v) for v in vals]
            if unrolled:
                h = h0
                for t in range(6):
                    h = ism.tanh(ism.gather(x, ism.constant(t)) @ w + h @ u)
            else:
                h = _rnn(6)(x, h0, w, u)
            loss = ism.reduce_sum(h * h)
            grads = ism.gradients(loss, [w, u, h0])
            results.append(ism.Session(g).run(grads))
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-10)


def test_gradient_through_trip_count_that_varies_per_run():
    g = ism.Graph()
    with g.as_default():
        n = ism.placeholder("int32", (), name="n")
        x = ism.placeholder("float64", (), name="x")
        _, y = ism.while_loop(lambda i, y: i < n, lambda i, y: (i + 1, y * x), [ism.constant(0), ism.constant(1.0, "float64")])
        (dx,) = ism.gradients(y, [x])
        sess = ism.Session(g)
        for trips in (1, 3, 5):
            np.testing.assert_allclose(sess.run(dx, {n: trips, x: 1.5}), trips * 1.5 ** (trips - 1))


def test_nested_loop_gradient():
    def build(x):
        def outer(i, acc):
            _, inner = ism.while_loop(lambda j, a: j < 2, lambda j, a: (j + 1, ism.tanh(a) * x),
                                      [ism.constant(0), acc])
            return i + 1, inner
        _, y = ism.while_loop(lambda i, a: i < 2, outer, [ism.constant(0), x])
        return y
    check_gradients(build, [np.array([0.3, -0.7, 1.1])])


def test_cond_gradient():
    def build(x, y):
        return ism.cond(ism.greater(ism.reduce_sum(x), 0.0), lambda: x * y, lambda: ism.exp(x) - y)
    check_gradients(build, [np.array([0.5, 0.2]), np.array([1.5, -2.0])])
    check_gradients(build, [np.array([-0.5, 0.2]), np.array([1.5, -2.0])])


def test_failure_inside_a_loop_body_names_the_body_node():
    g = ism.Graph()
    with g.as_default():
        idx = ism.placeholder("int32", (), name="idx")
        table = ism.constant(np.arange(3.0))
        _, y = ism.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, a + ism.gather(table, idx, name="lookup")),
                              [ism.constant(0), ism.constant(0.0, "float64")])
        with pytest.raises(ism.ExecutionError, match="'lookup'"):
            ism.Session(g).run(y, {idx: 7})
