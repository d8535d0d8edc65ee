"""The TFLite writer: every .tflite it writes loads in LiteRT's interpreter and computes what
isthmus computes (fp32 within 1e-5 relative of the edge interpreter and the core Session; int8
within one quantization step of the edge interpreter)."""
import numpy as np
import pytest

from isthmus.converters.edge_export import to_edge
from isthmus.converters.quantize import quantize_to_edge
from isthmus.converters.tflite_write import (TFLiteExportError, edge_to_tflite, read_metadata, supported_ops,
                                             to_tflite)
from isthmus.edge.interpreter import Interpreter
from isthmus.edge.writer import ModelWriter

from .edge_models import MODELS, _feeds, _load, mlp, mobilenet

litert = pytest.importorskip("ai_edge_litert.interpreter")


def run_litert(data: bytes, *inputs):
    """Outputs of a .tflite in LiteRT (one thread); rank-4 NCHW inputs are handed over as NHWC and
    rank-4 outputs come back as the file's metadata says (NCHW by default)."""
    it = litert.Interpreter(model_content=data, num_threads=1)
    it.allocate_tensors()
    meta = read_metadata(data)
    for d, x, m in zip(it.get_input_details(), inputs, meta["inputs"]):
        x = np.asarray(x)
        if m["layout"] == "NHWC":
            x = x.transpose(0, 2, 3, 1)
        it.set_tensor(d["index"], np.ascontiguousarray(x.astype(d["dtype"])))
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def assert_fp32_close(got, want):
    want = np.asarray(want, np.float32)
    tol = 1e-5 * max(1.0, float(np.abs(want).max()))
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= tol, (np.abs(got - want).max(), tol)


def assert_int8_within_one_step(data: bytes, edge: bytes, x, steps: int = 1):
    """The float outputs differ by at most one step (or `steps`) of the int8 tensor they were dequantized from."""
    got = run_litert(data, x)[0]
    want = Interpreter(edge).invoke(x)[0]
    q = read_metadata(data)["outputs"][0]["quantization"]
    assert q is not None and got.shape == want.shape
    assert np.abs(got - want).max() <= steps * q["scale"][0] * 1.0001, (np.abs(got - want).max(), q)
    return got, want


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fp32_matches_the_edge_interpreter_and_the_session(name):
    build, shape = MODELS[name]
    sess, x, y = build()
    edge = to_edge(sess, [y])
    data = edge_to_tflite(edge)
    for xv in _feeds(shape, 2):
        got = run_litert(data, xv)[0]
        assert_fp32_close(got, Interpreter(edge).invoke(xv)[0])
        assert_fp32_close(got, sess.run(y, {x: xv}))


@pytest.mark.parametrize("name", ["mlp", "w2_cnn"])
def test_int8_within_one_step_of_the_edge_interpreter(name):
    build, shape = MODELS[name]
    sess, x, y = mlp(softmax=False) if name == "mlp" else build()   # an int8 output: the logits
    calib = [{x.node.name: v} for v in _feeds(shape, 8, seed=2)]
    edge, _ = quantize_to_edge(sess, [y], calib)
    data = edge_to_tflite(edge)
    # each op is within one step (LiteRT's XNNPACK rounds requantization ties to even, isthmus half up, and
    # the convs' short multipliers make ties common); through the CNN's two dense layers after its convs
    # the steps can add: over 60 other random inputs one output reaches 2 steps with free dense scales,
    # none with dense scales rounded to 4 bits (the quantizer's default), and one of these three does
    for xv in _feeds(shape, 3, seed=3):
        assert_int8_within_one_step(data, edge, xv, steps=1 if name == "mlp" else 2)
    assert to_tflite(sess, [y], int8=True, calibration=calib) == data


def test_int8_mobilenet_every_op_within_one_step_and_the_whole_within_the_quantization_drift():
    """Each int8 op, given isthmus's own int8 inputs, lands within one step of isthmus's output
    (the two round differently at ties: LiteRT's XNNPACK requantizes in float). Through 30 layers
    of a random-weight network those steps compound, so end to end the check is the quantization
    drift: LiteRT's logits differ from isthmus's int8 logits by less than those differ from fp32."""
    from isthmus.converters.split_export import SplitWriter
    from isthmus.edge.loader import loads
    sess, x, y = mobilenet()
    calib = [{x.node.name: v} for v in _feeds((1, 3, 32, 32), 8, seed=2)]
    edge, _ = quantize_to_edge(sess, [y], calib)
    m = loads(edge)
    xv = _feeds((1, 3, 32, 32), 1, seed=3)[0]
    w = SplitWriter()
    ins, _ = w.add_model(m)
    w.inputs = ins
    w.outputs = sorted({i for op in m.operators for i in op.inputs + op.outputs
                        if i >= 0 and m.tensors[i].data is None and m.tensors[i].dtype == np.int8})
    values = dict(zip(w.outputs, Interpreter(w.to_bytes()).invoke(xv)))
    checked = 0
    for op in m.operators:
        live = [i for i in op.inputs if i >= 0 and m.tensors[i].data is None]
        if op.op in ("Quantize", "Dequantize") or not all(i in values for i in live):
            continue
        got = run_litert(edge_to_tflite(edge, inputs=live, outputs=op.outputs[:1]), *[values[i] for i in live])[0]
        d = np.abs(got.astype(int) - values[op.outputs[0]].astype(int)).max()
        assert d <= 1, (m.tensors[op.outputs[0]].name, op.op, d)
        checked += 1
    assert checked >= 30
    data = edge_to_tflite(edge)
    got, want = run_litert(data, xv)[0], Interpreter(edge).invoke(xv)[0]
    drift = np.abs(want - sess.run(y, {x: xv})).max()
    assert np.abs(got - want).max() <= drift, (np.abs(got - want).max(), drift)


