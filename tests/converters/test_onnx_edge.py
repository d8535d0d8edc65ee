"""The ONNX edge writer (ORT Mobile): every model it writes passes onnx.checker, loads in
onnxruntime and matches isthmus's edge interpreter (fp32 within 1e-5 relative; int8 as QDQ within
one quantization step end to end on the MLP and the W2 CNN, and within the int8 model's own drift
from fp32 on MobileNetV2)."""
import numpy as np
import onnxruntime as ort
import pytest

from isthmus.converters.edge_export import to_edge
from isthmus.converters.onnx_edge import OnnxEdgeExportError, edge_to_onnx, split_to_onnx
from isthmus.converters.quantize import quantize_to_edge
from isthmus.edge.interpreter import Interpreter
from isthmus.edge.writer import ModelWriter

from isthmus.edge.loader import loads

from ..split_models import adaptive_cnn
from .edge_models import MODELS, _feeds, mlp
from .edge_op_cases import CASES, model


def run_ort(model, *inputs, fuse: bool = True):
    """fuse=False keeps the QDQ graph as written (ORT_ENABLE_BASIC: what the model means, Q/DQ
    computed as written); True lets ORT fuse QDQ into its integer kernels (QLinearConv, ...)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    if not fuse:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    s = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return s.run(None, {i.name: x for i, x in zip(s.get_inputs(), inputs)})


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fp32_matches_the_edge_interpreter(name):
    build, shape = MODELS[name]
    sess, x, y = build()
    edge = to_edge(sess, [y])
    model = edge_to_onnx(edge)
    for xv in _feeds(shape, 2):
        want = Interpreter(edge).invoke(xv)[0]
        got = run_ort(model, xv)[0]
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_int8_as_qdq_every_op_within_one_step_and_the_whole_within_the_drift(name):
    """Each int8 op of the QDQ model, given isthmus's own int8 values, lands within one step of
    isthmus's output; end to end, where such steps compound through the layers, ORT's fused integer
    kernels differ from isthmus's int8 output by less than that differs from fp32. (Per op, the QDQ
    graph is run as written: ORT's fused x86 u8s8 kernels on a CPU without VNNI saturate 16-bit
    pair sums, up to 25 steps on 0.2% of the W2 CNN's first conv outputs here.)"""
    from isthmus.converters.split_export import SplitWriter
    from isthmus.edge.loader import loads
    build, shape = MODELS[name]
    sess, x, y = mlp(softmax=False) if name == "mlp" else build()
    calib = [{x.node.name: v} for v in _feeds(shape, 8, seed=2)]
    edge, _ = quantize_to_edge(sess, [y], calib)
    model = edge_to_onnx(edge)
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert any(i.data_type == 3 for i in model.graph.initializer)   # int8 weights stay int8
    m = loads(edge)
    xv = _feeds(shape, 1, seed=3)[0]
    w = SplitWriter()
    ins, _ = w.add_model(m)
    w.inputs = ins
    w.outputs = sorted({i for op in m.operators for i in op.inputs + op.outputs
                        if i >= 0 and m.tensors[i].data is None and m.tensors[i].dtype == np.int8})
    as_float = lambda i, v: ((v.astype(np.float32) - m.tensors[i].zero_point[0]) * m.tensors[i].scale[0]  # noqa: E731
                             ).astype(np.float32)
    values = {i: as_float(i, v) for i, v in zip(w.outputs, Interpreter(w.to_bytes()).invoke(xv))}
    checked = 0
    for op in m.operators:
        live = [i for i in op.inputs if i >= 0 and m.tensors[i].data is None]
        if op.op in ("Quantize", "Dequantize") or not all(i in values for i in live):
            continue
        got = run_ort(edge_to_onnx(edge, inputs=live, outputs=op.outputs[:1]), *[values[i] for i in live],
                      fuse=False)[0]
        step = float(m.tensors[op.outputs[0]].scale[0])
        d = np.abs(got - values[op.outputs[0]]).max()
        assert d <= step * 1.0001, (m.tensors[op.outputs[0]].name, op.op, d / step)
        checked += 1
    assert checked >= 2
    for xv in _feeds(shape, 2, seed=3):
        want = Interpreter(edge).invoke(xv)[0]
        drift = np.abs(want - sess.run(y, {x: xv})).max()
        got = run_ort(model, xv, fuse=False)[0]
        assert np.abs(got - want).max() <= drift, (np.abs(got - want).max(), drift)
        fused = run_ort(model, xv)[0]    # ORT's integer kernels: the same top-1
        assert fused.shape == want.shape and np.argmax(fused) == np.argmax(want)


