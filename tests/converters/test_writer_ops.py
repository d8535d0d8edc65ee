"""The edge ops the format writers gained for issues 21/26, one at a time (writer_op_cases.py): the
written .tflite in LiteRT and the written ONNX in onnxruntime against isthmus's edge interpreter on
the same inputs, fp32 within 1e-5 relative, int8 within one quantization step."""
import numpy as np
import onnxruntime as ort
import pytest

from isthmus.converters.onnx_edge import edge_to_onnx
from isthmus.converters.tflite_write import edge_to_tflite, read_metadata
from isthmus.edge.interpreter import Interpreter
from isthmus.edge.loader import loads

from .edge_op_cases import model
from .writer_op_cases import CASES

litert = pytest.importorskip("ai_edge_litert.interpreter")


def run_litert(data: bytes, feeds, reset: bool = False):
    it = litert.Interpreter(model_content=data, num_threads=1)
    it.allocate_tensors()
    if reset:
        it.reset_all_variables()
    for d, x, meta in zip(it.get_input_details(), feeds, read_metadata(data)["inputs"]):
        x = np.asarray(x)   # (np.ascontiguousarray would make a 0-d array 1-d)
        it.set_tensor(d["index"], np.array(x.transpose(0, 2, 3, 1) if meta["layout"] == "NHWC" else x, order="C"))
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def run_onnx(proto, feeds):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC   # the QDQ graph as written
    s = ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return s.run(None, {i.name: x for i, x in zip(s.get_inputs(), feeds)})


def as_float(t, v: np.ndarray) -> np.ndarray:
    """An int8 edge tensor's value as the float the ONNX edge part carries."""
    if v.dtype != np.int8:
        return v
    return ((v.astype(np.float32) - t.zero_point[0]) * t.scale[0]).astype(np.float32)


def output_step(m, k: int) -> float:
    """One step of the int8 tensor output k of model m was dequantized from (0 for a float output)."""
    e = m.outputs[k]
    op = next((op for op in m.operators if e in op.outputs), None)
    if op is not None and op.op == "Dequantize":
        return float(m.tensors[op.inputs[0]].scale[0])
    return float(m.tensors[e].scale[0]) if len(m.tensors[e].scale) else 0.0


def assert_close(got: np.ndarray, want: np.ndarray, t, what: str) -> None:
    """fp32 within 1e-5 relative; an int8 output (int8 from LiteRT, its float value from onnxruntime)
    within one step of the edge interpreter's."""
    assert got.shape == want.shape, (what, got.shape, want.shape)
    if want.dtype == np.int8:
        step = float(t.scale[0])
        d = np.abs(as_float(t, got) - as_float(t, want)).max() if got.size else 0.0
        assert d <= step * 1.0001, (what, d / step)
    else:
        d = np.abs(got - want).max() if got.size else 0.0
        assert d <= 1e-5 * max(1.0, float(np.abs(want).max())), (what, d)