def test_int8_io_types_drop_the_boundary_quantize_and_dequantize():
    sess, x, y = MODELS["w2_cnn"][0]()
    calib = [{"x": v} for v in _feeds((1, 1, 28, 28), 6, seed=2)]
    edge, _ = quantize_to_edge(sess, [y], calib)
    data = edge_to_tflite(edge, input_type="int8", output_type="int8")
    meta = read_metadata(data)
    qi, qo = meta["inputs"][0]["quantization"], meta["outputs"][0]["quantization"]
    assert meta["inputs"][0]["dtype"] == meta["outputs"][0]["dtype"] == "int8"
    xv = _feeds((1, 1, 28, 28), 1, seed=4)[0]
    xq = np.clip(np.rint(xv / qi["scale"][0]) + qi["zero_point"][0], -128, 127).astype(np.int8)
    got = run_litert(data, xq)[0]
    assert got.dtype == np.int8
    want = Interpreter(edge).invoke(xv)[0]
    want_q = np.clip(np.rint(want / qo["scale"][0]) + qo["zero_point"][0], -128, 127)
    assert np.abs(got.astype(int) - want_q).max() <= 1


def test_edge_cnn_int8_is_bit_exact_through_every_layer():
    """tests/edge/cnn.py's int8 CNN (asymmetric pads, depthwise, residual add, max pool, global
    pool, dense, int8 softmax): every intermediate, read as an output, equals isthmus's bytes."""
    edge_cnn = _load("edge_cnn", "tests", "edge", "cnn.py")
    from isthmus.converters.split_export import SplitWriter
    from isthmus.edge.loader import loads
    data = edge_cnn.int8()
    m = loads(data)
    xv = _feeds(edge_cnn.SHAPE, 1, seed=5)[0]
    for name in ("h1", "h2", "h4", "h6", "h7", "y"):
        w = SplitWriter()
        ins, _ = w.add_model(m)
        w.inputs = ins
        w.outputs = [next(i for i, t in enumerate(m.tensors) if t.name == name)]
        want = Interpreter(w.to_bytes()).invoke(xv)[0]
        got = run_litert(edge_to_tflite(data, outputs=[name]), xv)[0]
        assert got.dtype == np.int8 and np.abs(got.astype(int) - want.astype(int)).max() <= 1, name


def test_layout_is_nhwc_inside_with_no_transposes_between_image_ops():
    from isthmus.converters.tflite_schema import fb
    sess, x, y = MODELS["mobilenet_v2_32"][0]()
    data = edge_to_tflite(to_edge(sess, [y]))
    m = fb.Model.GetRootAs(data, 0)
    names = {v: k for k, v in vars(fb.BuiltinOperator).items() if not k.startswith("_")}
    sub = m.Subgraphs(0)
    ops = [names[m.OperatorCodes(sub.Operators(i).OpcodeIndex()).BuiltinCode()] for i in range(sub.OperatorsLength())]
    assert "TRANSPOSE" not in ops, ops
    assert ops.count("DEPTHWISE_CONV_2D") == 10 and "MEAN" in ops and "FULLY_CONNECTED" in ops
    assert list(sub.Tensors(sub.Inputs(0)).ShapeAsNumpy()) == [1, 32, 32, 3]
    # an NCHW input keeps one leading TRANSPOSE
    data2 = edge_to_tflite(to_edge(sess, [y]), input_layout="nchw")
    xv = _feeds((1, 3, 32, 32), 1)[0]
    it = litert.Interpreter(model_content=data2, num_threads=1)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], xv)
    it.invoke()
    assert_fp32_close(it.get_tensor(it.get_output_details()[0]["index"]), sess.run(y, {x: xv}))


def test_nchw_output_of_an_image_tensor_and_metadata():
    """A rank-4 output (what a split sends to the cloud) comes back NCHW, as the cloud expects."""
    sess, x, y = MODELS["mobilenet_v2_32"][0]()
    feat = sess.graph.tensor(next(n.name for n in sess.graph.nodes if n.name.startswith("block3")
                                  and n.op == "Add") + ":0")
    edge = to_edge(sess, [feat])
    data = edge_to_tflite(edge, wire_names=["block3/add:0"])
    xv = _feeds((1, 3, 32, 32), 1)[0]
    got = run_litert(data, xv)[0]
    assert_fp32_close(got, sess.run(feat, {x: xv}))
    meta = read_metadata(data)
    assert meta["outputs"][0]["layout"] == "NCHW" and meta["outputs"][0]["wire_name"] == "block3/add:0"
    assert meta["inputs"][0]["layout"] == "NHWC" and meta["inputs"][0]["shape"] == [1, 32, 32, 3]


