"""Single-op edge models of the ops the format writers gained for issues 21/26 (data movement, Resize,
reductions, activations, ConvTranspose2D, recurrent sequences), fp32 and int8, batch 1 and 3, odd
shapes and negative axes, and the runners that put one through LiteRT and onnxruntime."""
import numpy as np

from .edge_op_cases import Arg, Out, q

R = np.random.default_rng(21)


def f(*shape):
    return R.standard_normal(shape).astype(np.float32)


def i8(*shape):
    return R.integers(-128, 128, shape).astype(np.int8)


def spec(*entries):
    """StridedSlice edge attributes from (kind, begin, end, step) entries, None where not given."""
    kinds = {"index": 0, "slice": 1, "new": 2}
    out = {"kinds": [], "begin": [], "end": [], "step": [], "given": []}
    for kind, *vals in entries:
        vals = (vals + [None, None, None])[:3]
        out["kinds"].append(kinds[kind])
        for key, v in zip(("begin", "end", "step"), vals):
            out[key].append(0 if v is None else v)
        out["given"].append(sum(bit for bit, v in zip((1, 2, 4), vals) if v is not None))
    return out


def resize(mode, coord="half_pixel", rule="round_prefer_floor", scales=(), sizes=()):
    return {"mode": mode, "coordinate_mode": coord, "nearest_mode": rule, "scales": list(scales),
            "sizes": list(sizes)}


