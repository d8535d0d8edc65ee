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
        layer(x), layer(x * 2.0)
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
        h = net.layers[0].call(x, False)  # what the dropout layer sees
        hv, dropped = sess.run([h, net.layers[1](h, training=True)], {x: xv})
        kept = dropped != 0
        assert 0 < kept.sum() < (hv != 0).sum()  # some units dropped, the rest scaled by 1 / (1 - rate)
        np.testing.assert_allclose(dropped[kept], hv[kept] * 2.0, rtol=1e-6)
        assert not np.array_equal(sess.run(c, {x: xv}), sess.run(a, {x: xv}))


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


# ---- forward passes against numpy --------------------------------------------------------------------
def _np_conv(x, w, stride, pad, groups=1):
    """NCHW x, OIHW w, symmetric zero padding `pad`, by loops over output pixels."""
    n, c, h, wd = x.shape
    o, ci, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    per = o // groups
    for f in range(o):
        gi = f // per
        for i in range(oh):
            for j in range(ow):
                patch = xp[:, gi * ci:(gi + 1) * ci, i * stride:i * stride + kh, j * stride:j * stride + kw]
                out[:, f, i, j] = np.tensordot(patch, w[f], axes=3)
    return out


def _layer_out(layer, xv, training=False):
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder(xv.dtype, xv.shape)
        y = layer(x, training=training)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
        return sess.run(y, {x: xv}), [sess.run(v) for v in layer.variables]


def test_conv2d_matches_numpy():
    xv = np.random.default_rng(0).standard_normal((2, 3, 7, 7))
    got, (w, b) = _layer_out(nn.Conv2D(4, 3, strides=2, padding="SAME", activation="relu", seed=1), xv)
    want = np.maximum(_np_conv(xv, w, 2, 1) + b[None, :, None, None], 0)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert w.shape == (4, 3, 3, 3)


def test_depthwise_conv2d_matches_numpy():
    xv = np.random.default_rng(1).standard_normal((2, 3, 5, 5))
    got, (w, b) = _layer_out(nn.DepthwiseConv2D(3, depth_multiplier=2, padding="VALID", seed=2), xv)
    assert w.shape == (6, 1, 3, 3)
    np.testing.assert_allclose(got, _np_conv(xv, w, 1, 0, groups=3) + b[None, :, None, None], rtol=1e-10, atol=1e-12)


def test_layer_norm_matches_numpy():
    xv = np.random.default_rng(2).standard_normal((4, 6)) * 3 + 1
    got, (gamma, beta) = _layer_out(nn.LayerNorm(epsilon=1e-5), xv)
    mu, var = xv.mean(-1, keepdims=True), xv.var(-1, keepdims=True)
    np.testing.assert_allclose(got, (xv - mu) / np.sqrt(var + 1e-5) * gamma + beta, rtol=1e-10, atol=1e-12)


def test_batch_norm_nchw_training_output_matches_numpy():
    xv = np.random.default_rng(3).standard_normal((4, 3, 2, 2)) * 2 + 1
    layer = nn.BatchNorm(epsilon=1e-3)
    got, _ = _layer_out(layer, xv, training=True)
    mu, var = xv.mean((0, 2, 3), keepdims=True), xv.var((0, 2, 3), keepdims=True)
    np.testing.assert_allclose(got, (xv - mu) / np.sqrt(var + 1e-3), rtol=1e-10, atol=1e-12)
    assert len(layer.updates) == 2  # moving mean and variance, also in the "update_ops" collection


def test_embedding_flatten_and_losses_match_numpy():
    g = ism.Graph(seed=0)
    with g.as_default():
        ids = ism.placeholder("int32", (None, 2))
        emb = nn.Embedding(7, 3, seed=5)
        flat = nn.Flatten()(emb(ids))
        labels = ism.placeholder("int32", (None,))
        logits = ism.placeholder("float32", (None, 4))
        targets = ism.placeholder("float32", (None, 4))
        xent, acc, mse = (nn.sparse_softmax_cross_entropy(labels, logits), nn.accuracy(labels, logits),
                          nn.mse(targets, logits))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer(g))
        table = sess.run(emb.embeddings)
        idv = np.array([[0, 6], [3, 3]], np.int32)
        np.testing.assert_array_equal(sess.run(flat, {ids: idv}), table[idv].reshape(2, 6))
        rng = np.random.default_rng(6)
        lv, yv, tv = (rng.standard_normal((5, 4)).astype(np.float32), np.array([0, 1, 2, 3, 1], np.int32),
                      rng.standard_normal((5, 4)).astype(np.float32))
        got = sess.run([xent, acc, mse], {labels: yv, logits: lv, targets: tv})
    logp = lv - np.log(np.exp(lv - lv.max(1, keepdims=True)).sum(1, keepdims=True)) - lv.max(1, keepdims=True)
    np.testing.assert_allclose(got[0], -logp[np.arange(5), yv].mean(), rtol=1e-5)
    assert got[1] == pytest.approx((lv.argmax(1) == yv).mean())
    np.testing.assert_allclose(got[2], ((lv - tv) ** 2).mean(), rtol=1e-5)


def test_initializers_are_seeded_and_have_their_scale():
    rng = np.random.default_rng
    a = nn.glorot_uniform(rng(0), (300, 200), 300, 200)
    np.testing.assert_array_equal(a, nn.glorot_uniform(rng(0), (300, 200), 300, 200))
    lim = np.sqrt(6 / 500)
    assert a.min() >= -lim and a.max() <= lim and a.std() == pytest.approx(lim / np.sqrt(3), rel=0.02)
    h = nn.he_normal(rng(1), (400, 300), 400, 300)
    assert h.std() == pytest.approx(np.sqrt(2 / 400), rel=0.02)
    assert not nn.zeros(rng(2), (3, 2), 3, 2).any()
    custom = nn.Dense(2, kernel_initializer=lambda r, shape, fi, fo: np.full(shape, 0.5))
    _, (w, _) = _layer_out(custom, np.ones((1, 3)))
    np.testing.assert_array_equal(w, np.full((3, 2), 0.5))
    with pytest.raises(ValueError, match="unknown initializer 'nope'"):
        nn.Dense(2, kernel_initializer="nope")


def test_layers_build_in_the_graph_of_their_input():
    g = ism.Graph()
    other = ism.Graph()
    with other.as_default():  # the default graph is not the input's
        x = ism.placeholder("float32", (None, 3), graph=g)
        layer = nn.Dense(2)
        y = layer(x)
    assert y.graph is g and all(v.graph is g for v in layer.variables) and len(other) == 0