def test_unsupported_op_is_refused_naming_the_node():
    w = ModelWriter()
    x = w.add_input("x", "float32", (1, 4))
    y = w.add_tensor("mystery", "float32", (1, 4))
    w.add_operator("Cumsum", [x], [y])   # no edge kernel, so no writer form either
    w.mark_output(y)
    from isthmus.edge.loader import loads
    m = loads(w.to_bytes())
    with pytest.raises(OnnxEdgeExportError, match=r"'mystery' \(Cumsum\)"):
        edge_to_onnx(m)


def test_split_part_outputs_carry_the_wire_names(tmp_path):
    from isthmus.converters.split_export import export_split
    from isthmus.edge import Interpreter as EdgeInterpreter
    from isthmus.edge.split_model import load_split
    sess, x, y, _, ap = adaptive_cnn()
    sp = export_split(sess, [y], ap)
    path = sp.save(str(tmp_path / "cnn.isth"))
    cut = next(c for c in sp.cuts if c.cloud_part and c.inputs != ["x:0"])
    part = split_to_onnx(path, cut=cut.name)
    assert [o.name for o in part.edge.graph.output] == cut.inputs and part.cloud_part == cut.cloud_part
    xv = _feeds((1, 3, 32, 32), 1)[0]
    model = next(c.model for c in load_split(path).cuts if c.name == cut.name)
    captured = []
    EdgeInterpreter(model, remote=lambda p, arrays: captured.extend(arrays) or [np.zeros((1, 10), np.float32)]
                    ).invoke(xv)
    for got, want in zip(run_ort(part.edge, xv), captured):
        assert got.shape == want.shape and np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    with pytest.raises(OnnxEdgeExportError, match="no cut 'nope'"):
        split_to_onnx(path, cut="nope")



@pytest.mark.parametrize("name", sorted(CASES))
def test_single_op_matches_the_edge_interpreter(name):
    """Every translated edge op alone (tests/converters/edge_op_cases.py): fp32 within 1e-5
    relative; an int8 result, dequantized, within one step (the QDQ graph as written)."""
    op, args, out, shape, attrs = CASES[name]
    edge = model(op, args, out, shape, attrs)
    feeds = [a.value for a in args if not a.const]
    want = Interpreter(edge).invoke(*feeds)[0]
    m = loads(edge)
    floats = []
    for i, x in zip(m.inputs, feeds):   # int8 inputs arrive as their float values
        t = m.tensors[i]
        floats.append(((x.astype(np.float32) - t.zero_point[0]) * t.scale[0]).astype(np.float32)
                      if x.dtype == np.int8 else x)
    got = run_ort(edge_to_onnx(edge), *floats, fuse=False)[0]
    assert got.shape == want.shape
    if want.dtype == np.int8:
        t = m.tensors[m.outputs[0]]
        want = (want.astype(np.float32) - t.zero_point[0]) * t.scale[0]
        assert np.abs(got - want).max() <= t.scale[0] * 1.0001
    else:
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))


def test_split_outputs_each_part():
    from isthmus.edge.writer import ModelWriter
    rng = np.random.default_rng(4)
    w = ModelWriter()
    x = w.add_input("x", "float32", (2, 7))
    ys = [w.add_tensor(f"y{i}", "float32", (2, c)) for i, c in enumerate((3, 4))]
    w.add_operator("Split", [x], ys, {"axis": 1, "sizes": [3, 4], "num": 0})
    for y in ys:
        w.mark_output(y)
    edge = w.to_bytes()
    xv = rng.standard_normal((2, 7)).astype(np.float32)
    for g, v in zip(run_ort(edge_to_onnx(edge), xv), Interpreter(edge).invoke(xv)):
        np.testing.assert_array_equal(g, v)


def test_every_op_the_edge_runs_has_an_onnx_and_a_tflite_form():
    """The writers keep up with edge/capabilities.py: an op added there without a writer fails here."""
    from isthmus.converters.onnx_edge import SUPPORTED
    from isthmus.converters.tflite_write import supported_ops
    from isthmus.edge import capabilities
    assert set(capabilities.FP32) - SUPPORTED == set()
    assert set(capabilities.FP32) - set(supported_ops()) == set()
    assert set(capabilities.INT8) - set(supported_ops()) == set()
    assert capabilities.WRITERS_PENDING == frozenset()