def check_both(edge: bytes, feeds) -> None:
    """The edge model's outputs in LiteRT (.tflite) and onnxruntime (ONNX) equal the interpreter's."""
    m = loads(edge)
    want = Interpreter(edge).invoke(*feeds)
    outs = [m.tensors[i] for i in m.outputs]
    for k, (g, w_) in enumerate(zip(run_litert(edge_to_tflite(edge), feeds, reset=True), want)):
        assert g.dtype == w_.dtype
        assert_close(g, w_, outs[k], f"litert output {k}")
    floats = [as_float(m.tensors[i], x) for i, x in zip(m.inputs, feeds)]
    for k, (g, w_) in enumerate(zip(run_onnx(edge_to_onnx(edge), floats), want)):
        if w_.dtype == np.int8:   # the float value, on the output's int8 grid: back to int8 to compare steps
            t = outs[k]
            g = np.clip(np.rint(g / t.scale[0]) + t.zero_point[0], -128, 127).astype(np.int8)
        assert_close(g, w_, outs[k], f"onnx output {k}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_in_litert_and_onnxruntime_matches_the_edge_interpreter(name):
    op, args, out, shape, attrs = CASES[name]
    check_both(model(op, args, out, shape, attrs), [a.value for a in args if not a.const])


def test_attributes_the_edge_refuses_are_refused_naming_the_node_and_the_format():
    from isthmus.converters.onnx_edge import OnnxEdgeExportError
    from isthmus.converters.tflite_write import TFLiteExportError
    from .edge_op_cases import Arg, Out
    from .writer_op_cases import spec
    edge = model("StridedSlice", [Arg(np.ones((3, 4), np.float32))], Out("float32"), (4,), spec(("index", 7)))
    with pytest.raises(TFLiteExportError, match=r"TFLite export: operator 'y' \(StridedSlice\): .*index 7"):
        edge_to_tflite(edge)
    with pytest.raises(OnnxEdgeExportError, match=r"ONNX edge export: operator 'y' \(StridedSlice\): .*index 7"):
        edge_to_onnx(edge)


def sequence_model(op: str, steps: int, batch: int, feat: int, hid: int, attrs: dict, states: bool = False,
                   read_c: bool = False, seed: int = 0):
    """A one-op LSTMSequence / GRUSequence edge model (y and h_T as outputs; c_T too when read_c) and its
    feeds: x, then the initial states when `states`."""
    from isthmus.edge.writer import ModelWriter
    rng = np.random.default_rng(seed)
    gates, bias_rows, n_states = (4, 4, 2) if op == "LSTMSequence" else (3, 6, 1)
    w = ModelWriter()
    x = w.add_input("x", "float32", (steps, batch, feat))
    feeds = [rng.standard_normal((steps, batch, feat)).astype(np.float32)]
    consts = [w.add_constant(n, (rng.standard_normal(s) * 0.5).astype(np.float32)) for n, s in
              (("W", (gates * hid, feat)), ("R", (gates * hid, hid)), ("b", (bias_rows * hid,)))]
    ins = [x] + consts
    if states:
        for k in range(n_states):
            ins.append(w.add_input(f"state{k}", "float32", (batch, hid)))
            feeds.append(rng.standard_normal((batch, hid)).astype(np.float32))
    outs = [w.add_tensor("y", "float32", (steps, batch, hid))]
    outs += [w.add_tensor(n, "float32", (batch, hid)) for n in ("h_T", "c_T")[:n_states]]
    w.add_operator(op, ins, outs, attrs)
    for o in outs[:3 if read_c else 2]:
        w.mark_output(o)
    return w.to_bytes(), feeds


@pytest.mark.parametrize("op,steps,batch,feat,hid,attrs", [
    ("LSTMSequence", 5, 1, 3, 4, {"reverse": 0}),
    ("LSTMSequence", 4, 3, 5, 7, {"reverse": 1}),
    ("GRUSequence", 5, 1, 3, 4, {"reverse": 0, "linear_before_reset": 0}),
    ("GRUSequence", 6, 3, 5, 7, {"reverse": 1, "linear_before_reset": 1}),
    ("GRUSequence", 1, 3, 2, 3, {"reverse": 0, "linear_before_reset": 1}),
])
def test_recurrent_sequence_in_litert_and_onnxruntime(op, steps, batch, feat, hid, attrs):
    """LSTM as UNIDIRECTIONAL_SEQUENCE_LSTM (LiteRT's variables reset before the invoke), GRU unrolled;
    ONNX LSTM / GRU; y and h_T against the edge interpreter."""
    edge, feeds = sequence_model(op, steps, batch, feat, hid, attrs)
    check_both(edge, feeds)


def test_gru_with_an_initial_state():
    edge, feeds = sequence_model("GRUSequence", 4, 3, 5, 6, {"reverse": 0, "linear_before_reset": 0}, states=True)
    check_both(edge, feeds)


@pytest.mark.parametrize("reverse", [0, 1])
def test_lstm_with_initial_states_and_its_cell_state_read_is_unrolled(reverse):
    """TFLite's sequence LSTM keeps h and c in variable tensors: given states, or a read c_T, the writer
    unrolls the steps instead; ONNX's LSTM takes both."""
    from isthmus.converters.tflite_schema import fb
    edge, feeds = sequence_model("LSTMSequence", 4, 3, 3, 5, {"reverse": reverse}, states=True, read_c=True)
    check_both(edge, feeds)
    edge, feeds = sequence_model("LSTMSequence", 3, 1, 2, 4, {"reverse": reverse}, read_c=True, seed=1)
    check_both(edge, feeds)
    m = fb.Model.GetRootAs(edge_to_tflite(edge), 0)
    codes = {m.OperatorCodes(k).BuiltinCode() for k in range(m.OperatorCodesLength())}
    assert fb.BuiltinOperator.UNIDIRECTIONAL_SEQUENCE_LSTM not in codes and fb.BuiltinOperator.PACK in codes


def test_a_free_batch_stays_free_through_the_new_shape_ops():
    """Written at batch 1 with a free (-1) batch, the .tflite resized to batch 3 in LiteRT equals the edge
    interpreter at batch 3; a slice that bounds the free batch is refused naming the node."""
    from isthmus.converters.tflite_write import TFLiteExportError
    from isthmus.edge.writer import ModelWriter
    from .writer_op_cases import spec
    w = ModelWriter()
    x = w.add_input("x", "float32", (-1, 4, 6))
    s = w.add_tensor("sliced", "float32", (-1, 4, 4))
    w.add_operator("StridedSlice", [x], [s], spec(("slice",), ("slice",), ("slice", 1, -1)))
    e = w.add_tensor("expanded", "float32", (-1, 1, 4, 4))
    w.add_operator("ExpandAxes", [s], [e], {"axes": [1]})
    y = w.add_tensor("y", "float32", (-1, 4, 4))
    w.add_operator("Squeeze", [e], [y], {"axes": [1]})
    w.mark_output(y)
    edge = w.to_bytes()
    xv = np.random.default_rng(2).standard_normal((3, 4, 6)).astype(np.float32)
    it = litert.Interpreter(model_content=edge_to_tflite(edge), num_threads=1)
    it.resize_tensor_input(it.get_input_details()[0]["index"], [3, 4, 6])
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], xv)
    it.invoke()
    want = Interpreter(edge, input_shapes={"x": (3, 4, 6)}).invoke(xv)[0]
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), want)
    w = ModelWriter()
    x = w.add_input("x", "float32", (-1, 4))
    y = w.add_tensor("first_row", "float32", (1, 4))
    w.add_operator("StridedSlice", [x], [y], spec(("slice", 0, 1)))
    w.mark_output(y)
    with pytest.raises(TFLiteExportError, match=r"'first_row' \(StridedSlice\): a slice of the free batch"):
        edge_to_tflite(w.to_bytes())


