"""Whole models on the edge (issue 21 item 2): a small transformer encoder and LSTM models (an isthmus
layer over LSTMSequence, and an ONNX LSTM imported) export whole to the edge and match the executor, and
planning puts all of them on the edge now that the capability table says it runs them."""
import numpy as np
import pytest

import isthmus as ism
from isthmus import nn
from isthmus.converters.edge_export import to_edge
from isthmus.core.ops.recurrent import lstm_sequence
from isthmus.core.passes import freeze
from isthmus.edge import Interpreter
from isthmus.partitioner import CostModel, LinkModel, plan_split
from isthmus.partitioner.devices import EDGE, EDGE_DEVICE

from tests.converters.test_whole_models import encoder, session_of


class LSTM(nn.Layer):
    """A one-direction LSTM layer for inference over x [T, B, I]: one LSTMSequence node (ONNX gates)."""

    def __init__(self, units: int, name: str = "lstm", seed: int = 0):
        super().__init__(name, seed)
        self.units = units

    def build(self, x):
        h, i, rng = self.units, x.shape[-1], self._rng()
        self.w = self._var("w", rng.uniform(-0.5, 0.5, (4 * h, i)), x.dtype)
        self.r = self._var("r", rng.uniform(-0.5, 0.5, (4 * h, h)), x.dtype)
        self.b = self._var("b", rng.uniform(-0.2, 0.2, (4 * h,)), x.dtype)

    def call(self, x, training):
        return lstm_sequence(x, self.w, self.r, self.b)


def lstm_model(x):
    """Two stacked LSTMs and a dense head on the last hidden state."""
    y, _, _ = LSTM(16, name="l1")(x)
    _, h, _ = LSTM(12, name="l2")(y)
    return nn.Dense(5, name="head")(h)


def tiny_encoder(x):
    return encoder(x, layers=1, d=16, heads=2)


def _onnx_lstm_graph():
    """An ONNX bidirectional LSTM (as torch exports one) with a Gemm head, imported by isthmus."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    from isthmus.converters import from_onnx
    rng = np.random.default_rng(3)
    t, b, i, h = 7, 2, 4, 6
    w = rng.uniform(-0.4, 0.4, (2, 4 * h, i)).astype(np.float32)
    r = rng.uniform(-0.4, 0.4, (2, 4 * h, h)).astype(np.float32)
    bias = rng.uniform(-0.2, 0.2, (2, 8 * h)).astype(np.float32)
    head = rng.standard_normal((2 * h, 3)).astype(np.float32)
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh"], hidden_size=h, direction="bidirectional"),
             helper.make_node("Transpose", ["yh"], ["yt"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["yt", "shape"], ["flat"]),
             helper.make_node("MatMul", ["flat", "head"], ["out"])]
    inits = [numpy_helper.from_array(v, n) for v, n in ((w, "W"), (r, "R"), (bias, "B"), (head, "head"))]
    inits.append(numpy_helper.from_array(np.array([b, 2 * h], np.int64), "shape"))
    graph = helper.make_graph(nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [t, b, i])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [b, 3])], inits)
    g, ins, outs = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    return g, ins["x"], outs[0]


def _models():
    """(name, graph without variables, input, output)"""
    from isthmus.converters import from_onnx, to_onnx
    for name, build, shape in (("encoder", tiny_encoder, (2, 8, 16)), ("lstm", lstm_model, (9, 3, 4))):
        sess, x, y = session_of(build, shape)
        g = freeze(sess, [y])
        yield name, g, g.tensor(x.name), g.tensor(y.name)
        if name == "encoder":  # through ONNX and back: gelu comes back spelled out with Erf
            g2, ins, outs = from_onnx(to_onnx(sess, [y]))
            yield "encoder-onnx", g2, ins["x"], outs[0]
    g, x, y = _onnx_lstm_graph()
    yield "onnx_bilstm", g, x, y


MODELS = list(_models())


@pytest.mark.parametrize("name,g,x,y", MODELS, ids=[m[0] for m in MODELS])
def test_whole_model_runs_on_the_edge_as_the_executor(name, g, x, y):
    xv = np.random.default_rng(0).standard_normal(tuple(x.shape)).astype(np.float32)
    want = ism.Session(g).run(y, {x: xv})
    it = Interpreter(to_edge(g, [y], [x], batch=x.shape[0]))
    got = it.invoke(xv)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    ops = {op for _, op in it.steps_info}
    assert ops & {"LSTMSequence", "LayerNorm", "Erf"}, ops  # the fused kernels ran, not a graph of small ops


@pytest.mark.parametrize("name,g,x,y", MODELS, ids=[m[0] for m in MODELS])
def test_planning_puts_the_whole_model_on_the_edge(name, g, x, y):
    """Behind a slow link (1 Mbit/s, 40 ms) with the default device profiles, shipping the input costs more
    than running the model: every node goes to the edge, which it can now run."""
    batch = x.shape[0]
    for cost in (CostModel.edge_cloud(LinkModel(1e6, 1e6, 0.04), batch_size=batch),
                 CostModel.edge_cloud(LinkModel(1e3, 1e3, 0.04), edge=EDGE.scaled(0.01), batch_size=batch)):
        plan = plan_split(g, cost, outputs=[y])
        ops = {n.name: n.op for n in g.nodes}
        off = sorted(k for k, d in plan.placement.items() if d != EDGE_DEVICE and ops.get(k) != "Const")
        assert off == [], f"{name}: planned off the edge: {off}"
        fused = [k for k, d in plan.placement.items() if ops.get(k) in ("LSTMSequence", "Gelu", "Erf")
                 and d == EDGE_DEVICE]
        assert fused, f"{name}: no LSTM, Gelu or Erf node planned on the edge"


@pytest.mark.parametrize("build,shape,min_int8", [(tiny_encoder, (2, 8, 16), 10), (lstm_model, (9, 3, 4), 1)],
                         ids=["encoder", "lstm"])
def test_whole_model_quantizes_with_int8_where_the_edge_has_it(build, shape, min_int8):
    """quantize_to_edge on the same models: the ops with int8 kernels (dense layers, transposes, slices,
    softmax, ...) go int8, the rest (layer norm, batched attention products, the LSTM) stay fp32 between
    Quantize/Dequantize; the result stays within a few steps of the executor's."""
    from isthmus.converters.quantize import quantize_to_edge
    sess, x, y = session_of(build, shape)
    rng = np.random.default_rng(0)
    model, report = quantize_to_edge(sess, [y], [rng.standard_normal(shape).astype(np.float32) for _ in range(8)],
                                     batch=shape[0])
    assert report["int8_ops"] >= min_int8, report["int8_ops"]
    xv = rng.standard_normal(shape).astype(np.float32)
    want = sess.run(y, {x: xv})
    got = Interpreter(model).invoke(xv)[0]
    assert np.abs(got - want).max() <= 0.05 * np.abs(want).max(), np.abs(got - want).max()
