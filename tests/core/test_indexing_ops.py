"""The indexing and ordering families (core/ops/indexing.py, core/ops/ordering.py): forward against numpy
written out, static shapes against the kernel, gradients against finite differences."""
import numpy as np
import pytest

import isthmus as ism

from .opcheck import check_forward, check_gradients, run_op

rng = np.random.default_rng(4)
X = rng.standard_normal((3, 4))
X3 = rng.standard_normal((2, 3, 4))
IDX_E = np.array([[0, 2, -1, 1], [2, 0, 1, 1]])             # gather_elements along axis 0 of a 3x4
IDX_S = np.array([[1, 0, 2, 3], [2, 1, 0, -1]])             # distinct along axis 1 per row: scatter axis 1
IDX_ND = np.array([[0, 1], [2, 3], [1, -4]])               # three (row, col) pairs of a 3x4
IDX_ND_ROWS = np.array([[2], [0]])                           # two rows of a 3x4
IDX_ND_B = np.array([[[1], [0]], [[2], [2]]])                # batch_dims=1: per batch, rows of a 3x4


def _np_gather_elements(d, i, axis):
    return np.take_along_axis(d, np.where(i < 0, i + d.shape[axis], i), axis)


def _np_scatter_elements(d, i, u, axis, red="none"):
    out = d.copy()
    i = np.where(i < 0, i + d.shape[axis], i)
    for pos in np.ndindex(*i.shape):
        tgt = list(pos)
        tgt[axis] = i[pos]
        tgt = tuple(tgt)
        out[tgt] = u[pos] if red == "none" else out[tgt] + u[pos]
    return out


def _np_gather_nd(d, idx, b=0):
    if b:
        return np.stack([_np_gather_nd(d[k], idx[k]) for k in range(d.shape[0])])
    return np.stack([d[tuple(ix)] for ix in idx.reshape(-1, idx.shape[-1])]).reshape(idx.shape[:-1] + d.shape[idx.shape[-1]:])


def _np_scatter_nd(d, idx, u, red="none"):
    out = d.copy()
    flat_u = u.reshape((-1,) + d.shape[idx.shape[-1]:])
    for k, ix in enumerate(idx.reshape(-1, idx.shape[-1])):
        out[tuple(ix)] = flat_u[k] if red == "none" else out[tuple(ix)] + flat_u[k]
    return out


def _np_cumsum(x, axis, exclusive=False, reverse=False):
    y = np.flip(x, axis) if reverse else x
    c = np.cumsum(y, axis)
    if exclusive:
        c = c - y
    return np.flip(c, axis) if reverse else c


def _np_top_k(x, k, axis, largest=True):
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(x, idx, axis)


def _prod_grad_input():
    x = rng.uniform(0.5, 1.5, (3, 4)) * rng.choice([-1, 1], (3, 4))
    x[1, 2] = 0.0  # one zero entry: the gradient there is the product of the rest
    return x


# name, builder, inputs (float64 except indices), numpy reference, differentiable
CASES = [
    ("gather_elements_0", lambda d: ism.gather_elements(d, ism.constant(IDX_E), 0), [X],
     lambda d: _np_gather_elements(d, IDX_E, 0), True),
    ("gather_elements_1", lambda d: ism.gather_elements(d, ism.constant(IDX_S[:, :3]), 1), [X[:2]],
     lambda d: _np_gather_elements(d, IDX_S[:, :3], 1), True),
    ("scatter_elements", lambda d, u: ism.scatter_elements(d, ism.constant(IDX_S), u, 1), [X[:2], X[1:]],
     lambda d, u: _np_scatter_elements(d, IDX_S, u, 1), True),
    ("scatter_elements_add", lambda d, u: ism.scatter_elements(d, ism.constant(IDX_E), u, 0, "add"), [X, X[:2] * 2],
     lambda d, u: _np_scatter_elements(d, IDX_E, u, 0, "add"), True),
    ("gather_nd_elements", lambda d: ism.gather_nd(d, ism.constant(IDX_ND)), [X], lambda d: _np_gather_nd(d, IDX_ND), True),
    ("gather_nd_rows", lambda d: ism.gather_nd(d, ism.constant(IDX_ND_ROWS)), [X], lambda d: _np_gather_nd(d, IDX_ND_ROWS), True),
    ("gather_nd_batch", lambda d: ism.gather_nd(d, ism.constant(IDX_ND_B), 1), [X3],
     lambda d: _np_gather_nd(d, IDX_ND_B, 1), True),
    ("scatter_nd", lambda d, u: ism.scatter_nd(d, ism.constant(IDX_ND_ROWS), u), [X, X[:2] + 1],
     lambda d, u: _np_scatter_nd(d, IDX_ND_ROWS, u), True),
    ("scatter_nd_add", lambda d, u: ism.scatter_nd(d, ism.constant(np.array([[0, 1], [0, 1]])), u, "add"), [X, X[0, :2]],
     lambda d, u: _np_scatter_nd(d, np.array([[0, 1], [0, 1]]), u, "add"), True),
    ("trilu_upper", lambda x: ism.trilu(x, True, 1), [X3], lambda x: np.triu(x, 1), True),
    ("trilu_lower", lambda x: ism.trilu(x, False, -1), [X], lambda x: np.tril(x, -1), True),
    ("cumsum", lambda x: ism.cumsum(x, 1), [X], lambda x: np.cumsum(x, 1), True),
    ("cumsum_excl_rev", lambda x: ism.cumsum(x, -1, True, True), [X3], lambda x: _np_cumsum(x, 2, True, True), True),
    ("top_k", lambda x: ism.top_k(x, 2, 1)[0], [X], lambda x: _np_top_k(x, 2, 1), True),
    ("top_k_smallest", lambda x: ism.top_k(x, 3, 0, largest=False)[0], [X3[0]], lambda x: _np_top_k(x, 3, 0, False), True),
    ("reduce_prod", lambda x: ism.reduce_prod(x, 1), [_prod_grad_input()], lambda x: np.prod(x, 1), True),
    ("reduce_prod_all_keep", lambda x: ism.reduce_prod(x, None, True), [_prod_grad_input()],
     lambda x: np.prod(x, keepdims=True), True),
    ("reduce_prod_02", lambda x: ism.reduce_prod(x, (0, 2)), [rng.uniform(0.5, 1.5, (2, 3, 2))],
     lambda x: np.prod(x, (0, 2)), True),
    ("top_k_indices", lambda x: ism.top_k(x, 2, 1)[1], [np.array([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 0.0]])],
     lambda x: np.array([[1, 2], [0, 1]]), False),
    ("nonzero", ism.nonzero, [np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]])],
     lambda x: np.array(np.nonzero(x)), False),
    ("size", ism.size, [X3], lambda x: np.array(x.size, np.int64), False),
]
NO_GRADIENT = {"NonZero", "Size"}


