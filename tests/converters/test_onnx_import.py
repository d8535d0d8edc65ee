"""ONNX import: models written with onnx.helper run in isthmus with onnxruntime's numbers."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import isthmus as ism
from isthmus.converters.onnx_export import to_onnx
from isthmus.converters.onnx_import import OnnxImportError, from_onnx

rng = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _compare(model, feeds, rtol=1e-4, atol=1e-5, trainable=False):
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    g, ins, outs = from_onnx(model, trainable=trainable)
    g.verify()
    sess = ism.Session(g)
    sess.run(ism.global_variables_initializer(g))
    got = sess.run(outs, {ins[k]: v for k, v in feeds.items()})
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return g, ins, outs, sess


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def test_gemm_mlp_with_clip_and_softmax():
    inits = {"w1": rng.standard_normal((8, 16)).astype(np.float32), "b1": rng.standard_normal(16).astype(np.float32),
             "w2": rng.standard_normal((4, 16)).astype(np.float32), "b2": rng.standard_normal(4).astype(np.float32),
             "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
             helper.make_node("Clip", ["h", "lo", "hi"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["z"], transB=1, alpha=0.5),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    _compare(_model(nodes, [_vi("x", ["N", 8])], [_vi("y", ["N", 4])], inits),
             {"x": rng.standard_normal((3, 8)).astype(np.float32)})


def test_cnn_with_auto_pad_batchnorm_pooling():
    c = 4
    inits = {"w": rng.standard_normal((c, 3, 3, 3)).astype(np.float32), "b": rng.standard_normal(c).astype(np.float32),
             "s": rng.uniform(0.5, 1.5, c).astype(np.float32), "o": rng.standard_normal(c).astype(np.float32),
             "m": rng.standard_normal(c).astype(np.float32), "v": rng.uniform(0.5, 1.5, c).astype(np.float32),
             "dw": rng.standard_normal((c, 1, 3, 3)).astype(np.float32), "shape": np.array([0, -1], np.int64)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c1"], auto_pad="SAME_UPPER", strides=[2, 2]),
             helper.make_node("BatchNormalization", ["c1", "s", "o", "m", "v"], ["bn"], epsilon=1e-3),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("Conv", ["r", "dw"], ["c2"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c2"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]),
             helper.make_node("AveragePool", ["p"], ["a"], kernel_shape=[2, 2], strides=[1, 1], pads=[1, 1, 0, 0],
                              count_include_pad=0),
             helper.make_node("GlobalAveragePool", ["a"], ["gap"]),
             helper.make_node("Reshape", ["gap", "shape"], ["y"])]
    _compare(_model(nodes, [_vi("x", [2, 3, 15, 15])], [_vi("y", [2, c])], inits),
             {"x": rng.standard_normal((2, 3, 15, 15)).astype(np.float32)})


def test_shape_ops_slice_split_concat_reduce():
    inits = {"st": np.array([1, 0], np.int64), "en": np.array([4, 100], np.int64), "ax": np.array([1, 2], np.int64),
             "sp": np.array([2, 3], np.int64), "rax": np.array([1], np.int64), "ua": np.array([0], np.int64)}
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["s"]),
             helper.make_node("Split", ["x", "sp"], ["p0", "p1"], axis=2),
             helper.make_node("Transpose", ["p1"], ["t"], perm=[0, 2, 1]),
             helper.make_node("ReduceSum", ["t", "rax"], ["r"], keepdims=0),
             helper.make_node("ReduceMean", ["s"], ["m"], axes=[1], keepdims=0),
             helper.make_node("Concat", ["r", "m"], ["y0"], axis=1),
             helper.make_node("Unsqueeze", ["y0", "ua"], ["y"])]
    _compare(_model(nodes, [_vi("x", [2, 5, 5])], [_vi("y", None)], inits),
             {"x": rng.standard_normal((2, 5, 5)).astype(np.float32)})


def test_round_trip_through_export_and_fine_tuning():
    g = ism.Graph(seed=0)
    with g.as_default():
        x = ism.placeholder("float32", (None, 6), name="x")
        y = ism.nn.Sequential([ism.nn.Dense(8, activation="tanh"), ism.nn.Dense(3)])(x)
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    model = to_onnx(sess, [y])
    xv = rng.standard_normal((4, 6)).astype(np.float32)
    g2, ins, outs, sess2 = _compare(model, {"x": xv}, trainable=True)
    np.testing.assert_allclose(sess2.run(outs[0], {ins["x"]: xv}), sess.run(y, {x: xv}), rtol=1e-5)
    with g2.as_default():  # the imported weights are variables: fine-tune them
        labels = ism.placeholder("int32", (None,))
        loss = ism.nn.sparse_softmax_cross_entropy(labels, outs[0])
        step = ism.optimizers.SGD(0.5).minimize(loss)
        sess2.run(ism.variables_initializer([v for v in ism.global_variables(g2) if "SGD" in v.node.name]))
    lv = np.array([0, 1, 2, 0], np.int32)
    before = sess2.run(loss, {ins["x"]: xv, labels: lv})
    for _ in range(20):
        sess2.run(step, {ins["x"]: xv, labels: lv})
    assert sess2.run(loss, {ins["x"]: xv, labels: lv}) < before


def test_unsupported_ops_listed_with_counts():
    nodes = [helper.make_node("TfIdfVectorizer", ["x"], ["a"], name="hm1"),
             helper.make_node("TfIdfVectorizer", ["a"], ["b"], name="hm2"),
             helper.make_node("ImageDecoder", ["b"], ["y"], name="dec")]
    with pytest.raises(OnnxImportError, match=r"ImageDecoder x1 \(dec\); TfIdfVectorizer x2 \(hm1, hm2\)"):
        from_onnx(_model(nodes, [_vi("x", [2, 2])], [_vi("y", None)], {}))


def test_if_maps_to_cond_and_reads_outer_values():
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [], [_vi("t", [3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [_vi("e", [3])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["p"]),
             helper.make_node("If", ["p"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = _model(nodes, [_vi("x", [3])], [_vi("y", [3])],
               {"two": np.array(2, np.float32), "zero": np.array(0, np.float32)})
    for xv in (np.array([1, 2, 3], np.float32), np.array([-1, -2, 0.5], np.float32)):
        _compare(m, {"x": xv})


def test_loop_maps_to_while_loop():
    body = helper.make_graph(
        [helper.make_node("Mul", ["acc_in", "x"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("acc_in", [2])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_out", [2])])
    nodes = [helper.make_node("Loop", ["n", "go", "one"], ["y"], body=body)]
    m = _model(nodes, [_vi("x", [2]), _vi("n", [], TensorProto.INT64), _vi("go", [], TensorProto.BOOL)],
               [_vi("y", [2])], {"one": np.ones(2, np.float32)})
    _compare(m, {"x": np.array([2.0, 0.5], np.float32), "n": np.array(3, np.int64), "go": np.array(True)})


def test_wrap_each_version_puts_the_wrapper_in_front_of_each_since_and_falls_through():
    """The public hook onnx_ops_conv uses: the wrapper is picked at every opset, keeps the declared
    attributes of the version it shadows, and reaches exactly that version's handler."""
    from isthmus.converters import onnx_import as imp
    op = "IsthmusWrapProbe"
    try:
        imp.handler(op, 1, attrs=("a",))(lambda c, n, ins: ["v1"])
        imp.handler(op, 9, attrs=("a", "b"))(lambda c, n, ins: ["v9"])
        imp.wrap_each_version(op, lambda before: (lambda c, n, ins: ["w"] + list(before(c, n, ins))))
        assert imp._pick(op, 5)(None, None, []) == ["w", "v1"]
        assert imp._pick(op, 12)(None, None, []) == ["w", "v9"]
        assert imp.declared_attrs(op, 12) == frozenset({"a", "b"})
        assert len(imp._HANDLERS[op]) == 4
    finally:
        imp._HANDLERS.pop(op, None)
        for since in (1, 9):
            imp._ATTRS.pop((op, since), None)
    with pytest.raises(KeyError, match="NoSuchOnnxOp"):
        imp.wrap_each_version("NoSuchOnnxOp", lambda before: before)


