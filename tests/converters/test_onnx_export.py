"""ONNX export, checked by onnxruntime giving the same outputs as the isthmus executor."""
import numpy as np
import onnxruntime as ort
import pytest

import isthmus as ism
from isthmus.converters.onnx_export import ExportError, to_onnx

rng = np.random.default_rng(0)


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _check(build, feeds_np, rtol=1e-4, atol=1e-5):
    g = ism.Graph(seed=0)
    with g.as_default():
        phs, out = build()
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
        want = sess.run(out, dict(zip(phs, feeds_np)))
    model = to_onnx(sess, [out])
    got = _ort(model, {p.node.name: v for p, v in zip(phs, feeds_np)})[0]
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return model


def test_mlp():
    def build():
        x = ism.placeholder("float32", (None, 8), name="x")
        net = ism.nn.Sequential([ism.nn.Dense(16, activation="relu"), ism.nn.Dense(12, activation="gelu"),
                                 ism.nn.Dense(4)])
        return [x], ism.softmax(net(x))
    _check(build, [rng.standard_normal((3, 8)).astype(np.float32)])


def test_cnn_with_batch_norm_pooling_and_depthwise():
    def build():
        x = ism.placeholder("float32", (None, 3, 16, 16), name="img")
        h = ism.nn.Conv2D(8, 3, strides=2, activation="relu6")(x)
        h = ism.nn.BatchNorm()(h)
        h = ism.nn.DepthwiseConv2D(3)(h)
        h = ism.max_pool(h, 3, 2, "SAME")
        h = ism.avg_pool(h, 2, 1, "SAME")
        h = ism.global_avg_pool(h)
        return [x], ism.nn.Dense(5)(h)
    _check(build, [rng.standard_normal((2, 3, 16, 16)).astype(np.float32)])


def test_array_ops_and_reductions():
    def build():
        x = ism.placeholder("float32", (2, 6, 4), name="x")
        a = ism.transpose(x, (0, 2, 1))[:, 1:, ::2]
        b = ism.concat(ism.split(x, [2, 4], axis=1)[::-1], axis=1)
        c = ism.reduce_mean(ism.pad(b, ((0, 0), (1, 0), (0, 2))), axis=(1,), keepdims=True)
        d = ism.reshape(ism.reduce_sum(a, 1), (-1,)) + ism.reduce_max(x)
        e = ism.layer_norm(x, np.ones(4, np.float32), np.zeros(4, np.float32))
        return [x], ism.concat([ism.flatten(c), ism.expand_dims(d, 0) + ism.reduce_sum(e)], axis=0)
    _check(build, [rng.standard_normal((2, 6, 4)).astype(np.float32)])


def test_unsupported_ops_are_listed_all_at_once():
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder("float32", (None, 3), name="x")
        y = ism.sparse_softmax_cross_entropy(ism.constant(np.zeros(2, np.int32)), ism.random_normal((2, 3)) + 0.0)
    with pytest.raises(ExportError, match="RandomNormal x1.*SparseSoftmaxCrossEntropy x1"):
        to_onnx(g, [y])


def test_cond_exports_as_if():
    def build():
        x = ism.placeholder("float32", (3,), name="x")
        y = ism.cond(ism.greater(ism.reduce_sum(x), 0.0), lambda: x * 2.0, lambda: ism.exp(x) - 1.0)
        return [x], y
    for sign in (1.0, -1.0):
        m = _check(build, [sign * np.abs(rng.standard_normal(3)).astype(np.float32)])
    assert any(n.op_type == "If" for n in m.graph.node)
