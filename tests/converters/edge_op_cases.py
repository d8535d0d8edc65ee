"""Single-op edge models (tests/edge/singleop.py) for the format writers' tests: fp32 and int8 cases
of every op the TFLite and ONNX edge writers translate, with fixed random inputs."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "edge"))
from singleop import Arg, Out, model, q  # noqa: E402,F401  (model: the tests build with it)

R = np.random.default_rng(0)


def f(*shape):
    return R.standard_normal(shape).astype(np.float32)


def i8(*shape):
    return R.integers(-128, 128, shape).astype(np.int8)


F = Out("float32")
POOL = {"ksize": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
CASES = {  # name: (op, args, out, out shape, attrs)
    "sub": ("Sub", [Arg(f(1, 4, 5, 5)), Arg(f(1, 4, 5, 5))], F, (1, 4, 5, 5), {}),
    "div_const": ("Div", [Arg(f(1, 4, 5, 5)), Arg(np.abs(f(4, 1, 1)) + 1, const=True)], F, (1, 4, 5, 5), {}),
    "maximum": ("Maximum", [Arg(f(2, 6)), Arg(f(2, 6))], F, (2, 6), {}),
    "minimum_4d": ("Minimum", [Arg(f(1, 3, 4, 4)), Arg(f(1, 3, 4, 4))], F, (1, 3, 4, 4), {}),
    "bias_add_4d": ("BiasAdd", [Arg(f(1, 4, 3, 3)), Arg(f(4), const=True)], F, (1, 4, 3, 3), {"axis": 1}),
    "batch_norm": ("BatchNorm", [Arg(f(1, 4, 3, 3))] + [Arg(np.abs(f(4)) + 0.5, const=True) for _ in range(4)], F,
                   (1, 4, 3, 3), {"epsilon": 1e-3, "axis": 1}),
    "avg_pool_same": ("AvgPool", [Arg(f(1, 3, 6, 6))], F, (1, 3, 3, 3),
                      {"ksize": [3, 3], "strides": [2, 2], "pads": [0, 1, 0, 1]}),
    "avg_pool_explicit_pads": ("AvgPool", [Arg(f(1, 3, 8, 8))], F, (1, 3, 4, 4), POOL),
    "max_pool_padded": ("MaxPool", [Arg(f(1, 3, 7, 7))], F, (1, 3, 4, 4), POOL),
    "concat_4d": ("Concat", [Arg(f(1, 2, 4, 4)), Arg(f(1, 3, 4, 4))], F, (1, 5, 4, 4), {"axis": 1}),
    "pad_value": ("Pad", [Arg(f(1, 2, 3, 3))], F, (1, 2, 5, 6),
                  {"paddings": [0, 0, 0, 0, 1, 1, 2, 1], "constant_value": 0.5}),
    "softmax_channels": ("Softmax", [Arg(f(1, 5, 2, 2))], F, (1, 5, 2, 2), {"axis": 1}),
    "batch_matmul": ("MatMul", [Arg(f(2, 3, 4)), Arg(f(2, 4, 5))], F, (2, 3, 5), {"transpose_a": 0, "transpose_b": 0}),
    "batch_matmul_tb": ("MatMul", [Arg(f(2, 3, 4)), Arg(f(2, 5, 4))], F, (2, 3, 5), {"transpose_a": 0, "transpose_b": 1}),
    "tanh": ("Tanh", [Arg(f(2, 7))], F, (2, 7), {}),
    "sigmoid_4d": ("Sigmoid", [Arg(f(1, 2, 3, 3))], F, (1, 2, 3, 3), {}),
    "flatten_4d": ("Flatten", [Arg(f(1, 3, 2, 2))], F, (1, 12), {"axis": 1}),
    "conv_tanh": ("FusedConv2D", [Arg(f(1, 3, 6, 6)), Arg(f(4, 3, 3, 3), const=True), Arg(f(4), const=True)], F,
                  (1, 4, 6, 6), {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "groups": 1,
                                 "activation": "tanh"}),
    "depthwise_multiplier_2": ("Conv2D", [Arg(f(1, 3, 7, 7)), Arg(f(6, 1, 3, 3), const=True)], F, (1, 6, 3, 3),
                               {"strides": [2, 2], "dilations": [1, 1], "pads": [0, 0, 0, 0], "groups": 3}),
    "dilated_conv": ("Conv2D", [Arg(f(1, 2, 9, 9)), Arg(f(3, 2, 3, 3), const=True)], F, (1, 3, 9, 9),
                     {"strides": [1, 1], "dilations": [2, 2], "pads": [2, 2, 2, 2], "groups": 1}),
    "dense_sigmoid": ("FusedMatMul", [Arg(f(2, 5)), Arg(f(5, 3), const=True), Arg(f(3), const=True)], F, (2, 3),
                      {"transpose_a": 0, "transpose_b": 0, "activation": "sigmoid"}),
    "dense_transposed_weights": ("MatMul", [Arg(f(2, 5)), Arg(f(3, 5), const=True)], F, (2, 3),
                                 {"transpose_a": 0, "transpose_b": 1}),
    # int8
    "relu_requant": ("Relu", [q(i8(1, 4, 5, 5), 0.05, 3)], Out("int8", [0.03], [-128]), (1, 4, 5, 5), {}),
    "relu6": ("Relu6", [q(i8(2, 9), 0.06, -5)], Out("int8", [0.06], [-5]), (2, 9), {}),
    "tanh_free_scale": ("Tanh", [q(i8(2, 9), 0.02, 0)], Out("int8", [0.008], [0]), (2, 9), {}),
    "sigmoid_fixed": ("Sigmoid", [q(i8(2, 9), 0.05, 10)], Out("int8", [1 / 256], [-128]), (2, 9), {}),
    "add_int8": ("Add", [q(i8(1, 4, 5, 5), 0.05, 3), q(i8(1, 4, 5, 5), 0.02, -7)], Out("int8", [0.07], [1]),
                 (1, 4, 5, 5), {}),
    "mul_int8": ("Mul", [q(i8(2, 6), 0.05, 3), q(i8(2, 6), 0.02, -7)], Out("int8", [0.004], [0]), (2, 6), {}),
    "concat_int8": ("Concat", [q(i8(1, 2, 4, 4), 0.05, 3), q(i8(1, 3, 4, 4), 0.02, -7)], Out("int8", [0.05], [3]),
                    (1, 5, 4, 4), {"axis": 1}),
    "max_pool_int8": ("MaxPool", [q(i8(1, 3, 7, 7), 0.05, 3)], Out("int8", [0.05], [3]), (1, 3, 4, 4), POOL),
    "avg_pool_int8": ("AvgPool", [q(i8(1, 3, 6, 6), 0.05, 3)], Out("int8", [0.05], [3]), (1, 3, 3, 3),
                              {"ksize": [2, 2], "strides": [2, 2], "pads": [0, 0, 0, 0]}),
    "global_avg_pool_int8": ("GlobalAvgPool", [q(i8(1, 6, 5, 5), 0.05, 3)], Out("int8", [0.01], [0]), (1, 6),
                             {"keepdims": 0}),
    "reshape_int8_requant": ("Reshape", [q(i8(1, 3, 2, 2), 0.05, 3)], Out("int8", [0.1], [0]), (1, 12),
                             {"shape": [1, 12]}),
    "pad_int8": ("Pad", [q(i8(1, 2, 3, 3), 0.05, 3)], Out("int8", [0.05], [3]), (1, 2, 5, 5),
                 {"paddings": [0, 0, 0, 0, 1, 1, 1, 1], "constant_value": 0.0}),
    "softmax_int8_fixed": ("Softmax", [q(i8(3, 10), 0.1, 0)], Out("int8", [1 / 256], [-128]), (3, 10), {"axis": -1}),
    "softmax_int8_free": ("Softmax", [q(i8(3, 10), 0.1, 0)], Out("int8", [1 / 200], [-100]), (3, 10), {"axis": -1}),
    "quantize": ("Quantize", [Arg(f(1, 3, 4, 4))], Out("int8", [0.02], [5]), (1, 3, 4, 4), {}),
    "dequantize": ("Dequantize", [q(i8(1, 3, 4, 4), 0.02, 5)], F, (1, 3, 4, 4), {}),
}

CASES.update({
    "leaky_relu_4d": ("LeakyRelu", [Arg(f(1, 3, 4, 4))], F, (1, 3, 4, 4), {"alpha": 0.1}),
    "transpose": ("Transpose", [Arg(f(2, 3, 4))], F, (4, 2, 3), {"perm": [2, 0, 1]}),
    "layer_norm": ("LayerNorm", [Arg(f(2, 5, 6)), Arg(f(6), const=True), Arg(f(6), const=True)], F, (2, 5, 6),
                   {"axis": -1, "epsilon": 1e-5}),
    "layer_norm_2_axes": ("LayerNorm", [Arg(f(2, 5, 6)), Arg(f(5, 6), const=True), Arg(f(5, 6), const=True)], F,
                          (2, 5, 6), {"axis": 1, "epsilon": 1e-5}),
})
