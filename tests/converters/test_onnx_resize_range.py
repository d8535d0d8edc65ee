"""ONNX Resize (constant and computed scales/sizes) and Range import, against onnxruntime."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import isthmus as ism
from isthmus.converters import from_onnx


def _run_both(nodes, inputs, outputs, inits, feeds, opset=19):
    m = helper.make_model(helper.make_graph(nodes, "t", inputs, outputs, inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    g, ins, outs = from_onnx(m)
    got = ism.Session(g).run(outs, {ins[k]: v for k, v in feeds.items()})
    return got, want, outs


RESIZE = [  # attrs, scales or None, sizes or None
    (dict(mode="linear"), [1, 1, 2.0, 1.5], None),
    (dict(mode="linear", coordinate_transformation_mode="align_corners"), None, [1, 3, 7, 3]),
    (dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"), [1, 1, 0.5, 0.75], None),
    (dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"), [1, 1, 3.0, 2.0], None),
    (dict(mode="nearest", nearest_mode="round_prefer_ceil"), None, [1, 3, 5, 9]),
    (dict(mode="nearest", axes=[3, 2]), [1.5, 2.5], None),
    (dict(mode="linear", axes=[2, 3], keep_aspect_ratio_policy="not_larger"), None, [9, 9]),
    (dict(mode="cubic"), [1, 1, 1.5, 0.5], None),
    (dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1, coordinate_transformation_mode="align_corners"),
     None, [1, 3, 7, 4]),
]


@pytest.mark.parametrize("attrs,scales,sizes", RESIZE, ids=[str(i) for i in range(len(RESIZE))])
def test_resize_constant_params(attrs, scales, sizes):
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 6)).astype(np.float32)
    inits, names = [], ["X", ""]
    if scales is not None:
        inits.append(numpy_helper.from_array(np.array(scales, np.float32), "scales"))
        names.append("scales")
    else:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        names += ["", "sizes"]
    got, want, outs = _run_both([helper.make_node("Resize", names, ["Y"], **attrs)],
                                [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 4, 6])],
                                [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits, {"X": x})
    assert outs[0].shape == want[0].shape  # constant parameters: the output shape is known at import
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_resize_to_the_shape_of_another_tensor():
    """Sizes computed in the graph (Shape of a second input), as exported segmentation nets do."""
    rng = np.random.default_rng(1)
    x, ref = rng.standard_normal((2, 3, 4, 5)).astype(np.float32), rng.standard_normal((2, 3, 9, 7)).astype(np.float32)
    nodes = [helper.make_node("Shape", ["R"], ["s"]), helper.make_node("Resize", ["X", "", "", "s"], ["Y"], mode="linear")]
    got, want, _ = _run_both(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3, "H", "W"]),
                                     helper.make_tensor_value_info("R", TensorProto.FLOAT, ["N", 3, "H2", "W2"])],
                             [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], [], {"X": x, "R": ref})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_range_constant_and_computed():
    nodes = [helper.make_node("Range", ["a", "b", "c"], ["r1"]),
             helper.make_node("Shape", ["X"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["r2"])]
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
             (("a", 3), ("b", -8), ("c", -2), ("zero", 0), ("one", 1))]
    x = np.zeros((2, 5), np.float32)
    got, want, outs = _run_both(nodes, [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", "M"])],
                                [helper.make_tensor_value_info(o, TensorProto.INT64, None) for o in ("r1", "r2")],
                                inits, {"X": x})
    assert outs[0].node.op == "Const" and outs[1].shape == (None,)
    for gv, wv in zip(got, want):
        np.testing.assert_array_equal(gv, wv)


def test_tf_crop_and_resize_is_refused_naming_the_node():
    node = helper.make_node("Resize", ["X", "roi", "scales"], ["Y"], mode="linear", name="up3",
                            coordinate_transformation_mode="tf_crop_and_resize")
    m = helper.make_model(helper.make_graph(
        [node], "t", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 2, 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
         numpy_helper.from_array(np.array([0, 0, 0, 0, 1, 1, 1, 1], np.float32), "roi")]),
        opset_imports=[helper.make_opsetid("", 19)])
    with pytest.raises(ism.GraphError, match="up3.*tf_crop_and_resize"):
        from_onnx(m)


def test_resize_and_range_export_to_onnxruntime():
    from isthmus.converters import to_onnx
    from isthmus.core.ops.arange import arange
    from isthmus.core.ops.image import resize
    rng = np.random.default_rng(2)
    g = ism.Graph()
    with g.as_default():
        x = ism.placeholder(np.float32, (2, 3, 5, 4), name="x")
        n = ism.placeholder(np.int64, (), name="n")
        sz = ism.placeholder(np.int64, (4,), name="sz")
        a = resize(x, scales=(1, 1, 1.6, 2.0), mode="linear", coordinate_mode="align_corners")
        b = resize(x, sizes=(0, 0, 9, 3), mode="cubic", coordinate_mode="asymmetric", exclude_outside=True)
        r = arange(ism.constant(np.int64(1)), n, ism.constant(np.int64(2)))
        d = resize(x, param=sz, param_kind="sizes", mode="linear")
    feeds = {"x": rng.standard_normal((2, 3, 5, 4)).astype(np.float32), "n": np.array(10, np.int64),
             "sz": np.array([2, 3, 7, 7], np.int64)}
    got = ism.Session(g).run([a, b, r, d], {x: feeds["x"], n: feeds["n"], sz: feeds["sz"]})
    m = to_onnx(g, [a, b, r, d])
    onnx.checker.check_model(m)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for gv, wv in zip(got, want):
        np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-6)


def test_matmul_of_a_stack_by_a_matrix_with_symbolic_dims():
    """[B, T, K] x [K, N] is imported as one 2-D GEMM and reshaped back, also for symbolic B, T."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((6, 5)).astype(np.float32)
    x = rng.standard_normal((3, 4, 6)).astype(np.float32)
    got, want, outs = _run_both([helper.make_node("MatMul", ["x", "w"], ["y"])],
                                [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", 6])],
                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                                [numpy_helper.from_array(w, "w")], {"x": x})
    assert outs[0].shape == (None, None, 5)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_tf_crop_and_resize_with_run_time_roi_and_sizes_matches_onnxruntime():
    """Linear tf_crop_and_resize over H and W, roi and sizes fed at run time (boxes reaching outside the
    image take extrapolation_value), at batch 1 and 3, vs onnxruntime."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    vi = helper.make_tensor_value_info
    node = helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="linear", axes=[2, 3],
                            coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-7.0)
    m = helper.make_model(helper.make_graph([node], "m", [vi("x", TensorProto.FLOAT, ["N", 2, 6, 5]),
                                                         vi("roi", TensorProto.FLOAT, [4]),
                                                         vi("sizes", TensorProto.INT64, [2])],
                                            [vi("y", TensorProto.FLOAT, None)]),
                          opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    g, ins, outs = from_onnx(m)
    sess = ism.Session(g)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    r = np.random.default_rng(8)
    for n, roi, sizes in ((1, [0.1, 0.2, 0.7, 0.9], [4, 3]), (3, [-0.2, 0.3, 0.6, 1.3], [5, 1]), (2, [0.4, 0.0, 0.4, 1.0], [1, 6])):
        feeds = {"x": r.standard_normal((n, 2, 6, 5)).astype(np.float32), "roi": np.array(roi, np.float32),
                 "sizes": np.array(sizes, np.int64)}
        want = ref.run(None, feeds)[0]
        got = sess.run(outs[0], {ins[k]: v for k, v in feeds.items()})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
