"""Depthwise convolutions on both edge paths: the compiled kernel (isthmus.jit, numba) and the
numpy one (ISTHMUS_JIT=0). fp32 against a hand-written numpy reference, int8 against the plain
integer reference and bit for bit between the paths, and whole MobileNet-style models equal
between the paths."""
import math
import zlib

import numpy as np
import pytest

from isthmus import jit
from isthmus.edge import Interpreter
from isthmus.edge.compiled import exact_int8_bias

from . import cnn
from .singleop import Out, q, run
from .test_kernels_fp32 import conv_ref
from .test_kernels_int8 import conv_acc, f32, requant


def _seed(*case) -> int:
    """A fixed seed per case: hash() of a str is salted per process (PYTHONHASHSEED), which made the
    data differ between runs and xdist workers."""
    return zlib.crc32(repr(case).encode())


@pytest.fixture(params=["compiled", "numpy"])
def kernel_path(request, monkeypatch):
    """Runs the test with the depthwise kernels compiled, then on numpy; counts the compiled calls."""
    import isthmus.jit.depthwise as jd
    import isthmus.jit.depthwise_blocked as jb
    import isthmus.jit.depthwise_int8 as jq
    monkeypatch.setenv("ISTHMUS_JIT", "1" if request.param == "compiled" else "0")
    assert jit.available() == (request.param == "compiled"), "numba is a dependency: it must import"
    calls = []
    real, real8, realb = jd.depthwise_rows, jq.depthwise_int8_step, jb.blocked_rows
    monkeypatch.setattr(jd, "depthwise_rows", lambda *a, **k: calls.append("fp32") or real(*a, **k))
    # 3x3 kernels of dilation 1 run channel-blocked (8 channels a vector) where the host has AVX2,
    # fp32 or int8 (a[12]: requantized into int8 in the same call)
    def blocked(*a, **k):
        calls.append("int8->int8" if a[12] else "int8" if a[0].dtype == np.int8 else "fp32")
        return realb(*a, **k)
    monkeypatch.setattr(jb, "blocked_rows", blocked)

    def step8(*a, **k):  # int8: whether the requantization ran fused (an int8 output) or after the kernel
        run = real8(*a, **k)
        return lambda: calls.append("int8->int8" if a[10] is not None else "int8") or run()
    monkeypatch.setattr(jq, "depthwise_int8_step", step8)
    return request.param, calls


def _paths(monkeypatch, make):
    """make() under ISTHMUS_JIT=1, then under 0 (each prepares its interpreter itself)."""
    out = []
    for flag in ("1", "0"):
        monkeypatch.setenv("ISTHMUS_JIT", flag)
        out.append(make())
    return out


ACTS = {"none": lambda y: y, "relu": lambda y: np.maximum(y, 0), "relu6": lambda y: np.clip(y, 0, 6),
        "tanh": np.tanh, "sigmoid": lambda y: 1 / (1 + np.exp(-y))}

# x shape, kernel, strides, dilations, pads (t, b, l, r), bias, activation
FP32_CASES = [
    ((1, 8, 12, 12), (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), True, "relu6"),  # MobileNet's stride 1
    ((1, 8, 12, 12), (3, 3), (2, 2), (1, 1), (0, 1, 0, 1), True, "relu6"),  # stride 2, SAME
    ((1, 8, 13, 11), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), False, "none"),  # stride 2, odd sizes
    ((2, 6, 10, 9), (3, 3), (1, 1), (1, 1), (0, 0, 0, 0), True, "relu"),  # batch 2, valid
    ((1, 5, 11, 9), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2), True, "none"),  # 5x5
    ((2, 6, 6, 6), (5, 5), (2, 2), (1, 1), (2, 2, 2, 2), False, "tanh"),  # 5x5 stride 2, batch 2
    ((1, 4, 12, 12), (3, 3), (1, 1), (2, 2), (2, 2, 2, 2), True, "relu"),  # dilation 2
    ((2, 6, 11, 13), (3, 3), (3, 2), (2, 3), (2, 1, 3, 0), True, "sigmoid"),  # mixed strides and dilations
    ((1, 3, 9, 9), (3, 3), (2, 1), (1, 1), (1, 0, 1, 0), False, "relu6"),  # stride 2 x 1, asymmetric pads
    ((1, 3, 7, 7), (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), True, "relu"),  # 1x1 depthwise: a scale per channel
]