def test_a_free_batch_through_a_transposed_conv():
    """The output shape of TRANSPOSE_CONV follows the input's batch at run time (SHAPE, SLICE, CONCATENATION)."""
    from isthmus.edge.writer import ModelWriter
    rng = np.random.default_rng(3)
    w = ModelWriter()
    x = w.add_input("x", "float32", (-1, 3, 4, 5))
    k = w.add_constant("k", rng.standard_normal((3, 2, 3, 3)).astype(np.float32))
    y = w.add_tensor("y", "float32", (-1, 2, 7, 9))
    w.add_operator("ConvTranspose2D", [x, k], [y], {"strides": [2, 2], "dilations": [1, 1], "pads": [1, 1, 1, 1],
                                                    "groups": 1, "output_padding": [0, 0]})
    w.mark_output(y)
    edge = w.to_bytes()
    data = edge_to_tflite(edge)
    for batch in (1, 3):
        xv = rng.standard_normal((batch, 3, 4, 5)).astype(np.float32)
        it = litert.Interpreter(model_content=data, num_threads=1)
        it.resize_tensor_input(it.get_input_details()[0]["index"], [batch, 4, 5, 3])
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], np.ascontiguousarray(xv.transpose(0, 2, 3, 1)))
        it.invoke()
        got = it.get_tensor(it.get_output_details()[0]["index"])
        want = Interpreter(edge, input_shapes={"x": xv.shape}).invoke(xv)[0]
        assert got.shape == want.shape and np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))


def test_int8_split_pieces_with_their_own_parameters():
    """SPLIT_V moves int8 values as they are: a piece quantized unlike the input is requantized after it."""
    from isthmus.edge.writer import ModelWriter
    rng = np.random.default_rng(8)
    w = ModelWriter()
    x = w.add_tensor("x", "int8", (3, 7, 2, 2), scale=[0.05], zero_point=[3])
    w.inputs.append(x)
    ys = [w.add_tensor("same", "int8", (3, 3, 2, 2), scale=[0.05], zero_point=[3]),
          w.add_tensor("own", "int8", (3, 4, 2, 2), scale=[0.08], zero_point=[-10])]
    w.add_operator("Split", [x], ys, {"axis": 1, "sizes": [3, 4], "num": 0})
    for y in ys:
        w.mark_output(y)
    check_both(w.to_bytes(), [rng.integers(-128, 128, (3, 7, 2, 2)).astype(np.int8)])