F = Out("float32")
IDX = np.array([4, -1, 0], np.int64)
CASES = {  # name: (op, args, out, out shape, attrs)
    "gather_neg_axis": ("Gather", [Arg(f(3, 5, 7)), Arg(IDX, const=True)], F, (3, 3, 7), {"axis": -2}),
    "gather_run_time_indices": ("Gather", [Arg(f(2, 6)), Arg(np.array([[0, -2], [5, 1]], np.int32))], F,
                                (2, 2, 2), {"axis": 1}),
    "gather_4d_batch3": ("Gather", [Arg(f(3, 4, 5, 5)), Arg(np.array([2, 0], np.int32), const=True)], F,
                         (3, 2, 5, 5), {"axis": 1}),
    "gather_int8": ("Gather", [q(i8(3, 5, 4), 0.1, 3), Arg(IDX, const=True)], Out("int8", [0.1], [3]), (3, 3, 4),
                    {"axis": 1}),
    "gather_int8_requant": ("Gather", [q(i8(1, 6), 0.1, 3), Arg(IDX, const=True)], Out("int8", [0.07], [-2]),
                            (1, 3), {"axis": -1}),
    "slice_index_and_reverse": ("StridedSlice", [Arg(f(3, 7, 9))], F, (1, 5),
                                spec(("slice", 1, None, 2), ("index", -1), ("slice", None, None, -2))),
    "slice_new_axis": ("StridedSlice", [Arg(f(1, 4, 6, 6))], F, (1, 1, 4, 4, 6),
                       spec(("slice",), ("new",), ("slice",), ("slice", 1, -1))),
    "slice_nhwc_batch3": ("StridedSlice", [Arg(f(3, 8, 5, 5))], F, (3, 3, 5, 4),
                          spec(("slice",), ("slice", 2, 7, 2), ("slice",), ("slice", None, -1))),
    "slice_reverse_to_start": ("StridedSlice", [Arg(f(2, 9))], F, (2, 4), spec(("slice",), ("slice", 6, None, -2))),
    "slice_int8_requant": ("StridedSlice", [q(i8(2, 6, 5, 5), 0.05, 3)], Out("int8", [0.04], [1]), (2, 3, 5, 5),
                           spec(("slice",), ("slice", -3))),
    "squeeze_neg_axis": ("Squeeze", [Arg(f(3, 1, 5, 1))], F, (3, 1, 5), {"axes": [-1]}),
    "squeeze_all": ("Squeeze", [Arg(f(1, 4, 1, 1))], F, (4,), {"axes": []}),
    "squeeze_int8": ("Squeeze", [q(i8(3, 1, 5), 0.05, 3)], Out("int8", [0.05], [3]), (3, 5), {"axes": [1]}),
    "expand_two_axes": ("ExpandAxes", [Arg(f(3, 5))], F, (1, 3, 5, 1), {"axes": [0, -1]}),
    "expand_one_axis": ("ExpandAxes", [Arg(f(3, 5))], F, (3, 1, 5), {"axes": [1]}),
    "expand_int8_requant": ("ExpandAxes", [q(i8(2, 7), 0.05, 3)], Out("int8", [0.06], [0]), (2, 7, 1),
                            {"axes": [-1]}),
    "reduce_mean_neg_axes": ("ReduceMean", [Arg(f(3, 4, 5, 6))], F, (3, 5), {"axes": [-1, 1], "keepdims": 0}),
    "reduce_sum_spatial_keep": ("ReduceSum", [Arg(f(3, 4, 5, 6))], F, (3, 4, 1, 1), {"axes": [2, 3], "keepdims": 1}),
    "reduce_max_all": ("ReduceMax", [Arg(f(2, 3, 5))], F, (), {"axes": [], "keepdims": 0}),
    "reduce_max_batch_axis": ("ReduceMax", [Arg(f(3, 4, 5, 6))], F, (4, 5, 6), {"axes": [0], "keepdims": 0}),
    "reduce_mean_channels_4d": ("ReduceMean", [Arg(f(1, 7, 3, 5))], F, (1, 3, 5), {"axes": [1], "keepdims": 0}),
    # Resize: TFLite's builtins where their pixels are the edge's, the gather composite elsewhere
    "resize_nearest_x2": ("Resize", [Arg(f(1, 3, 5, 7))], F, (1, 3, 10, 14), resize("nearest", scales=(1, 1, 2, 2))),
    "resize_nearest_asymmetric_floor": ("Resize", [Arg(f(3, 2, 7, 5))], F, (3, 2, 4, 8),
                                        resize("nearest", "asymmetric", "floor", sizes=(3, 2, 4, 8))),
    "resize_nearest_prefer_floor_odd": ("Resize", [Arg(f(1, 2, 5, 3))], F, (1, 2, 7, 8),
                                        resize("nearest", sizes=(1, 2, 7, 8))),
    "resize_nearest_tf_nn": ("Resize", [Arg(f(1, 2, 4, 6))], F, (1, 2, 7, 9),
                             resize("nearest", "tf_half_pixel_for_nn", "floor", sizes=(1, 2, 7, 9))),
    "resize_linear_half_pixel": ("Resize", [Arg(f(1, 3, 4, 6))], F, (1, 3, 9, 11),
                                 resize("linear", sizes=(1, 3, 9, 11))),
    "resize_linear_align_batch3": ("Resize", [Arg(f(3, 2, 5, 5))], F, (3, 2, 8, 3),
                                   resize("linear", "align_corners", sizes=(3, 2, 8, 3))),
    "resize_linear_asymmetric": ("Resize", [Arg(f(1, 2, 4, 5))], F, (1, 2, 10, 12),
                                 resize("linear", "asymmetric", scales=(1, 1, 2.5, 2.5))),
    "resize_linear_symmetric": ("Resize", [Arg(f(1, 2, 4, 5))], F, (1, 2, 6, 7),
                                resize("linear", "half_pixel_symmetric", sizes=(1, 2, 6, 7))),
    "resize_linear_rank3": ("Resize", [Arg(f(2, 3, 5))], F, (2, 3, 9),
                            resize("linear", "pytorch_half_pixel", sizes=(2, 3, 9))),
    "resize_nearest_int8_requant": ("Resize", [q(i8(1, 3, 4, 5), 0.05, 3)], Out("int8", [0.04], [0]), (1, 3, 8, 10),
                                    resize("nearest", scales=(1, 1, 2, 2))),
    "resize_linear_int8": ("Resize", [q(i8(3, 2, 4, 5), 0.05, 3)], Out("int8", [0.05], [3]), (3, 2, 8, 10),
                           resize("linear", sizes=(3, 2, 8, 10))),
    "resize_linear_int8_symmetric": ("Resize", [q(i8(1, 2, 4, 5), 0.05, 3)], Out("int8", [0.05], [3]), (1, 2, 6, 7),
                                     resize("linear", "half_pixel_symmetric", sizes=(1, 2, 6, 7))),
}