@pytest.mark.parametrize("xs,k,strides,dil,pads,has_bias,act", FP32_CASES)
def test_fp32_depthwise_against_reference(kernel_path, xs, k, strides, dil, pads, has_bias, act):
    path, calls = kernel_path
    rng = np.random.default_rng(_seed(xs, k, strides, dil, pads))
    c = xs[1]
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal((c, 1) + k).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    want = conv_ref(x, w, strides, dil, pads, c) + (b.reshape(1, c, 1, 1) if has_bias else 0)
    want = ACTS[act](want)
    attrs = {"strides": list(strides), "dilations": list(dil), "pads": list(pads), "groups": c, "activation": act}
    args = [q(x, 1, 0), q(w, 1, 0, const=True)] + ([q(b, 1, 0, const=True)] if has_bias else [])
    for a in args:
        a.scale = None  # plain float tensors
    got = run("FusedConv2D", args, Out("float32"), want.shape, attrs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert calls == (["fp32"] * 2 if path == "compiled" else [])  # run() invokes twice


def _int8_case(rng, xs, k, strides, dil, pads, act, scales):
    c = xs[1]
    x, w = rng.integers(-128, 128, xs).astype(np.int8), rng.integers(-127, 128, (c, 1) + k).astype(np.int8)
    sx, zx = f32(0.03), int(rng.integers(-20, 20))
    sy, zy = f32(0.05 * (k[0] * k[1]) ** 0.5), int(rng.integers(-10, 10))
    if scales == "pow2":  # quantize_to_edge's default: channel scales powers of two apart
        sw = f32(0.02 * np.ldexp(1.0, -rng.integers(0, 4, c)))
    elif scales == "short":  # and a short multiplier (few significant bits): float32 requantization
        sw = f32(np.ldexp(1.0, -rng.integers(6, 9, c)))
        sx, sy = f32(0.046875), f32(0.25)
    else:  # each channel its own scale: the per-channel Requantizer
        sw = f32(rng.uniform(0.002, 0.02, c))
    bias = rng.integers(-3000, 3000, c).astype(np.int32)
    acc = conv_acc(x, zx, w, np.zeros(c), strides, dil, pads, c) + bias.reshape(1, -1, 1, 1)
    lo = max(-128, zy) if act != "none" else -128
    hi = min(127, zy + round(6 / sy)) if act == "relu6" else 127
    want = requant(acc, sx * sw / sy, zy, lo, hi, channel_axis=1)
    args = [q(x, sx, zx), q(w, sw, np.zeros(c), const=True, axis=0), q(bias, sx * sw, np.zeros(c), const=True, axis=0)]
    attrs = {"strides": list(strides), "dilations": list(dil), "pads": list(pads), "groups": c, "activation": act}
    return args, attrs, sy, zy, want


INT8_CASES = [(xs, k, s, d, p, act) for xs, k, s, d, p, _, act in FP32_CASES if act in ("none", "relu", "relu6")]


@pytest.mark.parametrize("scales", ["free", "pow2", "short"])
@pytest.mark.parametrize("xs,k,strides,dil,pads,act", INT8_CASES)
def test_int8_depthwise_against_integer_reference(kernel_path, monkeypatch, xs, k, strides, dil, pads, act, scales):
    path, calls = kernel_path
    import isthmus.edge.int8_kernels as k8
    uni = []
    real = k8._uniform
    monkeypatch.setattr(k8, "_uniform", lambda *a: uni.append(real(*a)) or uni[-1])
    rng = np.random.default_rng(_seed(xs, k, strides, dil, pads, scales))
    args, attrs, sy, zy, want = _int8_case(rng, xs, k, strides, dil, pads, act, scales)
    got = run("FusedConv2D", args, Out("int8", [sy], [zy]), want.shape, attrs)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 3  # the case exercises the range, not only the clamp
    # the requantization the case meant to reach, and the compiled kernel on the compiled path
    assert (uni[0] is not None) == (scales != "free") and (scales != "short" or uni[0][0].short)
    assert calls == ([("int8->int8" if scales == "short" else "int8")] * 2 if path == "compiled" else [])


@pytest.mark.parametrize("scales", ["free", "pow2", "short"])
@pytest.mark.parametrize("zx", [-128, 0, 37, 127])
def test_int8_paths_are_bit_identical(monkeypatch, zx, scales):
    """The same file on both paths, many inputs, the input zero point at its extremes."""
    rng = np.random.default_rng(zx + 200)
    args, attrs, sy, zy, _ = _int8_case(rng, (2, 12, 14, 14), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "relu6", scales)
    args[0].zero_point = [zx]
    from .singleop import model
    data = model("FusedConv2D", args, Out("int8", [sy], [zy]), (2, 12, 7, 7), attrs)
    fast, slow = _paths(monkeypatch, lambda: Interpreter(data))
    for seed in range(3):
        xv = np.random.default_rng(seed).integers(-128, 128, (2, 12, 14, 14)).astype(np.int8)
        np.testing.assert_array_equal(fast.invoke(xv)[0], slow.invoke(xv)[0])


def test_exact_int8_bias_refuses_what_float32_cannot_hold():
    w = np.full((2, 9), 127.0, np.float32)
    b = exact_int8_bias(w, np.array([5.0, -7.0]), 3, 131, np.float32)
    np.testing.assert_array_equal(b, [5.0 + 3 * 9 * 127, -7.0 + 3 * 9 * 127])
    # partial sums up to 2^24: refused in float32, taken in float64
    assert exact_int8_bias(w, np.array([2.0 ** 24, 0.0]), 0, 255, np.float32) is None
    assert exact_int8_bias(w, np.array([2.0 ** 24, 0.0]), 0, 255, np.float64) is not None
    # weights with low bits: 127 * 2^-20 * 9 taps * 255 needs 8 + 4 + 8 bits above 2^-20, fine; a bias
    # at 2^-30 spreads the channel over 2^(30 + 20) quanta: refused
    wl = (w * 2.0 ** -20).astype(np.float32)
    assert exact_int8_bias(wl, None, 0, 255, np.float32) is not None
    assert exact_int8_bias(wl, np.array([2.0 ** -30, 0.0]), 0, 255, np.float32) is None
    # a bias float32 cannot hold at all
    assert exact_int8_bias(w, np.array([1 + 2.0 ** -30, 0.0]), 0, 255, np.float32) is None


def test_whole_models_agree_between_paths(monkeypatch):
    """tests/edge/cnn.py's MobileNet-style model (conv, depthwise, pointwise, residual, pools, dense):
    fp32 to float rounding, int8 bit for bit; the compiled path plans a smaller arena for fp32."""
    fp_fast, fp_slow = _paths(monkeypatch, lambda: Interpreter(cnn.fp32()))
    q_fast, q_slow = _paths(monkeypatch, lambda: Interpreter(cnn.int8()))
    assert fp_fast.arena_bytes <= fp_slow.arena_bytes
    for seed in range(3):
        xv = np.random.default_rng(seed).standard_normal(cnn.SHAPE).astype(np.float32) * (1 + seed)
        np.testing.assert_allclose(fp_fast.invoke(xv)[0], fp_slow.invoke(xv)[0], rtol=1e-5, atol=1e-6)
        a, b = q_fast.invoke(xv)[0], q_slow.invoke(xv)[0]
        np.testing.assert_array_equal(a, b)
        assert np.ptp(a) > 0


def test_quantized_mobilenet_agrees_bit_for_bit_between_paths(monkeypatch):
    """quantize_to_edge's default file (pow2 channel scales, short multipliers: float32 requantization)
    through core and the converters, as the benchmark runs it."""
    from isthmus.converters.quantize import quantize_to_edge
    from .test_int8_uniform import _mobilenet_like
    sess, x, logits = _mobilenet_like()
    rng = np.random.default_rng(11)
    calib = [{x: rng.standard_normal((1, 3, 20, 20)).astype(np.float32)} for _ in range(3)]
    data = quantize_to_edge(sess, [logits], calib)[0]
    fast, slow = _paths(monkeypatch, lambda: Interpreter(data))
    for seed in range(3):
        xv = np.random.default_rng(seed).standard_normal((1, 3, 20, 20)).astype(np.float32) * (1 + seed)
        a, b = fast.invoke(xv)[0], slow.invoke(xv)[0]
        np.testing.assert_array_equal(a, b)
        assert np.ptp(a) > 0


@pytest.mark.parametrize("s2,z1,zy", [(0.05, 5, 1), (0.7, -128, 127), (0.001, 127, -128)])
def test_int8_residual_add_on_both_paths(kernel_path, s2, z1, zy):
    """Add of two same-shaped int8 tensors (MobileNet's residuals): jit.requantize.add_requantize on
    the compiled path, numpy's float64 passes otherwise; both the integer definition."""
    from .test_kernels_int8 import add_ref, i8
    x1, x2 = i8((2, 3, 5, 4)), i8((2, 3, 5, 4))
    want = add_ref(x1, 0.1, z1, x2, s2, -3, 0.12, zy)
    got = run("Add", [q(x1, 0.1, z1), q(x2, s2, -3)], Out("int8", [0.12], [zy]), want.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("scale,zp", [(0.05, 3), (0.013, -128), (0.5, 127), (1.0, 0)])
def test_quantize_on_both_paths(kernel_path, scale, zp):
    """float32 -> int8 per tensor, ties included: clamp(rint(x / s) + z) with rint half to even
    (jit.requantize.quantize_flat on the compiled path)."""
    rng = np.random.default_rng(abs(zp) + 1)
    x = (rng.standard_normal((2, 3, 8, 8)) * 4).astype(np.float32)
    s = np.float32(scale)
    x.flat[:6] = s * np.array([0.5, 1.5, -0.5, -2.5, 1e6, -1e6], np.float32)  # ties and saturation
    want = np.clip(np.rint(x / s) + zp, -128, 127).astype(np.int8)
    got = run("Quantize", [q(x, 1, 0)], Out("int8", [scale], [zp]), want.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("zx,zy,shape", [(7, -9, (2, 5, 3, 4)), (-128, 127, (1, 16, 6, 6)), (127, -128, (1, 3, 1, 1))])
def test_int8_global_avg_pool_on_both_paths(kernel_path, zx, zy, shape):
    """jit.requantize.sum_requantize_rows on the compiled path: the integer definition either way."""
    from .test_kernels_int8 import i8
    x = i8(shape)
    hw = shape[2] * shape[3]
    acc = (x.astype(np.int64) - zx).sum(axis=(2, 3))
    want = requant(acc, f32(0.05) / (f32(0.02) * hw), zy)
    got = run("GlobalAvgPool", [q(x, 0.05, zx)], Out("int8", [0.02], [zy]), want.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", range(11))
def test_int8_conv_table_on_both_paths(kernel_path, monkeypatch, case):
    """tests/edge/test_kernels_int8.py's conv table (every conv shape: GEMM, pointwise, depthwise,
    grouped, float64 accumulators, batch 1 and 2) with free and power-of-two channel scales, on
    both paths: the compiled requantizations (per channel, uniform, short) against the integer
    reference as much as numpy's."""
    from . import test_kernels_int8 as t8
    args = t8.CONV_CASES[case]
    t8.test_conv(*args, fold="default", gemm=None)
    t8.test_conv_with_power_of_two_channel_scales(*args, monkeypatch)


@pytest.mark.parametrize("scales", ["free", "pow2", "short"])
def test_int8_depthwise_falls_back_to_numpy_where_float_could_round(monkeypatch, scales):
    """Where exact_int8_bias refuses (a bound float32 cannot hold), the depthwise conv runs the
    einsum while the rest stays compiled (the requantization after it included): still exact."""
    import isthmus.edge.int8_kernels as k8
    import isthmus.jit.depthwise_int8 as jq
    monkeypatch.setenv("ISTHMUS_JIT", "1")
    monkeypatch.setattr(k8, "exact_int8_bias", lambda *a: None)
    monkeypatch.setattr(jq, "depthwise_int8_step", lambda *a: pytest.fail("the compiled kernel was bound"))
    rng = np.random.default_rng(17)
    args, attrs, sy, zy, want = _int8_case(rng, (1, 8, 12, 12), (3, 3), (2, 2), (1, 1), (1, 1, 1, 1), "relu6", scales)
    got = run("FusedConv2D", args, Out("int8", [sy], [zy]), want.shape, attrs)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("has_bias,act", [(True, "relu6"), (True, "none"), (False, "relu"), (True, "tanh"),
                                          (False, "none")])
@pytest.mark.parametrize("batch", [1, 2])
def test_fp32_pointwise_on_both_paths(kernel_path, has_bias, act, batch):
    """A 1x1 conv: the bias and a none/relu/relu6 clamp as one compiled pass (jit.bias_clamp) after
    the GEMM, numpy's add and clip otherwise; a bias fed at run time is read at each call."""
    rng = np.random.default_rng(batch * 10 + len(act))
    x = rng.standard_normal((batch, 6, 5, 7)).astype(np.float32) * 3
    w = rng.standard_normal((9, 6, 1, 1)).astype(np.float32)
    b = rng.standard_normal(9).astype(np.float32)
    want = ACTS[act](conv_ref(x, w) + (b.reshape(1, 9, 1, 1) if has_bias else 0))
    args = [q(x, 1, 0), q(w, 1, 0, const=True)] + ([q(b, 1, 0)] if has_bias else [])  # a bias input, not a constant
    for a in args:
        a.scale = None
    got = run("FusedConv2D", args, Out("float32"), want.shape, {"activation": act})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if has_bias:  # another bias through the same interpreter
        from .singleop import model
        interp = Interpreter(model("FusedConv2D", args, Out("float32"), want.shape, {"activation": act}))
        for b2 in (b, -2 * b):
            want2 = ACTS[act](conv_ref(x, w) + b2.reshape(1, 9, 1, 1))
            np.testing.assert_allclose(interp.invoke(x, b2)[0], want2, rtol=1e-5, atol=1e-5)


def test_fp32_depthwise_with_weights_and_bias_fed_at_run_time(kernel_path):
    """Weights and bias as inputs (arena views, not file constants): each call reads them anew."""
    path, calls = kernel_path
    from .singleop import model
    rng = np.random.default_rng(23)
    x = rng.standard_normal((1, 6, 9, 9)).astype(np.float32)
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    attrs = {"strides": [2, 2], "pads": [1, 1, 1, 1], "groups": 6, "activation": "relu6"}
    args = [q(x, 1, 0), q(w, 1, 0), q(b, 1, 0)]
    for a in args:
        a.scale = None
    interp = Interpreter(model("FusedConv2D", args, Out("float32"), (1, 6, 5, 5), attrs))
    for k in (1.0, -0.5):
        want = np.clip(conv_ref(x, w * k, (2, 2), (1, 1), (1, 1, 1, 1), 6) + b.reshape(1, 6, 1, 1) * k, 0, 6)
        np.testing.assert_allclose(interp.invoke(x, w * k, b * k)[0], want, rtol=1e-5, atol=1e-5)
    assert calls == (["fp32"] * 2 if path == "compiled" else [])