@pytest.mark.parametrize("name,build,inputs,ref,diff", CASES, ids=[c[0] for c in CASES])
def test_forward(name, build, inputs, ref, diff):
    check_forward(build, inputs, ref, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("name,build,inputs,ref,diff", [c for c in CASES if c[4]], ids=[c[0] for c in CASES if c[4]])
def test_gradient(name, build, inputs, ref, diff):
    check_gradients(build, inputs)


def test_reduce_prod_gradient_at_a_zero_is_the_product_of_the_rest():
    x = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0]])
    with ism.Graph().as_default():
        p = ism.placeholder("float64", (2, 3))
        (g,) = ism.gradients(ism.reduce_sum(ism.reduce_prod(p, 1)), [p])
        got = ism.Session().run(g, {p: x})
    np.testing.assert_array_equal(got, [[0.0, 6.0, 0.0], [0.0, 0.0, 0.0]])


def test_run_time_k_axis_and_diagonal():
    x = rng.standard_normal((3, 5))
    with ism.Graph().as_default():
        p = ism.placeholder("float64", (None, 5))
        k, ax, d = (ism.placeholder("int64", ()) for _ in range(3))
        vals, idx = ism.top_k(p, k, 1)
        assert vals.shape == (None, None)
        outs = ism.Session().run([vals, idx, ism.cumsum(p, ax), ism.trilu(p, True, d)], {p: x, k: 2, ax: 0, d: -1})
    np.testing.assert_allclose(outs[0], _np_top_k(x, 2, 1))
    np.testing.assert_array_equal(outs[1], np.argsort(-x, 1, kind="stable")[:, :2])
    np.testing.assert_allclose(outs[2], np.cumsum(x, 0))
    np.testing.assert_allclose(outs[3], np.triu(x, -1))


def test_scatter_with_repeated_indices_combines_by_reduction():
    d = np.zeros((2, 3))
    i = np.array([[0, 0, 2], [1, 1, 1]])
    u = np.arange(6, dtype=np.float64).reshape(2, 3) + 1
    for red, want in [("add", [[3.0, 0.0, 3.0], [0.0, 15.0, 0.0]]), ("max", [[2.0, 0.0, 3.0], [0.0, 6.0, 0.0]]),
                      ("mul", [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])]:
        got, _ = run_op(lambda a, b, c: ism.scatter_elements(a, b, c, 1, red), [d, i, u])
        np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("build,msg", [
    (lambda: ism.gather_elements(ism.placeholder("float32", (3, 4)), ism.placeholder("int64", (3,))), "rank"),
    (lambda: ism.gather_elements(ism.placeholder("float32", (3, 4)), ism.placeholder("float32", (3, 4))), "integers"),
    (lambda: ism.top_k(ism.placeholder("float32", (3, 4)), 5), "outside"),
    (lambda: ism.scatter_nd(ism.placeholder("float32", (3,)), ism.placeholder("int64", (2, 1)),
                            ism.placeholder("float32", (2,)), "avg"), "reduction"),
    (lambda: ism.trilu(ism.placeholder("float32", (3,))), "rank"),
])
def test_errors_at_construction(build, msg):
    with ism.Graph().as_default():
        with pytest.raises(ism.ShapeError, match=msg):
            build()