SLOPE = (np.abs(f(4, 1, 1)) * 0.3).astype(np.float32)
CASES.update({
    "prelu_channel_slope_4d": ("PRelu", [Arg(f(1, 4, 5, 5)), Arg(SLOPE, const=True)], F, (1, 4, 5, 5), {}),
    "prelu_scalar_slope_batch3": ("PRelu", [Arg(f(3, 7)), Arg(np.asarray(0.25, np.float32), const=True)], F,
                                  (3, 7), {}),
    "prelu_run_time_slope": ("PRelu", [Arg(f(3, 6)), Arg(f(6))], F, (3, 6), {}),
    "prelu_int8_channel_slope": ("PRelu", [q(i8(1, 4, 5, 5), 0.05, -4), Arg(SLOPE, const=True)],
                                 Out("int8", [0.04], [10]), (1, 4, 5, 5), {}),
    "prelu_int8_int8_slope": ("PRelu", [q(i8(3, 4, 3, 3), 0.05, -4), q(np.array([[[20]], [[-7]], [[64]], [[3]]],
                                                                              np.int8), 0.01, 0, const=True)],
                              Out("int8", [0.04], [10]), (3, 4, 3, 3), {}),
    "prelu_int8_scalar_slope": ("PRelu", [q(i8(2, 9), 0.05, 3), Arg(np.asarray([0.1], np.float32), const=True)],
                                Out("int8", [0.03], [-60]), (2, 9), {}),
    "hard_swish_4d_batch3": ("HardSwish", [Arg(f(3, 4, 5, 5) * 4)], F, (3, 4, 5, 5), {}),
    "hard_swish_int8": ("HardSwish", [q(i8(1, 3, 4, 4), 0.05, 3)], Out("int8", [0.03], [-100]), (1, 3, 4, 4), {}),
    "hard_sigmoid": ("HardSigmoid", [Arg(f(2, 9) * 4)], F, (2, 9), {"alpha": 0.2, "beta": 0.5}),
    "hard_sigmoid_4d_alpha": ("HardSigmoid", [Arg(f(1, 3, 4, 4) * 4)], F, (1, 3, 4, 4), {"alpha": 1 / 6, "beta": 0.5}),
    "hard_sigmoid_int8": ("HardSigmoid", [q(i8(3, 3, 4, 4), 0.05, 3)], Out("int8", [1 / 255], [-128]), (3, 3, 4, 4),
                          {"alpha": 0.2, "beta": 0.5}),
    "gelu_exact": ("Gelu", [Arg(f(3, 17) * 3)], F, (3, 17), {"approximate": "none"}),
    "gelu_tanh_4d": ("Gelu", [Arg(f(1, 3, 4, 4) * 3)], F, (1, 3, 4, 4), {"approximate": "tanh"}),
    "erf": ("Erf", [Arg(np.concatenate([f(4, 33) * 2, np.zeros((4, 1), np.float32)], axis=1))], F, (4, 34), {}),
})


def convt(groups=1, strides=(2, 2), dilations=(1, 1), pads=(0, 0, 0, 0), output_padding=(0, 0)):
    return {"strides": list(strides), "dilations": list(dilations), "pads": list(pads), "groups": groups,
            "output_padding": list(output_padding)}


