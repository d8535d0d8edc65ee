"""ONNX import at old and new opsets: the attribute forms of opsets 7-12 (Squeeze/Unsqueeze/Split/
ReduceX axes, Clip min/max, Pad pads, Slice bounds, Upsample scales, Dropout ratio, BatchNormalization
spatial) and the input forms of later ones, each checked against onnxruntime on the same model."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import isthmus as ism
from isthmus.converters.onnx_import import from_onnx

rng = np.random.default_rng(7)
F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits, opset):
    g = helper.make_graph(nodes, "m", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def _x(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _n(op, ins, outs, **kw):
    return helper.make_node(op, ins, outs, **kw)


def _case(opset, nodes, feeds, outs, inits=None, out_types=None):
    ins = [_vi(k, list(v.shape), helper.np_dtype_to_tensor_dtype(v.dtype)) for k, v in feeds.items()]
    out_vis = [_vi(o, None, (out_types or {}).get(o, F)) for o in outs]
    return opset, nodes, feeds, out_vis, inits or {}


X34 = _x(3, 1, 4)
X2345 = _x(2, 3, 4, 5)
CASES = {
    "squeeze_unsqueeze_attr_9": _case(9, [_n("Squeeze", ["x"], ["s"], axes=[1]), _n("Unsqueeze", ["s"], ["y"], axes=[0, 3])],
                                      {"x": X34}, ["y"]),
    "squeeze_negative_axes_11": _case(11, [_n("Squeeze", ["x"], ["y"], axes=[-2])], {"x": X34}, ["y"]),
    "unsqueeze_input_13": _case(13, [_n("Unsqueeze", ["x", "a"], ["y"])], {"x": X34}, ["y"],
                                {"a": np.array([-1, 0], np.int64)}),
    "split_attr_11": _case(11, [_n("Split", ["x"], ["a", "b"], axis=1, split=[1, 2])], {"x": X2345}, ["a", "b"]),
    "split_equal_9": _case(9, [_n("Split", ["x"], ["a", "b"], axis=3)], {"x": _x(2, 3, 4, 6)}, ["a", "b"]),
    "split_input_13": _case(13, [_n("Split", ["x", "s"], ["a", "b"], axis=2)], {"x": X2345}, ["a", "b"],
                            {"s": np.array([3, 1], np.int64)}),
    "split_num_outputs_18": _case(18, [_n("Split", ["x"], ["a", "b"], axis=3, num_outputs=2)], {"x": X2345}, ["a", "b"]),
    "reduce_attr_axes_12": _case(12, [_n("ReduceMean", ["x"], ["m"], axes=[1, -1], keepdims=0),
                                      _n("ReduceSum", ["x"], ["s"], axes=[2]),
                                      _n("ReduceMax", ["x"], ["mx"], axes=[0], keepdims=0),
                                      _n("ReduceSumSquare", ["x"], ["q"], axes=[3])], {"x": X2345}, ["m", "s", "mx", "q"]),
    "reduce_input_axes_18": _case(18, [_n("ReduceMean", ["x", "a"], ["m"], keepdims=0),
                                       _n("ReduceMin", ["x", "a"], ["n"])], {"x": X2345}, ["m", "n"],
                                  {"a": np.array([1, 3], np.int64)}),
    "clip_attrs_9": _case(9, [_n("Clip", ["x"], ["r6"], min=0.0, max=6.0), _n("Clip", ["x"], ["lo"], min=-0.5),
                              _n("Clip", ["x"], ["hi"], max=0.25)], {"x": X2345 * 4}, ["r6", "lo", "hi"]),
    "clip_inputs_12": _case(12, [_n("Clip", ["x", "", "h"], ["y"])], {"x": X2345}, ["y"], {"h": np.array(0.3, np.float32)}),
    "pad_attrs_10": _case(10, [_n("Pad", ["x"], ["c"], pads=[0, 0, 1, 2, 0, 0, 2, 1], value=1.5),
                               _n("Pad", ["x"], ["r"], pads=[0, 0, 1, 2, 0, 0, 2, 1], mode="reflect"),
                               _n("Pad", ["x"], ["e"], pads=[0, 1, 0, 0, 0, 0, 0, 3], mode="edge")],
                          {"x": X2345}, ["c", "r", "e"]),
    "pad_inputs_negative_13": _case(13, [_n("Pad", ["x", "p", "v"], ["y"])], {"x": X2345}, ["y"],
                                    {"p": np.array([0, 0, -1, 2, 0, 1, 1, -2], np.int64), "v": np.array(-2, np.float32)}),
    "pad_axes_18": _case(18, [_n("Pad", ["x", "p", "", "a"], ["y"], mode="edge")], {"x": X2345}, ["y"],
                         {"p": np.array([1, 2, 3, 0], np.int64), "a": np.array([-1, 2], np.int64)}),
    "pad_wrap_19": _case(19, [_n("Pad", ["x", "p"], ["y"], mode="wrap")], {"x": X2345}, ["y"],
                         {"p": np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64)}),
    "slice_attrs_9": _case(9, [_n("Slice", ["x"], ["y"], starts=[1, -3], ends=[100, -1], axes=[1, 3])],
                           {"x": X2345}, ["y"]),
    "slice_steps_13": _case(13, [_n("Slice", ["x", "s", "e", "a", "t"], ["y"])], {"x": X2345}, ["y"],
                            {"s": np.array([-1, 0], np.int64), "e": np.array([-100, 5], np.int64),
                             "a": np.array([2, 3], np.int64), "t": np.array([-2, 2], np.int64)}),
    "upsample_attr_7": _case(7, [_n("Upsample", ["x"], ["y"], scales=[1.0, 1.0, 2.0, 3.0])], {"x": X2345}, ["y"]),
    "upsample_linear_7": _case(7, [_n("Upsample", ["x"], ["y"], scales=[1.0, 1.0, 2.0, 2.0], mode="linear")],
                               {"x": X2345}, ["y"]),
    "upsample_input_9": _case(9, [_n("Upsample", ["x", "s"], ["y"])], {"x": X2345}, ["y"],
                              {"s": np.array([1, 1, 2, 2], np.float32)}),
    "resize_10": _case(10, [_n("Resize", ["x", "s"], ["y"], mode="linear")], {"x": X2345}, ["y"],
                       {"s": np.array([1, 1, 2, 1.5], np.float32)}),
    "dropout_inputs_13": _case(13, [_n("Dropout", ["x", "r", "t"], ["y"])], {"x": X34}, ["y"],
                               {"r": np.array(0.4, np.float32), "t": np.array(False)}),
    "batchnorm_spatial_7": _case(7, [_n("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], spatial=1, epsilon=1e-3)],
                                 {"x": X2345}, ["y"], {"s": _x(3), "b": _x(3), "m": _x(3),
                                                       "v": np.abs(_x(3)) + 0.5}),
    "softmax_coerced_11": _case(11, [_n("Softmax", ["x"], ["y"], axis=1), _n("LogSoftmax", ["x"], ["z"])],
                                {"x": X2345}, ["y", "z"]),
    "argmax_last_index_12": _case(12, [_n("ArgMax", ["x"], ["y"], axis=1, select_last_index=1),
                                       _n("ArgMin", ["x"], ["z"], axis=-1, keepdims=0, select_last_index=1)],
                                  {"x": np.round(X2345)}, ["y", "z"],
                                  out_types={"y": TensorProto.INT64, "z": TensorProto.INT64}),
    "constant_forms_13": _case(13, [_n("Constant", [], ["c"], value_floats=[1.0, 2.0, 3.0, 4.0]),
                                    _n("Constant", [], ["k"], value_float=0.5),
                                    _n("Mul", ["x", "c"], ["a"]), _n("Add", ["a", "k"], ["y"])], {"x": X34}, ["y"]),
    "pools_3d_22": _case(22, [_n("MaxPool", ["x"], ["m"], kernel_shape=[2, 3, 2], strides=[1, 2, 2], pads=[1, 0, 1, 0, 1, 1],
                                 dilations=[2, 1, 1]),
                              _n("AveragePool", ["x"], ["a"], kernel_shape=[3, 2, 2], strides=[2, 2, 1], ceil_mode=1,
                                 pads=[1, 1, 0, 1, 0, 1], count_include_pad=1),
                              _n("AveragePool", ["x"], ["e"], kernel_shape=[2, 2, 3], strides=[2, 1, 2], ceil_mode=1,
                                 pads=[0, 1, 1, 0, 1, 1])], {"x": _x(2, 3, 5, 6, 7)}, ["m", "a", "e"]),
    "avgpool_2d_ceil_include_pad_19": _case(19, [_n("AveragePool", ["x"], ["a"], kernel_shape=[3, 3], strides=[2, 2],
                                                    pads=[1, 1, 1, 1], ceil_mode=1, count_include_pad=1)],
                                           {"x": _x(1, 2, 6, 6)}, ["a"]),
    "resize_antialias_18": _case(18, [_n("Resize", ["x", "", "s"], ["l"], mode="linear", antialias=1),
                                      _n("Resize", ["x", "", "s"], ["c"], mode="cubic", antialias=1,
                                         coordinate_transformation_mode="pytorch_half_pixel"),
                                      _n("Resize", ["x", "", "", "z"], ["e"], mode="cubic", antialias=1,
                                         exclude_outside=1)],
                                 {"x": _x(1, 2, 12, 17)}, ["l", "c", "e"],
                                 {"s": np.array([1, 1, 0.5, 0.3], np.float32), "z": np.array([1, 2, 5, 7], np.int64)}),
    "matmul_1d_13": _case(13, [_n("MatMul", ["v", "x"], ["a"]), _n("MatMul", ["x", "w"], ["b"])],
                          {"v": _x(3), "x": _x(2, 3, 4), "w": _x(4)}, ["a", "b"]),
    "layernorm_stats_17": _case(17, [_n("LayerNormalization", ["x", "g", "b"], ["y", "m", "r"], axis=2)],
                                {"x": X2345}, ["y", "m", "r"], {"g": _x(4, 5), "b": _x(4, 5)}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_opset_forms_match_onnxruntime(name):
    opset, nodes, feeds, outs, inits = CASES[name]
    model = _model(nodes, [_vi(k, list(v.shape), helper.np_dtype_to_tensor_dtype(v.dtype)) for k, v in feeds.items()],
                   outs, inits, opset)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    g, ins, got_t = from_onnx(model)
    g.verify()
    got = ism.Session(g).run(got_t, {ins[k]: v for k, v in feeds.items()})
    for o, a, b in zip(outs, got, want):
        assert np.asarray(a).shape == b.shape, (o.name, np.asarray(a).shape, b.shape)
        assert np.asarray(a).dtype == b.dtype, (o.name, np.asarray(a).dtype, b.dtype)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5, err_msg=o.name)


@pytest.mark.parametrize("opset", [7, 10, 12])
def test_dropout_at_inference_is_the_identity_with_a_mask_of_ones(opset):
    """The spec and the onnx reference evaluator keep every element (mask all ones; bool from opset 10,
    the input's type before). onnxruntime returns an all-false mask here, so it is not the reference."""
    x = X34
    m = _model([_n("Dropout", ["x"], ["y", "m"], ratio=0.3)], [_vi("x", list(x.shape))],
               [_vi("y", None), _vi("m", None, TensorProto.BOOL if opset >= 10 else F)], {}, opset)
    g, ins, outs = from_onnx(m)
    y, mask = ism.Session(g).run(outs, {ins["x"]: x})
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == (np.bool_ if opset >= 10 else np.float32) and mask.shape == x.shape and np.all(mask)


def test_every_handled_op_declares_the_spec_attributes_at_every_opset():
    """For each op with a handler and each opset 7-28 where ONNX defines it: a handler is chosen, and
    every attribute the spec defines is one the handler honours or refuses by value (none ignored)."""
    import onnx.defs
    from isthmus.converters.onnx_import import _HANDLERS, _entry
    gaps = []
    for op in sorted(_HANDLERS):
        for v in range(7, 29):
            try:
                schema = onnx.defs.get_schema(op, v)
            except Exception:  # noqa: BLE001  (the op does not exist at this opset)
                continue
            if schema.deprecated:
                continue
            e = _entry(op, v)
            if e is None:
                gaps.append(f"{op}@{v}: no handler")
            elif e[2] is not None and set(schema.attributes) - e[2]:
                gaps.append(f"{op}@{v}: {sorted(set(schema.attributes) - e[2])} not declared")
    assert not gaps, gaps