def test_unsupported_ops_are_refused_naming_the_node_and_op():
    w = ModelWriter()
    x = w.add_input("x", "float32", (1, 4, 8, 8))
    k = w.add_input("k", "float32", (4, 4, 3, 3))      # weights computed at run time (a grouped conv is written)
    y = w.add_tensor("run_time_weights", "float32", (1, 4, 8, 8))
    w.add_operator("Conv2D", [x, k], [y], {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1],
                                           "groups": 1})
    w.mark_output(y)
    with pytest.raises(TFLiteExportError, match=r"'run_time_weights' \(Conv2D\).*constant weights only"):
        edge_to_tflite(w.to_bytes())
    assert "FusedConv2D" in supported_ops() and "Softmax" in supported_ops()


def test_explicit_pads_and_padded_max_pool():
    """Pads that are neither VALID nor TFLite's SAME become an explicit PAD (PADV2 for max pool)."""
    rng = np.random.default_rng(7)
    w = ModelWriter()
    x = w.add_input("x", "float32", (1, 3, 9, 9))
    k = w.add_constant("k", rng.standard_normal((8, 3, 3, 3)).astype(np.float32))
    h = w.add_tensor("conv", "float32", (1, 8, 5, 5))
    w.add_operator("Conv2D", [x, k], [h], {"strides": [2, 2], "dilations": [1, 1], "pads": [1, 1, 1, 1], "groups": 1})
    p = w.add_tensor("pool", "float32", (1, 8, 3, 3))
    w.add_operator("MaxPool", [h], [p], {"ksize": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})
    w.mark_output(p)
    edge = w.to_bytes()
    xv = rng.standard_normal((1, 3, 9, 9)).astype(np.float32)
    assert_fp32_close(run_litert(edge_to_tflite(edge), xv)[0], Interpreter(edge).invoke(xv)[0])


def test_split_part_with_edge_work_after_the_cloud_answer():
    """A cut whose edge part goes on after the cloud's answer: split_to_tflite writes the part before
    (outputs: the sent tensors, by wire name) and the part after (inputs: the answer, then the model's
    inputs it reads), which together compute what isthmus's interpreter computes with the same cloud."""
    import json
    from isthmus.converters.split_export import SplitWriter
    from isthmus.converters.tflite_write import split_to_tflite
    from isthmus.wire.split_format import SPLIT_KEY
    rng = np.random.default_rng(0)
    w = SplitWriter()
    w.begin("cut0")
    x = w.add_input("x", "float32", (1, 3, 6, 6))
    k = w.add_constant("k", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    h = w.add_tensor("h", "float32", (1, 4, 6, 6))
    w.add_operator("Conv2D", [x, k], [h], {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "groups": 1})
    r = w.add_tensor("answer", "float32", (1, 4, 6, 6))
    w.add_remote_part("cut0", [h], [r])
    y = w.add_tensor("y", "float32", (1, 4, 6, 6))
    w.add_operator("Relu", [r], [y])
    w.mark_output(y)
    w.metadata[SPLIT_KEY] = json.dumps({"version": 1, "model": "m", "full": None, "rtt_s": 0.01, "cuts": [
        {"name": "cut0", "subgraph": 0, "cloud_part": "cut0", "inputs": ["conv:0"], "outputs": ["cloud:0"],
         "min_bandwidth_bps": 0, "max_bandwidth_bps": None, "predicted_s": 0.0, "terms": [0, 0, 1, 0, 1]}]})
    data = w.to_bytes()
    cloud = lambda arrays: [np.tanh(arrays[0]) - 0.3]   # noqa: E731  (the cloud part, as a function)
    part = split_to_tflite(data, cut="cut0")
    assert part.post is not None and read_metadata(part.edge)["outputs"][0]["wire_name"] == "conv:0"
    xv = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    from isthmus.edge.split_model import read_split
    from isthmus.edge.loader import verify_all
    model = read_split(verify_all(data)).cuts[0].model
    want = Interpreter(model, remote=lambda p, arrays: cloud(arrays)).invoke(xv)[0]
    sent = run_litert(part.edge, xv)
    assert len(read_metadata(part.post)["inputs"]) == 1     # the answer only: the post part never reads x
    got = run_litert(part.post, *cloud(sent))[0]
    assert_fp32_close(got, want)
    # the reference client runs both parts around its cloud call (here the function above)
    from isthmus.edge.litert_client import LiteRTOffloadClient
    client = LiteRTOffloadClient(part.edge, "127.0.0.1:1", post=part.post)
    client.call_cloud = cloud
    assert_fp32_close(client.invoke(xv)[0], want)