SW = [0.02, 0.05, 0.03]
CASES.update({
    "convt_stride2": ("ConvTranspose2D", [Arg(f(1, 3, 4, 5)), Arg(f(3, 2, 3, 3), const=True)], F, (1, 2, 9, 11),
                      convt()),
    "convt_pads_output_padding_batch3": ("ConvTranspose2D", [Arg(f(3, 2, 3, 4)), Arg(f(2, 4, 3, 2), const=True)], F,
                                         (3, 4, 6, 8), convt(pads=(1, 1, 0, 1), output_padding=(1, 1))),
    "convt_dilated_groups": ("ConvTranspose2D", [Arg(f(1, 4, 3, 3)), Arg(f(4, 3, 2, 3), const=True)], F,
                             (1, 6, 8, 3), convt(groups=2, strides=(3, 1), dilations=(2, 1), pads=(0, 1, 1, 1))),
    "convt_int8_per_channel": ("ConvTranspose2D", [q(i8(1, 4, 3, 4), 0.05, -4),
                                                   q(i8(4, 3, 3, 3), SW, [0, 0, 0], const=True, axis=1)],
                               Out("int8", [0.3], [5]), (1, 3, 5, 7), convt(pads=(1, 1, 1, 1))),
    "convt_int8_groups_batch3": ("ConvTranspose2D", [q(i8(3, 4, 3, 3), 0.05, 2),
                                                     q(i8(4, 3, 2, 2), 0.02, 0, const=True)],
                                 Out("int8", [0.2], [-3]), (3, 6, 6, 6), convt(groups=2)),
})

CASES.update({   # variants the writers refused before: an int8 LeakyRelu, softmax over an inner axis
    "leaky_relu_int8": ("LeakyRelu", [q(i8(3, 4, 5, 5), 0.05, 3)], Out("int8", [0.03], [40]), (3, 4, 5, 5),
                        {"alpha": 0.1}),
    "softmax_inner_axis": ("Softmax", [Arg(f(3, 5, 4))], F, (3, 5, 4), {"axis": 1}),
    "softmax_inner_axis_4d": ("Softmax", [Arg(f(1, 3, 4, 5))], F, (1, 3, 4, 5), {"axis": -2}),
    "softmax_inner_axis_int8": ("Softmax", [q(i8(2, 6, 3), 0.1, 0)], Out("int8", [1 / 256], [-128]), (2, 6, 3),
                                {"axis": 1}),
    "softmax_inner_axis_int8_free": ("Softmax", [q(i8(2, 6, 3), 0.1, 0)], Out("int8", [1 / 200], [-100]), (2, 6, 3),
                                     {"axis": 0}),
})

CASES.update({   # asymmetric per-tensor weights (converters/quantize.py's today): shifted to z = 0, or in float
    "convt_int8_asymmetric_weights_shifted": ("ConvTranspose2D", [
        q(i8(1, 2, 3, 3), 0.05, 2), q(R.integers(-100, 100, (2, 3, 2, 2)).astype(np.int8), 0.02, 9, const=True)],
        Out("int8", [0.1], [-3]), (1, 3, 6, 6), convt()),
    "convt_int8_asymmetric_weights_in_float": ("ConvTranspose2D", [
        q(i8(3, 2, 3, 3), 0.05, 2), q(i8(2, 3, 3, 3), 0.02, 9, const=True)],
        Out("int8", [0.1], [-3]), (3, 3, 6, 6), convt(pads=(1, 1, 1, 1), output_padding=(1, 1))),
})

