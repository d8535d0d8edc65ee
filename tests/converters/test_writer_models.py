"""A whole model made of the ops the format writers gained (HardSwish, ConvTranspose2D, PRelu, Resize,
HardSigmoid, StridedSlice, ReduceMean; issues 21/26), exported fp32 and int8 (converters/quantize.py)
to .tflite and ONNX: LiteRT and onnxruntime compute what isthmus's edge interpreter computes (fp32
within 1e-5 relative; int8 end to end within the int8 model's own drift from fp32, or one output step
where that drift is smaller, since the per-op steps compound through the layers)."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.converters.edge_export import to_edge
from isthmus.converters.onnx_edge import edge_to_onnx
from isthmus.converters.quantize import quantize_to_edge
from isthmus.converters.tflite_write import edge_to_tflite
from isthmus.core.ops.image import resize
from isthmus.edge.interpreter import Interpreter
from isthmus.edge.loader import loads

from .test_writer_ops import output_step, run_litert, run_onnx

litert = pytest.importorskip("ai_edge_litert.interpreter")
tflite = pytest.importorskip("tflite")


def _tflite_filter_type(data: bytes, builtin: str) -> int:
    """The tensor type of the weights (input 1) of the first `builtin` op in a .tflite file."""
    m = tflite.Model.GetRootAs(data, 0)
    code = getattr(tflite.BuiltinOperator, builtin)
    g = m.Subgraphs(0)
    for k in range(g.OperatorsLength()):
        op = g.Operators(k)
        oc = m.OperatorCodes(op.OpcodeIndex())
        if max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode()) == code:
            return g.Tensors(op.Inputs(1)).Type()
    raise AssertionError(f"no {builtin} in the file")


def mobile_block(batch: int):
    """conv -> HardSwish -> ConvTranspose2D (x2) -> PRelu -> nearest Resize (/2) -> HardSigmoid -> a
    channel slice -> conv -> spatial mean -> dense: the logits."""
    rng = np.random.default_rng(26)

    def c(*shape, s=0.3):
        return ism.constant((rng.standard_normal(shape) * s).astype(np.float32))
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (batch, 3, 12, 12), name="x")
        h = ism.hard_swish(ism.conv2d(x, c(8, 3, 3, 3), padding="SAME"))
        h = ism.conv_transpose2d(h, c(8, 6, 2, 2), strides=2)
        h = ism.prelu(h, ism.constant((np.abs(rng.standard_normal((6, 1, 1))) * 0.2).astype(np.float32)))
        h = resize(h, scales=(1, 1, 0.5, 0.5), mode="nearest")
        h = ism.hard_sigmoid(h)
        h = h[:, 1:5]
        h = ism.relu(ism.conv2d(h, c(8, 4, 3, 3), padding="SAME"))
        y = ism.matmul(ism.reduce_mean(h, axis=(2, 3)), c(8, 5))
        sess = ism.Session(g)
    return sess, x, y


def feeds(batch: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, 3, 12, 12)).astype(np.float32) for _ in range(n)]


@pytest.mark.parametrize("batch", [1, 3])
def test_fp32_model_in_litert_and_onnxruntime(batch):
    sess, x, y = mobile_block(batch)
    edge = to_edge(sess, [y])
    ops = {op.op for op in loads(edge).operators}
    assert {"HardSwish", "ConvTranspose2D", "PRelu", "Resize", "HardSigmoid", "StridedSlice", "ReduceMean"} <= ops
    data, proto = edge_to_tflite(edge), edge_to_onnx(edge)
    for xv in feeds(batch, 2, seed=1):
        want = Interpreter(edge).invoke(xv)[0]
        tol = 1e-5 * max(1.0, float(np.abs(want).max()))
        assert np.abs(sess.run(y, {x: xv}) - want).max() <= tol
        for got in (run_litert(data, [xv])[0], run_onnx(proto, [xv])[0]):
            assert got.shape == want.shape and np.abs(got - want).max() <= tol


def test_int8_model_in_litert_and_onnxruntime_within_the_quantization_drift():
    sess, x, y = mobile_block(1)
    edge, _ = quantize_to_edge(sess, [y], [{x.node.name: v} for v in feeds(1, 8, seed=2)])
    m = loads(edge)
    int8_ops = {op.op for op in m.operators if any(m.tensors[i].dtype == np.int8 for i in op.outputs)}
    assert {"HardSwish", "ConvTranspose2D", "PRelu", "Resize", "HardSigmoid", "StridedSlice"} <= int8_ops, int8_ops
    # the transposed conv's weights are symmetric per output channel, as TFLite's int8 TRANSPOSE_CONV takes
    # them, so the written file runs it in int8 (asymmetric weights would run it in float)
    convt = next(op for op in m.operators if op.op == "ConvTranspose2D")
    wq = m.tensors[convt.inputs[1]]
    assert wq.dtype == np.int8 and len(wq.scale) == wq.shape[1] > 1 and not np.any(wq.zero_point)
    data, proto = edge_to_tflite(edge), edge_to_onnx(edge)
    assert _tflite_filter_type(data, "TRANSPOSE_CONV") == tflite.TensorType.INT8
    step = output_step(m, 0)
    assert step > 0
    for xv in feeds(1, 3, seed=3):
        want = Interpreter(edge).invoke(xv)[0]
        drift = max(float(np.abs(want - sess.run(y, {x: xv})).max()), step)   # (a step: one op's own tolerance)
        for runtime, got in (("litert", run_litert(data, [xv])[0]), ("onnxruntime", run_onnx(proto, [xv])[0])):
            assert got.shape == want.shape
            assert np.abs(got - want).max() <= drift, (runtime, float(np.abs(got - want).max()), drift)


def test_int8_embedding_lookup_with_run_time_indices():
    """converters/quantize.py's int8 Gather of a constant table by run-time int64 indices (negative ones
    included) then a dense layer: LiteRT and onnxruntime within one output step of the edge interpreter."""
    rng = np.random.default_rng(4)
    g = ism.Graph(seed=0)
    with g.as_default():
        ids = ism.placeholder("int64", (2, 5), name="ids")
        table = ism.constant(rng.standard_normal((11, 6)).astype(np.float32))
        h = ism.reshape(ism.gather(table, ids, axis=0), (2, 30))
        y = ism.matmul(h, ism.constant((rng.standard_normal((30, 4)) * 0.3).astype(np.float32)))
        sess = ism.Session(g)
    calib = [{"ids": rng.integers(-11, 11, (2, 5)).astype(np.int64)} for _ in range(6)]
    edge, _ = quantize_to_edge(sess, [y], calib)
    m = loads(edge)
    assert any(op.op == "Gather" and m.tensors[op.outputs[0]].dtype == np.int8 for op in m.operators)
    step = output_step(m, 0)
    for seed in (5, 6):
        xv = np.random.default_rng(seed).integers(-11, 11, (2, 5)).astype(np.int64)
        want = Interpreter(edge).invoke(xv)[0]
        for got in (run_litert(edge_to_tflite(edge), [xv])[0], run_onnx(edge_to_onnx(edge), [xv])[0]):
            assert got.shape == want.shape and np.abs(got - want).max() <= step * 1.0001
