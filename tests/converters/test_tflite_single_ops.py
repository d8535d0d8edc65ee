"""Every edge op the TFLite writer translates, one at a time (tests/edge/singleop.py's models): the
.tflite in LiteRT against isthmus's edge interpreter on the same inputs, fp32 within 1e-5
relative, int8 within one quantization step; rank-4 operands cross as NHWC."""
import numpy as np
import pytest

from isthmus.converters.tflite_write import edge_to_tflite, read_metadata
from isthmus.edge.interpreter import Interpreter

from .edge_op_cases import CASES, model

litert = pytest.importorskip("ai_edge_litert.interpreter")


@pytest.mark.parametrize("name", sorted(CASES))
def test_single_op_matches_the_edge_interpreter(name):
    op, args, out, shape, attrs = CASES[name]
    edge = model(op, args, out, shape, attrs)
    feeds = [a.value for a in args if not a.const]
    want = Interpreter(edge).invoke(*feeds)[0]
    data = edge_to_tflite(edge)
    it = litert.Interpreter(model_content=data, num_threads=1)
    it.allocate_tensors()
    for d, x, meta in zip(it.get_input_details(), feeds, read_metadata(data)["inputs"]):
        it.set_tensor(d["index"], np.ascontiguousarray(x.transpose(0, 2, 3, 1) if meta["layout"] == "NHWC" else x))
    it.invoke()
    got = it.get_tensor(it.get_output_details()[0]["index"])
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype == np.int8:
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    else:
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))


def test_split_into_parts_along_a_channel_axis():
    """SPLIT_V of an NHWC-held tensor along its channels, three outputs (the edge op's sizes)."""
    from isthmus.edge.writer import ModelWriter
    rng = np.random.default_rng(4)
    w = ModelWriter()
    x = w.add_input("x", "float32", (1, 6, 4, 4))
    k = w.add_constant("k", rng.standard_normal((7, 6, 1, 1)).astype(np.float32))
    h = w.add_tensor("h", "float32", (1, 7, 4, 4))
    w.add_operator("Conv2D", [x, k], [h], {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "groups": 1})
    ys = [w.add_tensor(f"y{i}", "float32", (1, c, 4, 4)) for i, c in enumerate((2, 4, 1))]
    w.add_operator("Split", [h], ys, {"axis": 1, "sizes": [2, 4, 1], "num": 0})
    for y in ys:
        w.mark_output(y)
    edge = w.to_bytes()
    xv = rng.standard_normal((1, 6, 4, 4)).astype(np.float32)
    want = Interpreter(edge).invoke(xv)
    data = edge_to_tflite(edge)
    it = litert.Interpreter(model_content=data, num_threads=1)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], np.ascontiguousarray(xv.transpose(0, 2, 3, 1)))
    it.invoke()
    got = [it.get_tensor(d["index"]) for d in it.get_output_details()]
    assert len(got) == 3
    for g, v in zip(got, want):
        assert g.shape == v.shape and np.abs(g - v).max() <= 1e-5 * max(1.0, float(np.abs(v).max()))