CONV = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "groups": 2}
CASES.update({   # a grouped (not depthwise) convolution: one block-diagonal CONV_2D in TFLite
    "grouped_conv": ("Conv2D", [Arg(f(1, 4, 6, 6)), Arg(f(6, 2, 3, 3), const=True)], F, (1, 6, 6, 6), CONV),
    "grouped_conv_int8_batch3": ("Conv2D", [q(i8(3, 6, 5, 5), 0.05, 3),
                                            q(i8(4, 3, 3, 3), [0.01, 0.02, 0.015, 0.01], [0] * 4, const=True, axis=0)],
                                 Out("int8", [0.5], [2]), (3, 4, 5, 5), CONV),
})

CASES.update({   # coordinate rules neither TFLite's builtins nor ONNX's Resize-13 express: the gather composites
    "resize_linear_symmetric_scaled": ("Resize", [Arg(f(1, 2, 4, 5))], F, (1, 2, 6, 8),
                                       resize("linear", "half_pixel_symmetric", scales=(1, 1, 1.7, 1.7))),
    "resize_nearest_tf_nn_ceil_batch3": ("Resize", [Arg(f(3, 2, 4, 6))], F, (3, 2, 7, 9),
                                         resize("nearest", "tf_half_pixel_for_nn", "ceil", sizes=(3, 2, 7, 9))),
})

CASES.update({   # a channel gather of an NHWC-held tensor (GATHER on axis 3 there), int8 requantized
    "gather_channels_int8_batch3": ("Gather", [q(i8(3, 5, 4, 4), 0.05, 3), Arg(np.array([4, 0, -3], np.int64),
                                                                                const=True)],
                                    Out("int8", [0.04], [-1]), (3, 3, 4, 4), {"axis": 1}),
})

CASES.update({   # a run-time slope of lower rank than an NHWC-held x: PRELU in the graph's own layout
    "prelu_run_time_slope_4d": ("PRelu", [Arg(f(3, 4, 3, 3)), Arg(f(4, 1, 1))], F, (3, 4, 3, 3), {}),
})

CASES.update({   # a scale that keeps an axis's size still resamples it on the edge (onnxruntime's Resize copies it)
    "resize_linear_scale_keeps_size_int8": ("Resize", [q(i8(1, 3, 1, 3), 0.05, 3)], Out("int8", [0.05], [3]),
                                            (1, 3, 1, 3), resize("linear", "asymmetric", scales=(1, 1, 1.5, 1.25))),
})

CASES.update({   # a 0-d run-time index drops the axis
    "gather_scalar_run_time_index": ("Gather", [Arg(f(4, 2, 3)), Arg(np.array(-2, np.int32))], F, (4, 3), {"axis": 1}),
})

CASES.update({   # a wide input, a fine output, a float slope: 127 slope levels would cost steps: PRELU in float
    "prelu_int8_fine_output_in_float": ("PRelu", [q(i8(2, 4, 3, 2), 0.036, 50),
                                                  Arg(np.array([1.4, -0.3, 0.77, 0.05], np.float32).reshape(4, 1, 1),
                                                      const=True)], Out("int8", [0.0064], [8]), (2, 4, 3, 2), {}),
})

CASES.update({   # int8 MatMul of two activations (converters/quantize.py writes it for attention): BATCH_MATMUL
    "batch_matmul_int8": ("MatMul", [q(i8(2, 3, 5), 0.05, 3), q(i8(2, 5, 4), 0.04, -7)], Out("int8", [0.3], [2]),
                          (2, 3, 4), {"transpose_a": 0, "transpose_b": 0}),
    "batch_matmul_int8_tb_broadcast": ("MatMul", [q(i8(3, 2, 3, 6), 0.05, 3), q(i8(2, 4, 6), 0.04, 0)],
                                       Out("int8", [0.25], [-5]), (3, 2, 3, 4), {"transpose_a": 0, "transpose_b": 1}),
})

CASES.update({   # an int8 Transpose whose output is quantized unlike its input
    "transpose_int8_requant": ("Transpose", [q(i8(2, 3, 4), 0.05, 3)], Out("int8", [0.07], [-9]), (4, 2, 3),
                               {"perm": [2, 0, 1]}),
})
