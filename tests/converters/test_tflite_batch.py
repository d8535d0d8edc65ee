"""Batch in the written .tflite: an edge model exported with a dynamic batch (batch=-1) becomes a file
whose signature says -1, and LiteRT, resized to batch 3, computes what isthmus's interpreter computes
at batch 3 (fp32 to 1e-5 relative, int8 within one step of the logits), reshapes (Flatten) included; a
fixed-batch export says its batch in the signature."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.converters.edge_export import to_edge
from isthmus.converters.quantize import quantize_to_edge
from isthmus.converters.tflite_write import edge_to_tflite
from isthmus.edge import Interpreter
from isthmus.edge.loader import loads

litert = pytest.importorskip("ai_edge_litert.interpreter")
pytest.importorskip("tflite")


def _net():
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 1, 12, 12), name="x")
        net = ism.nn.Sequential([ism.nn.Conv2D(4, 3, activation="relu"), ism.nn.MaxPool2D(2), ism.nn.Flatten(),
                                 ism.nn.Dense(5)])
        y = ism.softmax(net(x))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return sess, x, y


def _litert(data: bytes, xs: np.ndarray) -> np.ndarray:
    it = litert.Interpreter(model_content=data, num_threads=1)
    d = it.get_input_details()[0]
    it.resize_tensor_input(d["index"], (len(xs),) + tuple(d["shape"][1:]))
    it.allocate_tensors()
    it.set_tensor(d["index"], np.ascontiguousarray(xs.transpose(0, 2, 3, 1)))
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


@pytest.mark.parametrize("int8", [False, True])
def test_a_dynamic_batch_export_runs_at_any_batch_in_litert(int8):
    sess, x, y = _net()
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((3, 1, 12, 12)).astype(np.float32)
    calib = [{"x": rng.standard_normal((1, 1, 12, 12)).astype(np.float32)} for _ in range(4)]
    edge = quantize_to_edge(sess, [y], calib, batch=-1)[0] if int8 else to_edge(sess, [y], batch=-1)
    m = loads(edge)
    data = edge_to_tflite(edge)
    it = litert.Interpreter(model_content=data, num_threads=1)
    assert list(it.get_input_details()[0]["shape_signature"]) == [-1, 12, 12, 1]
    assert list(it.get_output_details()[0]["shape_signature"]) == [-1, 5]
    for n in (1, 3):
        want = Interpreter(edge, input_shapes={m.tensors[m.inputs[0]].name: (n, 1, 12, 12)}).invoke(xs[:n])[0]
        got = _litert(data, xs[:n])
        assert got.shape == want.shape == (n, 5)
        if int8:
            # the logits' int8 step (Softmax runs in float after Dequantize; it moves no output more than that)
            step = float(next(m.tensors[op.inputs[0]].scale[0] for op in m.operators if op.op == "Dequantize"))
            assert np.abs(got - want).max() <= step * 1.0001
        else:
            assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
            assert np.abs(got - sess.run(y, {x: xs[:n]})).max() <= 1e-5


def test_a_fixed_batch_export_says_its_batch():
    sess, x, y = _net()
    data = edge_to_tflite(to_edge(sess, [y], batch=2))
    it = litert.Interpreter(model_content=data, num_threads=1)
    assert list(it.get_input_details()[0]["shape_signature"]) == [2, 12, 12, 1]
    xs = np.random.default_rng(1).standard_normal((2, 1, 12, 12)).astype(np.float32)
    assert np.abs(_litert(data, xs) - sess.run(y, {x: xs})).max() <= 1e-5
