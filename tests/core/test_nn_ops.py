"""NN ops: forward against numpy written out, gradients against finite differences."""
import numpy as np
import pytest

import isthmus as ism

from .opcheck import check_forward, check_gradients

rng = np.random.default_rng(0)


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(x, axis=-1):
    return np.log(np_softmax(x, axis))


def np_sparse_xent(labels, logits):
    return -np_log_softmax(logits)[np.arange(len(labels)), labels]


def np_bn(x, scale, offset, mean, var, eps, axis):
    shape = [1] * x.ndim
    shape[axis] = -1
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + offset.reshape(shape)


def np_ln(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    v = x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(v + eps) * g + b


X = rng.standard_normal((4, 5))
LABELS = np.array([0, 3, 4, 1], np.int32)
PROBS = np_softmax(rng.standard_normal((4, 5)))
C = 3
XC = rng.standard_normal((2, C, 3, 2))
SC, OF, MU, VA = rng.standard_normal(C), rng.standard_normal(C), rng.standard_normal(C), rng.uniform(0.5, 2, C)

CASES = [
    ("softmax", ism.softmax, [X], np_softmax),
    ("softmax_axis0", lambda x: ism.softmax(x, 0), [X], lambda x: np_softmax(x, 0)),
    ("log_softmax", ism.log_softmax, [X], np_log_softmax),
    ("sparse_xent", lambda x: ism.sparse_softmax_cross_entropy(ism.constant(LABELS), x), [X],
     lambda x: np_sparse_xent(LABELS, x)),
    ("dense_xent", lambda x, p: ism.softmax_cross_entropy(p, x), [X, PROBS],
     lambda x, p: -(p * np_log_softmax(x)).sum(1)),
    ("bn_inference", lambda x, s, o, m, v: ism.batch_norm(x, s, o, m, v, 1e-3, False, 1), [XC, SC, OF, MU, VA],
     lambda x, s, o, m, v: np_bn(x, s, o, m, v, 1e-3, 1)),
    ("bn_training", lambda x, s, o: ism.batch_norm(x, s, o, MU, VA, 1e-3, True, 1)[0], [XC, SC, OF],
     lambda x, s, o: np_bn(x, s, o, x.mean((0, 2, 3)), x.var((0, 2, 3)), 1e-3, 1)),
    ("bn_training_nc", lambda x, s, o: ism.batch_norm(x, s, o, np.zeros(5), np.ones(5), 1e-3, True, -1)[0],
     [X, rng.standard_normal(5), rng.standard_normal(5)],
     lambda x, s, o: np_bn(x, s, o, x.mean(0), x.var(0), 1e-3, 1)),
    ("layer_norm", lambda x, g, b: ism.layer_norm(x, g, b), [X, rng.standard_normal(5), rng.standard_normal(5)], np_ln),
]


@pytest.mark.parametrize("name,build,inputs,ref", CASES, ids=[c[0] for c in CASES])
def test_forward(name, build, inputs, ref):
    check_forward(build, inputs, ref, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name,build,inputs,ref", CASES, ids=[c[0] for c in CASES])
def test_gradient(name, build, inputs, ref):
    wrt = [0] if name == "dense_xent" else None
    check_gradients(build, inputs, wrt=wrt)


def test_batch_norm_training_returns_batch_stats():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float64", XC.shape)
        y, m, v = ism.batch_norm(x, SC, OF, MU, VA, training=True)
        got = ism.Session(g).run([m, v], {x: XC})
    np.testing.assert_allclose(got[0], XC.mean((0, 2, 3)))
    np.testing.assert_allclose(got[1], XC.var((0, 2, 3)))


def test_dropout_masks_and_scales_and_its_gradient_uses_the_mask():
    g = ism.Graph(seed=3)
    with g.as_default():
        x = ism.placeholder("float32", (200, 50))
        y = ism.dropout(x, 0.25)
        (dx,) = ism.gradients(ism.reduce_sum(y), [x])
        sess = ism.Session(g)
        yv, dxv = sess.run([y, dx], {x: np.ones((200, 50), np.float32)})
    kept = yv != 0
    assert abs(kept.mean() - 0.75) < 0.02
    np.testing.assert_allclose(yv[kept], 1 / 0.75, rtol=1e-6)
    np.testing.assert_array_equal(dxv, yv)  # the same mask in one run
    y2 = sess.run(y, {x: np.ones((200, 50), np.float32)})
    assert not np.array_equal(y2, yv)  # a fresh mask per run


def test_label_out_of_range_is_reported():
    g = ism.Graph()
    with g.as_default():
        y = ism.sparse_softmax_cross_entropy(ism.constant(np.array([7], np.int32)),
                                             ism.constant(np.zeros((1, 3), np.float32)), name="xent")
        with pytest.raises(ism.ExecutionError, match=r"'xent'.*label out of range"):
            ism.Session(g).run(y)


def test_shape_errors():
    with ism.Graph().as_default():
        with pytest.raises(ism.ShapeError, match="labels \\[N\\] and logits"):
            ism.sparse_softmax_cross_entropy(ism.constant(np.zeros((2, 2), np.int32)), ism.constant(np.zeros((2, 3), np.float32)))
        with pytest.raises(ism.ShapeError, match="scale must be"):
            ism.batch_norm(ism.constant(np.zeros((2, 3, 4, 4), np.float32)), np.ones(4, np.float32), np.zeros(3, np.float32),
                           np.zeros(3, np.float32), np.ones(3, np.float32))
        with pytest.raises(ism.ShapeError, match="rate must be"):
            ism.dropout(ism.constant(np.zeros(3, np.float32)), 1.0)


@pytest.mark.parametrize("shape,axis", [((2, 7, 33), -1), ((3, 1, 64), 2), ((2, 3, 4), 1)])
def test_layer_norm_float32_rows(shape, axis):
    """The last-axis kernel (row means and variances as BLAS products) and the general one, float32
    rows far from zero (offset 100, small spread: float32 keeps about 2e-5 of the result), against float64."""
    x = (100 + rng.standard_normal(shape) * 0.5).astype(np.float32)
    norm = shape[axis:]
    g, b = rng.standard_normal(norm).astype(np.float32), rng.standard_normal(norm).astype(np.float32)
    graph = ism.Graph()
    with graph.as_default():
        got = ism.Session(graph).run(ism.layer_norm(ism.constant(x), g, b, axis=axis))
    axes = tuple(range(axis % len(shape), len(shape)))
    x64 = x.astype(np.float64)
    mu, var = x64.mean(axis=axes, keepdims=True), x64.var(axis=axes, keepdims=True)
    want = (x64 - mu) / np.sqrt(var + 1e-5) * g + b
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
