"""Whole real-architecture models through ONNX: an MLP, a CNN, a MobileNetV2-style net with batch
norm and a two-layer transformer encoder are exported to ONNX, imported back, checked against
onnxruntime, split between edge and cloud by the partitioner, and (where the edge has kernels)
run on the edge interpreter."""
import numpy as np
import onnxruntime as ort
import pytest

import isthmus as ism
from isthmus import nn
from isthmus.converters import from_onnx, to_onnx
from isthmus.converters.edge_export import to_edge
from isthmus.edge import Interpreter
from isthmus.partitioner import CostModel, LinkModel, SplitSession, plan_split


def mlp(x):
    return nn.Sequential([nn.Dense(32, activation="relu"), nn.Dense(32, activation="tanh"), nn.Dense(10)])(x)


def cnn(x):
    h = nn.Conv2D(8, 3, activation="relu")(x)
    h = ism.max_pool(h, 2, 2)
    h = nn.Conv2D(16, 3, strides=2, activation="relu")(h)
    return nn.Dense(10)(ism.flatten(h))


def mobilenet(x):
    h = nn.Conv2D(16, 3, strides=2)(x)
    h = ism.relu6(nn.BatchNorm()(h))
    for expand, out in ((4, 16), (4, 24)):
        inp = h
        h = ism.relu6(nn.BatchNorm()(nn.Conv2D(h.shape[1] * expand, 1, use_bias=False)(h)))
        h = ism.relu6(nn.BatchNorm()(nn.DepthwiseConv2D(3, use_bias=False)(h)))
        h = nn.BatchNorm()(nn.Conv2D(out, 1, use_bias=False)(h))
        if inp.shape[1] == out:
            h = h + inp
    return nn.Dense(10)(ism.global_avg_pool(h))


def encoder(x, layers=2, d=16, heads=2):
    t = x.shape[1]
    dh = d // heads
    h = x
    for i in range(layers):
        qkv = nn.Dense(3 * d, name=f"l{i}/qkv")(ism.reshape(h, (-1, d)))
        qkv = ism.transpose(ism.reshape(qkv, (-1, t, 3, heads, dh)), (2, 0, 3, 1, 4))  # [3, B, H, T, dh]
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = ism.softmax(ism.matmul(q, k, transpose_b=True) * (1.0 / np.sqrt(dh)))
        ctx = ism.reshape(ism.transpose(att @ v, (0, 2, 1, 3)), (-1, d))
        h2 = ism.reshape(nn.Dense(d, name=f"l{i}/proj")(ctx), (-1, t, d))
        h = nn.LayerNorm(name=f"l{i}/ln1")(h + h2)
        ff = nn.Dense(d, name=f"l{i}/ff2")(nn.Dense(2 * d, activation="gelu", name=f"l{i}/ff1")(ism.reshape(h, (-1, d))))
        h = nn.LayerNorm(name=f"l{i}/ln2")(h + ism.reshape(ff, (-1, t, d)))
    return ism.reduce_mean(h, 1)


def session_of(build, shape):
    """(sess, x, y): y = build(x) for a float32 placeholder "x" of shape, variables initialized."""
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", shape, name="x")
        y = build(x)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return sess, x, y


CASES = [("mlp", mlp, (2, 20), True), ("cnn", cnn, (2, 3, 16, 16), True),
         ("mobilenet", mobilenet, (1, 3, 32, 32), True), ("transformer", encoder, (2, 8, 16), False)]


@pytest.mark.parametrize("name,build,shape,on_edge", CASES, ids=[c[0] for c in CASES])
def test_export_import_split_and_edge(name, build, shape, on_edge):
    rng = np.random.default_rng(0)
    sess, x, y = session_of(build, shape)
    xv = rng.standard_normal(shape).astype(np.float32)
    want = sess.run(y, {x: xv})
    model = to_onnx(sess, [y])
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": xv})[0]
    np.testing.assert_allclose(ref, want, rtol=1e-4, atol=1e-5)
    g2, ins, outs = from_onnx(model)
    got = ism.Session(g2).run(outs[0], {ins["x"]: xv})
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)  # imported model == onnxruntime
    plan = plan_split(g2, CostModel.edge_cloud(LinkModel.parse("20mbps", "40ms"), batch_size=shape[0]),
                      outputs=[outs[0]])
    split = SplitSession(plan.partition()).run({ins["x"].node.name: xv})[0]
    np.testing.assert_allclose(split, ref, rtol=1e-4, atol=1e-5)
    if on_edge:
        edge = Interpreter(to_edge(ism.Session(g2), [outs[0]], batch=shape[0])).invoke(xv)[0]
        np.testing.assert_allclose(edge, ref, rtol=1e-4, atol=1e-4)


def test_lstm_classifier_round_trips_through_onnx_loop():
    from isthmus.core.rnn import LSTMCell, dynamic_rnn
    rng = np.random.default_rng(1)
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (2, 5, 4), name="x")
        _, (c, h) = dynamic_rnn(LSTMCell(6, seed=1), x, return_outputs=False)
        y = nn.Dense(3, name="head")(h)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    xv = rng.standard_normal((2, 5, 4)).astype(np.float32)
    want = sess.run(y, {x: xv})
    model = to_onnx(sess, [y])
    assert any(nd.op_type == "Loop" for nd in model.graph.node)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": xv})[0]
    np.testing.assert_allclose(ref, want, rtol=1e-4, atol=1e-5)
    g2, ins, outs = from_onnx(model)
    np.testing.assert_allclose(ism.Session(g2).run(outs[0], {ins["x"]: xv}), ref, rtol=1e-4, atol=1e-5)
