"""ConvTranspose2D (core/ops/conv_transpose.py) against a loop-by-loop numpy transposed convolution, with
finite-difference gradients; QuantizeLinear/DequantizeLinear (core/ops/quantization.py) against numpy."""
import numpy as np
import pytest

import isthmus as ism

from .opcheck import check_forward, check_gradients, run_op

rng = np.random.default_rng(6)


def np_conv_transpose(x, w, strides=(1, 1), pads=((0, 0), (0, 0)), dilations=(1, 1), groups=1, output_padding=(0, 0)):
    n, ci, h, wd = x.shape
    _, cog, kh, kw = w.shape
    (sh, sw), (dh, dw) = strides, dilations
    full_h = sh * (h - 1) + (kh - 1) * dh + 1 + output_padding[0]
    full_w = sw * (wd - 1) + (kw - 1) * dw + 1 + output_padding[1]
    out = np.zeros((n, cog * groups, full_h, full_w))
    cig = ci // groups
    for b, c, i, j, a, e in np.ndindex(n, ci, h, wd, kh, kw):
        g = c // cig
        out[b, g * cog:(g + 1) * cog, i * sh + a * dh, j * sw + e * dw] += x[b, c, i, j] * w[c, :, a, e]
    (t, bo), (lf, r) = pads
    return out[:, :, t:full_h - bo, lf:full_w - r]


X = rng.standard_normal((2, 4, 3, 4))
W = rng.standard_normal((4, 3, 3, 2))
CT = [  # name, keyword arguments
    ("plain", {}),
    ("strided_padded", {"strides": (2, 2), "pads": ((1, 0), (0, 1)), "output_padding": (1, 1)}),
    ("dilated", {"strides": (2, 1), "dilations": (2, 2)}),
    ("groups", {"groups": 2}),
    ("depthwise", {"groups": 4}),
]
CASES = [(f"conv_transpose_{name}", (lambda kw: lambda x, w: ism.conv_transpose2d(x, w, **kw))(kw),
          [X, W if kw.get("groups", 1) == 1 else rng.standard_normal((4, 3 if kw["groups"] == 2 else 1, 3, 2))],
          (lambda kw: lambda x, w: np_conv_transpose(x, w, **kw))(kw), True) for name, kw in CT]
NO_GRADIENT = {"QuantizeLinear", "DequantizeLinear"}  # integer on one side: no gradient (straight-through is not implied)


@pytest.mark.parametrize("name,build,inputs,ref,diff", CASES, ids=[c[0] for c in CASES])
def test_conv_transpose_forward(name, build, inputs, ref, diff):
    check_forward(build, inputs, ref, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("name,build,inputs,ref,diff", CASES, ids=[c[0] for c in CASES])
def test_conv_transpose_gradient(name, build, inputs, ref, diff):
    check_gradients(build, [inputs[0][:1, :, :2, :3], inputs[1]])


def test_conv_transpose_refuses_mismatched_channels_and_big_output_padding():
    with ism.Graph().as_default():
        with pytest.raises(ism.ShapeError, match="groups"):
            ism.conv_transpose2d(ism.placeholder("float32", (1, 3, 4, 4)), np.zeros((4, 2, 3, 3), np.float32))
        with pytest.raises(ism.ShapeError, match="output_padding"):
            ism.conv_transpose2d(ism.placeholder("float32", (1, 4, 4, 4)), np.zeros((4, 2, 3, 3), np.float32),
                                 strides=2, output_padding=(2, 0))


def np_quantize(x, s, z, lo, hi):
    return np.clip(np.rint(x / s) + z, lo, hi)


def test_quantize_per_tensor_per_axis_and_blocked_against_numpy():
    x = rng.uniform(-3, 3, (2, 4, 6)).astype(np.float32)
    x[0, 0, :4] = [0.5, 1.5, -0.5, 2.5]  # halves round to even
    s_axis = np.array([0.01, 0.02, 0.05, 0.1], np.float32)
    z_axis = np.array([0, 10, -20, 127], np.int8)
    s_block = rng.uniform(0.01, 0.05, (2, 4, 2)).astype(np.float32)
    z_block = rng.integers(0, 255, (2, 4, 2)).astype(np.uint8)
    cases = [
        (lambda t: ism.quantize_linear(t, np.float32(1.0), np.uint8(128)), np_quantize(x, 1.0, 128, 0, 255), np.uint8),
        (lambda t: ism.quantize_linear(t, s_axis, z_axis, axis=1),
         np_quantize(x, s_axis.reshape(1, 4, 1), z_axis.reshape(1, 4, 1), -128, 127), np.int8),
        (lambda t: ism.quantize_linear(t, s_block, z_block, axis=2, block_size=3),
         np_quantize(x, np.repeat(s_block, 3, 2), np.repeat(z_block, 3, 2), 0, 255), np.uint8),
    ]
    for build, want, dt in cases:
        got, _ = run_op(build, [x])
        assert got[0].dtype == dt
        np.testing.assert_array_equal(got[0], want.astype(dt))


def test_dequantize_inverts_quantize_within_half_a_step():
    x = rng.uniform(-1, 1, (3, 5)).astype(np.float32)
    s = np.array([0.01, 0.02, 0.008], np.float32)  # 127 steps cover [-1, 1]
    got, _ = run_op(lambda t: ism.dequantize_linear(ism.quantize_linear(t, s, np.zeros(3, np.int8), axis=0), s,
                                                    np.zeros(3, np.int8), axis=0), [x])
    assert got[0].dtype == np.float32
    assert np.all(np.abs(got[0] - x) <= s.reshape(3, 1) / 2 + 1e-7)


def test_quantize_refuses_a_float_zero_point():
    with ism.Graph().as_default():
        with pytest.raises(ism.ShapeError, match="zero point"):
            ism.quantize_linear(ism.placeholder("float32", (3,)), np.float32(0.1), np.float32(0.0))
