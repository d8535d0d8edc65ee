"""A model already quantized in QDQ form (onnxruntime's quantize_static, QuantFormat.QDQ) goes to the edge as
int8 with its own scales and no calibration data: the edge file carries exactly the file's scales, zero points
and integer weights, runs as onnxruntime runs the QDQ model, and the CLI takes it without --calibration-data."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import isthmus as ism
from isthmus.apps import cli
from isthmus.converters import from_onnx
from isthmus.converters.quantize import quantize_to_edge
from isthmus.edge.interpreter import Interpreter
from isthmus.edge.loader import loads

ort = pytest.importorskip("onnxruntime")
oq = pytest.importorskip("onnxruntime.quantization")


def _model(nodes, inits, shape_in, shape_out):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape_in)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape_out)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m


def cnn(cin=1, res=8, stride=1):
    r = np.random.default_rng(1)
    side = res // stride // 2
    inits = {"w1": r.normal(0, .4, (4, cin, 3, 3)), "b1": r.normal(0, .1, 4), "w2": r.normal(0, .2, (6, 4, 3, 3)),
             "b2": r.normal(0, .1, 6), "w3": r.normal(0, .2, (10, 6 * side * side)), "b3": r.normal(0, .1, 10)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[stride, stride]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], transB=1)]
    return _model(nodes, {k: v.astype(np.float32) for k, v in inits.items()}, [1, cin, res, res], [1, 10])


def mlp():
    r = np.random.default_rng(2)
    inits = {"w1": r.normal(0, .3, (16, 32)), "b1": r.normal(0, .1, 32), "w2": r.normal(0, .3, (32, 10)),
             "b2": r.normal(0, .1, 10)}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["a"]), helper.make_node("MatMul", ["a", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["y"])]
    return _model(nodes, {k: v.astype(np.float32) for k, v in inits.items()}, [1, 16], [1, 10])


MODELS = {"cnn": (cnn, (1, 1, 8, 8)), "mlp": (mlp, (1, 16)),
          "wide": (lambda: cnn(3, 32, 2), (1, 3, 32, 32))}  # a large input, small inner tensors: cuts inside


def samples(shape, n, seed):
    return [np.random.default_rng(seed + i).normal(0, 1, shape).astype(np.float32) for i in range(n)]


class _Reader(oq.CalibrationDataReader):
    def __init__(self, shape):
        self.it = iter([{"x": x} for x in samples(shape, 16, 100)])

    def get_next(self):
        return next(self.it, None)


def qdq_file(tmp_path, name, per_channel, act_type):
    """The model quantized by onnxruntime in QDQ form, over 16 fixed-seed calibration samples."""
    build, shape = MODELS[name]
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}.{per_channel}.{act_type}.qdq.onnx"
    onnx.save(build(), src)
    oq.quantize_static(str(src), str(dst), _Reader(shape), quant_format=oq.QuantFormat.QDQ, per_channel=per_channel,
                       activation_type=getattr(oq.QuantType, act_type), weight_type=oq.QuantType.QInt8)
    return str(dst)


def _file_params(model):
    """From the QDQ file itself: activation (scale, zero point on the int8 grid), constants quantized to 8 bits
    (values, scales, zero points on the int8 grid: conv/dense weights, and an Add's constant operand), int32 biases."""
    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    acts, weights, biases = set(), [], []
    for n in model.graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        s, z = init[n.input[1]], init[n.input[2]]
        if n.op_type == "QuantizeLinear":
            acts.add((float(s), int(z) - (128 if z.dtype == np.uint8 else 0)))
        elif n.op_type == "DequantizeLinear" and n.input[0] in init and init[n.input[0]].dtype == np.int32:
            biases.append(init[n.input[0]])
        elif n.op_type == "DequantizeLinear" and n.input[0] in init:  # on the edge's int8 grid
            shift = 128 if z.dtype == np.uint8 else 0
            weights.append(((init[n.input[0]].astype(np.int16) - shift).astype(np.int8), s,
                            z.astype(np.int64) - shift))
    return acts, weights, biases


def _edge(path):
    g, ins, outs = from_onnx(onnx.load(path))
    data, rep = quantize_to_edge(ism.Session(g), list(outs), None)
    return data, rep


CASES = [(m, pc, at) for m in ("cnn", "mlp") for pc, at in ((False, "QUInt8"), (True, "QInt8"))]


@pytest.mark.parametrize("name,per_channel,act_type", CASES)
def test_the_edge_model_carries_the_files_scales_and_runs_as_onnxruntime(tmp_path, name, per_channel, act_type):
    path = qdq_file(tmp_path, name, per_channel, act_type)
    model = onnx.load(path)
    data, rep = _edge(path)
    assert rep["scales_from"] == "qdq" and rep["requantized"] == [] and rep["fp32_ops"] == 0
    em = loads(data)
    assert not any(em.tensors[i].name.endswith("QuantizeLinear") for op in em.operators for i in op.outputs)
    acts, weights, biases = _file_params(model)
    # (a) every int8 activation of the edge file has one of the file's (scale, zero point), and all of them appear
    edge_acts = {(float(t.scale[0]), int(t.zero_point[0])) for t in em.tensors
                 if t.dtype == np.int8 and t.data is None and len(t.scale)}
    assert edge_acts == {(float(np.float32(s)), z) for s, z in acts}
    # weights: the file's int8 values, bit for bit, under its scales (per tensor: the one scale per channel)
    edge_w = [t for t in em.tensors if t.dtype == np.int8 and t.data is not None]
    for q, s, z in weights:
        match = [t for t in edge_w if t.data.shape == q.shape and np.array_equal(t.data, q)]
        assert len(match) == 1, f"weights {q.shape} not found bit for bit"
        np.testing.assert_array_equal(match[0].zero_point, np.broadcast_to(z, match[0].zero_point.shape))
        np.testing.assert_array_equal(match[0].scale, np.broadcast_to(s, match[0].scale.shape))
    edge_b = [t.data for t in em.tensors if t.dtype == np.int32 and t.data is not None]
    for q in biases:  # int32 biases at input x weight scale: the same integers
        assert any(b.shape == q.shape and np.array_equal(b, q) for b in edge_b)
    # (b) against onnxruntime running the QDQ model as written (graph optimizations off: its default fuses the
    # pairs into QLinear kernels with their own rounding). Both round each layer's output to the same grid; they
    # can differ where a float32 sum lies within its rounding error of a half step (ORT's float conv vs the edge's
    # exact integer sum and fixed-point requantization): one step on that element, which the next layers carry
    # as at most sum|w| * s_in / s_out steps. Over these few layers that stays under 2 output steps; almost all
    # outputs agree exactly.
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    y_s = float(numpy_helper.to_array([i for i in model.graph.initializer if i.name == "y_scale"][0]))
    interp = Interpreter(data)
    diffs = []
    for x in samples(MODELS[name][1], 24, 500):
        got = np.asarray(interp.invoke(x)[0]).reshape(-1)
        want = sess.run(None, {"x": x})[0].reshape(-1)
        diffs.append(np.abs(got.astype(np.float64) - want) / y_s)
    d = np.concatenate(diffs)
    assert d.max() <= 2 + 1e-3, d.max()
    assert np.mean(d < 1e-3) >= 0.95


def _drop_pair(model, tensor):
    """The model without the QuantizeLinear/DequantizeLinear pair on `tensor` (which takes the pair's output name)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    q = [n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == tensor][0]
    dq = [n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0]][0]
    m.graph.node.remove(q)
    m.graph.node.remove(dq)
    for n in m.graph.node:
        for names in (n.input, n.output):
            for i, v in enumerate(names):
                if v == tensor:
                    names[i] = dq.output[0]
    return m


def test_a_tensor_the_file_leaves_out_is_named_or_calibrated(tmp_path):
    model = onnx.load(qdq_file(tmp_path, "cnn", True, "QInt8"))
    gemm = [n for n in model.graph.node if n.op_type == "Gemm"][0]
    cut = _drop_pair(model, gemm.output[0])  # the output loses its scale (a Relu, MaxPool or Flatten's side would
    # not: the edge takes the scale of its other side, the same numbers)
    g, ins, outs = from_onnx(cut)
    with pytest.raises(ValueError) as e:
        quantize_to_edge(ism.Session(g), list(outs), None)
    msg = str(e.value)
    assert "no scale and zero point in the QDQ model" in msg and "'Gemm" in msg, msg
    # or that node runs in float, as the file has it: onnxruntime's result up to float rounding
    data, rep = quantize_to_edge(ism.Session(g), list(outs), None, unquantized="fp32")
    assert rep["fp32_ops"] == 1 and rep["int8_ops"] > 0
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(cut.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for x in samples((1, 1, 8, 8), 4, 70):
        np.testing.assert_allclose(np.asarray(Interpreter(data).invoke(x)[0]).reshape(1, 10),
                                   sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    path = tmp_path / "cut.onnx"
    onnx.save(cut, path)
    assert cli.main(["quantize", str(path), "-o", str(tmp_path / "cut.isth"), "--unquantized", "fp32"]) == 0
    assert open(tmp_path / "cut.isth", "rb").read() == data
    # with calibration data, that tensor alone is calibrated; the others keep the file's scales
    data, rep = quantize_to_edge(ism.Session(g), list(outs), samples((1, 1, 8, 8), 8, 7))
    assert rep["scales_from"] == "qdq+calibration"
    sources = {k: v["source"] for k, v in rep["tensors"].items()}
    assert [k for k, v in sources.items() if v == "calibration"] == [outs[0].name]
    acts, _, _ = _file_params(cut)
    assert {(float(np.float32(v["scale"])), v["zero_point"]) for v in rep["tensors"].values()
            if v["source"] == "qdq"} == {(float(np.float32(s)), z) for s, z in acts}


def test_weights_with_zero_points_are_requantized_with_a_note_naming_the_node(tmp_path):
    model = onnx.load(qdq_file(tmp_path, "mlp", False, "QUInt8"))
    init = {i.name: i for i in model.graph.initializer}
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in init
          and numpy_helper.to_array(init[n.input[0]]).dtype == np.int8 and
          numpy_helper.to_array(init[n.input[0]]).ndim == 2][0]
    init[dq.input[2]].CopyFrom(numpy_helper.from_array(np.int8(3), dq.input[2]))
    g, ins, outs = from_onnx(model)
    with pytest.warns(RuntimeWarning, match="nonzero zero points"):
        data, rep = quantize_to_edge(ism.Session(g), list(outs), None)
    assert len(rep["requantized"]) == 1 and dq.name in rep["requantized"][0]
    # the model's numbers (weights (q - 3) * s) survive up to the symmetric requantization's half step
    x = samples((1, 16), 1, 3)[0]
    want = ism.Session(g).run(outs[0], {ins["x"]: x})
    assert np.abs(np.asarray(Interpreter(data).invoke(x)[0]).reshape(want.shape) - want).max() < 0.5


def test_cli_quantize_and_split_take_a_qdq_file_without_data(tmp_path, capsys):
    path = qdq_file(tmp_path, "cnn", True, "QUInt8")
    capsys.readouterr()
    assert cli.main(["quantize", path, "-o", str(tmp_path / "q.isth")]) == 0
    out = capsys.readouterr().out
    assert "scales: from the model's QDQ nodes" in out and "ops int8, 0 ops fp32" in out
    want, _ = _edge(path)
    assert open(tmp_path / "q.isth", "rb").read() == want
    assert cli.main(["split", path, "--int8", "-o", str(tmp_path / "dep")]) == 0
    out = capsys.readouterr().out
    assert "int8 scales from the model's QDQ nodes" in out
    from isthmus.edge import load_split
    full = load_split(str(tmp_path / "dep" / "model.isth")).full
    x = samples((1, 1, 8, 8), 1, 9)[0]
    np.testing.assert_array_equal(np.asarray(Interpreter(full).invoke(x)[0]),
                                  np.asarray(Interpreter(want).invoke(x)[0]))
    # a float model still needs data, and says so
    onnx.save(cnn(), tmp_path / "f.onnx")
    assert cli.main(["quantize", str(tmp_path / "f.onnx"), "-o", str(tmp_path / "f.isth")]) != 0
    assert "--calibration-data is needed" in capsys.readouterr().err


def test_split_cuts_inside_a_qdq_model_take_its_scales(tmp_path):
    """Cuts inside the network: each edge part is int8 with the file's scales (a received tensor, now a
    placeholder of the edge part, takes those of the tensor it stands for); no calibration data at all."""
    from isthmus.cloud.offload_model import cloud_part
    from isthmus.converters.quantize_qdq import fp32_graph
    from isthmus.converters.split_export import export_split
    from isthmus.partitioner.costmodel import CostModel
    from isthmus.partitioner.devices import EDGE
    from isthmus.partitioner.plan import AdaptivePlanner
    from isthmus.partitioner.problem import Constraints
    from isthmus.wire.link import LinkModel
    path = qdq_file(tmp_path, "wide", True, "QUInt8")
    model = onnx.load(path)
    g0, ins, outs0 = from_onnx(model)
    g, outs, params = fp32_graph(ism.Session(g0), list(outs0))
    cm = CostModel.edge_cloud(LinkModel(1e6, 1e6, 1e-3), edge=EDGE.scaled(100))
    ap = AdaptivePlanner(g, cm, outs, Constraints(edge_memory_budget=None), bandwidths=np.logspace(5, 10, 21))
    sp = export_split(g, outs, ap, int8=True, qdq_params=params)
    inner = [c for c in sp.cuts if c.cloud_part and c.inputs != ["x:0"]]
    assert inner, [c.inputs for c in sp.cuts]
    acts, _, _ = _file_params(model)
    file_acts = {(float(np.float32(s)), z) for s, z in acts}
    from isthmus.edge.loader import verify_all
    from isthmus.edge.split_model import read_split
    sm = read_split(verify_all(sp.data))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    y_s = float(numpy_helper.to_array([i for i in model.graph.initializer if i.name == "y_scale"][0]))
    int8_cuts = 0
    for cut in [c for c in sm.cuts if c.cloud_part and c.inputs != ["x:0"]]:
        edge_acts = {(float(t.scale[0]), int(t.zero_point[0])) for t in cut.model.tensors
                     if t.dtype == np.int8 and t.data is None and len(t.scale)}
        assert edge_acts <= file_acts  # (a cut between a conv and its bias, where the file has no pair, runs fp32)
        int8_cuts += bool(edge_acts)
        name, cins, couts = next(s for s in sp.cloud_signatures() if s[0] == cut.cloud_part)
        part = cloud_part(sp.graph, cins, couts, name, check_batching=False)
        csess = ism.Session(part.graph)
        fetch = [part.graph.tensor(s.tensor) for s in part.outputs]
        feeds = [part.graph.tensor(s.tensor) for s in part.inputs]
        for x in samples((1, 3, 32, 32), 4, 40):
            remote = lambda r, arrays: csess.run(fetch, dict(zip(feeds, arrays)))  # noqa: E731
            got = Interpreter(cut.model, remote=remote).invoke(x)[0]
            # the cloud half runs the float model (no rounding to the file's grid after the cut): measured up to
            # 2.2 output steps from the QDQ model on these inputs (the cloud-only cut), 4 allowed
            diff = np.abs(np.asarray(got).reshape(-1) - ref.run(None, {"x": x})[0].reshape(-1)).max()
            assert diff <= 4 * y_s, (cut.name, diff / y_s)
    assert int8_cuts


def test_a_qat_export_quantizing_float_weights_in_the_graph_keeps_their_scales():
    """PyTorch/TF QAT exports keep float weights and put QuantizeLinear -> DequantizeLinear (per channel) on
    them: the edge file holds the integers that QuantizeLinear makes, under the pair's scales."""
    r = np.random.default_rng(5)
    w = r.normal(0, .3, (4, 2, 3, 3)).astype(np.float32)
    w_s = (np.abs(w).max(axis=(1, 2, 3)) / 127).astype(np.float32)
    inits = {"w": w, "w_s": w_s, "w_z": np.zeros(4, np.int8), "x_s": np.float32(0.03), "x_z": np.int8(0),
             "y_s": np.float32(0.05), "y_z": np.int8(-3)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
             helper.make_node("QuantizeLinear", ["w", "w_s", "w_z"], ["wq"], axis=0),
             helper.make_node("DequantizeLinear", ["wq", "w_s", "w_z"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "y_s", "y_z"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "y_s", "y_z"], ["y"])]
    model = _model(nodes, inits, [1, 2, 6, 6], [1, 4, 6, 6])
    g, ins, outs = from_onnx(model)
    data, rep = quantize_to_edge(ism.Session(g), list(outs), None)
    assert rep["requantized"] == [] and rep["fp32_ops"] == 0
    wt = [t for t in loads(data).tensors if t.dtype == np.int8 and t.data is not None]
    assert len(wt) == 1
    np.testing.assert_array_equal(wt[0].data, np.clip(np.rint(w / w_s.reshape(-1, 1, 1, 1)), -128, 127))
    np.testing.assert_array_equal(wt[0].scale, w_s)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for x in samples((1, 2, 6, 6), 4, 60):
        got = np.asarray(Interpreter(data).invoke(x)[0]).reshape(-1)
        d = np.abs(got - sess.run(None, {"x": x})[0].reshape(-1)) / 0.05
        assert d.max() <= 2 + 1e-3 and np.mean(d < 1e-3) >= 0.95
