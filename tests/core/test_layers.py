"""isthmus.nn layers: forward against numpy, weight reuse, batch-norm modes, training works."""
import numpy as np
import pytest

import isthmus as ism
from isthmus import nn


def _run(build, *inputs):
    g = ism.Graph(seed=0)
    with g.as_default():
        phs = [ism.placeholder(a.dtype, (None,) + a.shape[1:]) for a in inputs]
        out, layer = build(*phs)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
        return sess.run(out, dict(zip(phs, inputs))), [sess.run(v) for v in layer.variables], sess, g


def test_dense_matches_numpy_and_is_deterministic():
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    got, (w, b), _, _ = _run(lambda x: (lambda l: (l(x), l))(nn.Dense(5, activation="tanh", name="d")), x)
    np.testing.assert_allclose(got, np.tanh(x @ w + b), rtol=1e-6)
    again, (w2, _), _, _ = _run(lambda x: (lambda l: (l(x), l))(nn.Dense(5, activation="tanh", name="d")), x)
    np.testing.assert_array_equal(w, w2)


def test_layer_reuses_its_variables_across_calls():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 3))
        layer = nn.Dense(2)
        a, b = layer(x), layer(x * 2.0)
    assert len(layer.variables) == 2 and len(ism.trainable_variables(g)) == 2


def test_batch_norm_training_updates_moving_stats_and_inference_uses_them():
    rng = np.random.default_rng(1)
    xv = (rng.standard_normal((64, 3)) * 3 + 5).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 3))
        bn = nn.BatchNorm(momentum=0.5)
        y_train = bn(x, training=True)
        y_eval = bn(x, training=False)
        w = ism.Variable(np.ones(3, np.float32), name="w")
        step = ism.optimizers.SGD(0.0).minimize(ism.reduce_mean(y_train * w))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
        yt = sess.run(y_train, {x: xv})
        np.testing.assert_allclose(yt.mean(0), 0, atol=1e-5)
        for _ in range(30):
            sess.run(step, {x: xv})
        np.testing.assert_allclose(sess.run(bn.moving_mean), xv.mean(0), rtol=1e-4)
        ye = sess.run(y_eval, {x: xv})
    np.testing.assert_allclose(ye, (xv - xv.mean(0)) / np.sqrt(xv.var(0) + 1e-3), rtol=1e-3, atol=1e-3)


def test_embedding_gradient_is_sparse_and_updates_only_used_rows():
    g = ism.Graph()
    with g.as_default():
        ids = ism.placeholder("int32", (None,))
        emb = nn.Embedding(10, 4, seed=0)
        loss = ism.reduce_sum(emb(ids))
        step = ism.optimizers.SGD(0.5).minimize(loss)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
        before = sess.run(emb.embeddings)
        sess.run(step, {ids: np.array([1, 1, 7], np.int32)})
        after = sess.run(emb.embeddings)
    changed = np.where((after != before).any(1))[0]
    assert changed.tolist() == [1, 7]
    np.testing.assert_allclose(after[1], before[1] - 1.0, rtol=1e-6)


def test_dropout_only_in_training_and_sequential():
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 4))
        net = nn.Sequential([nn.Dense(8, activation="relu"), nn.Dropout(0.5), nn.Dense(2)])
        a, b = net(x, training=False), net(x, training=False)
        c = net(x, training=True)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
        xv = np.ones((3, 4), np.float32)
        np.testing.assert_array_equal(sess.run(a, {x: xv}), sess.run(b, {x: xv}))
        assert len(net.variables) == 4


def test_small_mlp_learns_xor():
    xv = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)
    yv = np.array([0, 1, 1, 0], np.int32)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 2))
        y = ism.placeholder("int32", (None,))
        logits = nn.Sequential([nn.Dense(16, activation="tanh", seed=1), nn.Dense(2, seed=2)])(x)
        loss = nn.sparse_softmax_cross_entropy(y, logits)
        acc = nn.accuracy(y, logits)
        step = ism.optimizers.Adam(0.05).minimize(loss)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
        for _ in range(300):
            sess.run(step, {x: xv, y: yv})
        assert sess.run(loss, {x: xv, y: yv}) < 0.05
        assert sess.run(acc, {x: xv, y: yv}) == 1.0


def test_unknown_activation_is_named():
    with pytest.raises(ValueError, match="unknown activation 'swishy'"):
        nn.Dense(3, activation="swishy")