def test_3d_pools_with_every_dim_unknown_at_import():
    """A 3-D pool whose channel and spatial dims are known only at run time (torch's opset-9 LRN pools
    a Reshape to a computed shape): the passes between reshape at run time; onnxruntime's numbers."""
    nodes = [helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[2, 3, 3], strides=[2, 2, 1], pads=[0, 1, 1, 1, 1, 0]),
             helper.make_node("AveragePool", ["x"], ["a"], kernel_shape=[5, 1, 1], pads=[2, 0, 0, 2, 0, 0])]
    m = _model(nodes, [_vi("x", ["N", "C", "D", "H", "W"])], [_vi("m", None), _vi("a", None)], {}, opset=9)
    for shape in ((1, 1, 6, 5, 4), (3, 2, 4, 5, 6)):
        _compare(m, {"x": rng.standard_normal(shape).astype(np.float32)})


def test_3d_pools_with_dynamic_batch_and_their_gradients():
    """3-D MaxPool/AveragePool (two separable 2-D passes) with an unknown batch: onnxruntime's numbers
    at batch 1 and 3, and gradients through both matching central differences (float64)."""
    nodes = [helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[2, 3, 3], strides=[2, 2, 1], pads=[0, 1, 1, 1, 1, 0]),
             helper.make_node("AveragePool", ["x"], ["a"], kernel_shape=[3, 2, 2], strides=[1, 2, 2], ceil_mode=1)]
    m = _model(nodes, [_vi("x", ["N", 2, 4, 5, 6])], [_vi("m", None), _vi("a", None)], {})
    for batch in (1, 3):
        _compare(m, {"x": rng.standard_normal((batch, 2, 4, 5, 6)).astype(np.float32)})
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.DOUBLE
    g, ins, outs = from_onnx(m)
    x0 = rng.permutation(2 * 4 * 5 * 6).reshape(1, 2, 4, 5, 6).astype(np.float64) / 10  # distinct: no max ties
    with g.as_default():
        loss = ism.add(ism.reduce_sum(ism.square(outs[0])), ism.reduce_sum(ism.square(outs[1])))
        (dx,) = ism.gradients(loss, [ins["x"]])
    sess = ism.Session(g)
    got = sess.run(dx, {ins["x"]: x0})
    for idx in [(0, 0, 0, 0, 0), (0, 1, 3, 4, 5), (0, 1, 2, 2, 3), (0, 0, 1, 3, 1)]:
        xp, xm = x0.copy(), x0.copy()
        xp[idx] += 1e-4
        xm[idx] -= 1e-4
        num = (sess.run(loss, {ins["x"]: xp}) - sess.run(loss, {ins["x"]: xm})) / 2e-4
        np.testing.assert_allclose(got[idx], num, rtol=1e-5, atol=1e-7)
