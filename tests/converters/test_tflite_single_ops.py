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
