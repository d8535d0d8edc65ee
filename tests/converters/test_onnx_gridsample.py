"""GridSample import (converters/onnx_gridsample.py), and AffineGrid feeding it: every mode and
padding against onnxruntime at an unknown batch (grids reaching well outside [-1, 1], so reflection folds several times), and its
gradients in the input and the grid against central differences.

Cubic with border or reflection padding is checked against onnx's reference evaluator instead: the
spec clamps (or reflects) an outside coordinate before taking the 4 taps; onnxruntime 1.32, like
PyTorch, only clamps each tap, and so differs from the spec for points outside the image."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import isthmus as ism
from isthmus.converters.onnx_import import from_onnx

rng = np.random.default_rng(11)


def _model(mode, padding, align, spatial, opset=20, dtype=TensorProto.FLOAT):
    d = len(spatial)
    x = helper.make_tensor_value_info("x", dtype, ["N", 3] + list(spatial))
    g = helper.make_tensor_value_info("g", dtype, ["N"] + [4] * (d - 1) + [5, d])
    y = helper.make_tensor_value_info("y", dtype, None)
    node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=int(align))
    m = helper.make_model(helper.make_graph([node], "m", [x, g], [y]), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


CASES = [(m, p, a, s) for m in ("nearest", "linear", "cubic") for p in ("zeros", "border", "reflection")
         for a in (False, True) for s in ((5, 6),)] + \
        [(m, p, a, (3, 4, 5)) for m in ("nearest", "linear") for p in ("zeros", "reflection") for a in (False, True)]


@pytest.mark.parametrize("mode,padding,align,spatial", CASES)
def test_grid_sample_matches_onnxruntime(mode, padding, align, spatial):
    m = _model(mode, padding, align, spatial)
    g, ins, outs = from_onnx(m)
    sess = ism.Session(g)
    if mode == "cubic" and padding != "zeros":
        from onnx.reference import ReferenceEvaluator
        ref = ReferenceEvaluator(m)
    else:
        ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    d = len(spatial)
    for n in (1, 3):
        x = rng.standard_normal((n, 3) + spatial).astype(np.float32)
        grid = (rng.uniform(-2.6, 2.6, (n,) + (4,) * (d - 1) + (5, d))).astype(np.float32)
        want = ref.run(None, {"x": x, "g": grid})[0]
        got = sess.run(outs[0], {ins["x"]: x, ins["g"]: grid})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_opset_16_names_bilinear_and_bicubic():
    m = _model("bicubic", "zeros", False, (5, 6), opset=16)
    g, ins, outs = from_onnx(m)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    grid = rng.uniform(-1.2, 1.2, (2, 4, 5, 2)).astype(np.float32)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x, "g": grid})
    np.testing.assert_allclose(ism.Session(g).run(outs[0], {ins["x"]: x, ins["g"]: grid}), want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_grid_sample_gradients_match_central_differences(mode):
    m = _model(mode, "reflection", False, (5, 6), dtype=TensorProto.DOUBLE)
    g, ins, outs = from_onnx(m)
    with g.as_default():
        loss = ism.reduce_sum(ism.square(outs[0]))
        dx, dg = ism.gradients(loss, [ins["x"], ins["g"]])
    sess = ism.Session(g)
    x = rng.standard_normal((1, 3, 5, 6))
    grid = rng.uniform(-0.9, 0.9, (1, 4, 5, 2))
    feeds = {ins["x"]: x, ins["g"]: grid}
    gx, gg = sess.run([dx, dg], feeds)
    for arr, grad, idx in ((x, gx, (0, 1, 2, 3)), (x, gx, (0, 2, 4, 0)), (grid, gg, (0, 1, 2, 0)), (grid, gg, (0, 3, 4, 1))):
        plus, minus = arr.copy(), arr.copy()
        plus[idx] += 1e-6
        minus[idx] -= 1e-6
        fp = sess.run(loss, {**feeds, (ins["x"] if arr is x else ins["g"]): plus})
        fm = sess.run(loss, {**feeds, (ins["x"] if arr is x else ins["g"]): minus})
        np.testing.assert_allclose(grad[idx], (fp - fm) / 2e-6, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("align", [False, True])
def test_affine_grid_then_grid_sample_a_spatial_transformer_like_onnxruntime(align):
    """AffineGrid (size known only at run time: the input's Shape) feeding GridSample, at batch 1 and 3."""
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Shape", ["x"], ["size"]),
             helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=int(align)),
             helper.make_node("GridSample", ["x", "grid"], ["y"], align_corners=int(align))]
    m = helper.make_model(helper.make_graph(nodes, "stn", [vi("x", TensorProto.FLOAT, ["N", 3, 5, 6]),
                                                           vi("theta", TensorProto.FLOAT, ["N", 2, 3])],
                                            [vi("y", TensorProto.FLOAT, None), vi("grid", TensorProto.FLOAT, None)]),
                          opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 10
    g, ins, outs = from_onnx(m)
    sess = ism.Session(g)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 3):
        x = rng.standard_normal((n, 3, 5, 6)).astype(np.float32)
        theta = (np.eye(2, 3) + rng.uniform(-0.3, 0.3, (n, 2, 3))).astype(np.float32)
        want = ref.run(None, {"x": x, "theta": theta})
        got = sess.run(outs, {ins["x"]: x, ins["theta"]: theta})
        for a, b in zip(got, want):
            assert a.shape == b.shape
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
