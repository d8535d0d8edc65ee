"""ONNX LSTMs imported by isthmus and written as .tflite: each direction becomes one fused
UNIDIRECTIONAL_SEQUENCE_LSTM, and LiteRT's result equals onnxruntime's on the ONNX model and the
isthmus Session's on the imported graph (1e-5 relative): a forward classifier reading Y_h, and a
bidirectional layer returning Y and Y_h."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import isthmus as ism
from isthmus.converters import from_onnx
from isthmus.converters.tflite_write_graph import graph_to_tflite

ort = pytest.importorskip("onnxruntime")
litert = pytest.importorskip("ai_edge_litert.interpreter")
tflite = pytest.importorskip("tflite")

T, B, I, H = 6, 2, 5, 8


def _weights(rng, d, k=""):
    return [numpy_helper.from_array((rng.standard_normal((d, 4 * H, I)) * 0.4).astype(np.float32), "W" + k),
            numpy_helper.from_array((rng.standard_normal((d, 4 * H, H)) * 0.4).astype(np.float32), "R" + k),
            numpy_helper.from_array((rng.standard_normal((d, 8 * H)) * 0.4).astype(np.float32), "B" + k)]


def _classifier(rng):
    """Forward LSTM, Y unused, Y_h -> Squeeze -> Gemm -> Softmax (what a sequence classifier exports)."""
    inits = _weights(rng, 1) + [numpy_helper.from_array(np.array([0], np.int64), "ax0"),
                                numpy_helper.from_array(rng.standard_normal((H, 3)).astype(np.float32), "head_w"),
                                numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "head_b")]
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["", "yh"], hidden_size=H),
             helper.make_node("Squeeze", ["yh", "ax0"], ["hT"]),
             helper.make_node("Gemm", ["hT", "head_w", "head_b"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["p"], axis=-1)]
    outs = [helper.make_tensor_value_info("p", TensorProto.FLOAT, [B, 3])]
    return nodes, inits, outs


def _bidirectional(rng):
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh"], hidden_size=H, direction="bidirectional")]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, 2, B, H]),
            helper.make_tensor_value_info("yh", TensorProto.FLOAT, [2, B, H])]
    return nodes, _weights(rng, 2), outs


def _model(kind):
    rng = np.random.default_rng(7)
    nodes, inits, outs = {"classifier": _classifier, "bidirectional": _bidirectional}[kind](rng)
    m = helper.make_model(helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                        [T, B, I])], outs, inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def _ops(data: bytes):
    m = tflite.Model.GetRootAs(data, 0)
    names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
    codes = [max(m.OperatorCodes(k).BuiltinCode(), m.OperatorCodes(k).DeprecatedBuiltinCode())
             for k in range(m.OperatorCodesLength())]
    g = m.Subgraphs(0)
    return [names[codes[g.Operators(k).OpcodeIndex()]] for k in range(g.OperatorsLength())]


@pytest.mark.parametrize("kind", ["classifier", "bidirectional"])
def test_onnx_lstm_as_fused_tflite_lstm_matches_onnxruntime_and_the_session(kind):
    m = _model(kind)
    g, ins, outs = from_onnx(m)
    assert [n.op for n in g.nodes].count("LSTMSequence") == (2 if kind == "bidirectional" else 1)
    sess = ism.Session(g)
    data = graph_to_tflite(sess, list(outs))
    ops = _ops(data)
    assert ops.count("UNIDIRECTIONAL_SEQUENCE_LSTM") == (2 if kind == "bidirectional" else 1), ops
    assert ops.count("REVERSE_V2") == (2 if kind == "bidirectional" else 0), ops
    it = litert.Interpreter(model_content=data, num_threads=1)
    it.allocate_tensors()
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for _ in range(2):
        xv = rng.standard_normal((T, B, I)).astype(np.float32)
        it.reset_all_variables()
        it.set_tensor(it.get_input_details()[0]["index"], xv)
        it.invoke()
        got = [it.get_tensor(d["index"]) for d in it.get_output_details()]
        mine = sess.run(list(outs), {ins["x"]: xv})
        want = ref.run(None, {"x": xv})
        assert len(got) == len(want)
        for gv, mv, wv in zip(got, mine, want):
            assert gv.shape == wv.shape
            scale = max(1.0, float(np.abs(wv).max()))
            assert np.abs(gv - mv).max() <= 1e-5 * scale
            assert np.abs(gv - wv).max() <= 1e-5 * scale
