"""Each int8 kernel against a plain integer reference written out here (int64 numpy, the same
fixed-point rounding), bit for bit."""
import math

import numpy as np
import pytest

from isthmus.edge import EdgeModelError

from .singleop import Arg, Out, q, run

rng = np.random.default_rng(7)


# ---- the integer semantics, written out independently of edge/quant.py ---------------------------
def multiplier(m: float):
    mant, e = math.frexp(m)
    qm = int(round(mant * 2 ** 31))
    if qm == 2 ** 31:
        qm, e = qm // 2, e + 1
    return qm, 31 - e


def requant(acc, m, zp, lo=-128, hi=127, channel_axis=None, tie_with_zp=False, half_up=False):
    """clamp(rne(acc * q 2^-s) + zp), ties to even (LiteRT's XNNPACK), per channel along channel_axis
    when m is a vector; tie_with_zp: rne(acc * q 2^-s + zp) (LiteRT's int8 MEAN); half_up: floor(. + 1/2)."""
    acc = np.asarray(acc, np.int64)
    ms = np.atleast_1d(m)
    qs = np.array([multiplier(float(v))[0] for v in ms], np.int64)
    ss = np.array([multiplier(float(v))[1] for v in ms], np.int64)
    if channel_axis is not None and len(ms) > 1:
        shape = [1] * acc.ndim
        shape[channel_axis] = -1
        qs, ss = qs.reshape(shape), ss.reshape(shape)
    else:
        qs, ss = qs[0], ss[0]
    t = acc * qs
    v = t >> ss  # the floor, then up past the half, and at the half to the even neighbour
    frac, half = t - (v << ss), np.int64(1) << (ss - 1)
    v = v + (frac > half) + ((frac == half) & (half_up | ((v + (zp if tie_with_zp else 0)) % 2 == 1)))
    return np.clip(v + zp, lo, hi).astype(np.int8)


def convert_ref(x, s1, z1, s2, z2, slope=None):
    """int8 -> int8 requantization as LiteRT's XNNPACK converts: m = round(256 * (s1 / s2 in float32)),
    (x - z1) m / 256 rounded half up, + z2; with a slope, its LEAKY_RELU (m times the slope below z1)."""
    r = f32(s1) / f32(s2)
    mp, mn = round(256.0 * float(r)), round(256.0 * float(r * f32(1.0 if slope is None else slope)))
    d = np.asarray(x, np.int64) - z1
    v = d * np.where(d >= 0, mp, mn)
    return np.clip(((v + 128) >> 8) + z2, -128, 127).astype(np.int8)


def conv_acc(x, zx, w, zw, strides=(1, 1), dil=(1, 1), pads=(0, 0, 0, 0), groups=1):
    """sum over taps and channels of (x - zx) * (w - zw), int64."""
    xi = x.astype(np.int64) - zx
    wi = w.astype(np.int64) - np.asarray(zw, np.int64).reshape(-1, 1, 1, 1)
    t, b, l, r = pads
    xp = np.pad(xi, ((0, 0), (0, 0), (t, b), (l, r)))
    n, c, h, wd = xi.shape
    o, cg, kh, kw = w.shape
    oh = (h + t + b - (kh - 1) * dil[0] - 1) // strides[0] + 1
    ow = (wd + l + r - (kw - 1) * dil[1] - 1) // strides[1] + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    og = o // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i * dil[0]:i * dil[0] + strides[0] * (oh - 1) + 1:strides[0],
                           j * dil[1]:j * dil[1] + strides[1] * (ow - 1) + 1:strides[1]]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, wi[g * og:(g + 1) * og, :, i, j])
    return out


def f32(v):
    """Scales as the file stores them (float32), in float64 for the multiplier arithmetic."""
    a = np.asarray(v, np.float32).astype(np.float64)
    return float(a) if a.ndim == 0 else a


def i8(shape, lo=-128, hi=128):
    return rng.integers(lo, hi, shape).astype(np.int8)


# ---- conv ----------------------------------------------------------------------------------------
CONV_CASES = [
    # x shape, w shape, strides, dilations, pads, groups, activation, per-channel, bias
    ((1, 3, 9, 9), (8, 3, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, "none", True, True),
    ((2, 4, 8, 7), (6, 4, 3, 2), (2, 1), (1, 1), (1, 0, 0, 1), 1, "relu", False, True),
    ((1, 4, 10, 10), (4, 2, 3, 3), (1, 2), (2, 1), (2, 2, 1, 1), 2, "relu6", True, False),
    ((1, 8, 7, 7), (8, 1, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 8, "relu6", True, True),  # depthwise
    ((2, 6, 6, 6), (6, 1, 5, 5), (2, 2), (1, 1), (2, 2, 2, 2), 6, "none", True, True),  # depthwise, stride 2
    ((1, 16, 5, 5), (12, 16, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, "relu", True, True),  # pointwise
    ((2, 5, 4, 4), (3, 5, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, "none", False, False),  # pointwise, batch 2
    ((1, 64, 6, 6), (4, 64, 7, 7), (1, 1), (1, 1), (3, 3, 3, 3), 1, "none", True, True),  # K=3136: float64 path
    ((2, 6, 11, 13), (6, 1, 3, 3), (3, 2), (2, 3), (2, 1, 3, 0), 6, "relu", True, True),  # depthwise, 6 phases
    ((2, 3, 12, 12), (5, 3, 3, 3), (2, 2), (1, 1), (0, 1, 0, 1), 1, "relu6", True, True),  # stride 2, SAME
    ((1, 6, 9, 8), (4, 3, 2, 3), (2, 3), (1, 2), (1, 1, 2, 2), 2, "none", True, True),  # grouped, strided
    ((1, 4, 9, 7), (5, 4, 3, 3), (2, 1), (1, 2), (1, 1, 2, 0), 1, "relu", True, True),  # even C: channel pairs
]


@pytest.fixture(params=["fold", "split"])
def fold(request, monkeypatch):
    """Each GEMM kernel both ways: requantization folded into a float64 GEMM, and an exact GEMM
    followed by the int64 requantizer (the kernels pick one by a cost estimate)."""
    import isthmus.edge.int8_kernels as k8
    monkeypatch.setattr(k8, "fold_pays", lambda k, outputs, columns=0: request.param == "fold")
    monkeypatch.setattr(k8, "DEPTHWISE_FOLD", request.param == "fold")
    return request.param


@pytest.fixture(params=["int-gemm", "float-gemm"])
def gemm(request, monkeypatch):
    """Groups-1 convolutions of one image and 2-D dense layers both ways: on the compiled integer
    GEMM (edge/int8_gemm.py, where the host has it) and on the float-GEMM kernels. Returns a list
    recording each integer-GEMM kernel prepared."""
    import isthmus.edge.int8_gemm as ig
    used = []
    if request.param == "float-gemm":
        monkeypatch.setattr(ig, "ready", lambda: False)
    else:
        if not ig.ready():
            pytest.skip("no compiled integer GEMM on this host (numba, x86 AVX2)")
        for name in ("conv", "dense"):
            real = getattr(ig, name)
            monkeypatch.setattr(ig, name, lambda *a, _real=real, _name=name: used.append(_name) or _real(*a))
    return used if request.param == "int-gemm" else None


@pytest.mark.parametrize("xs,ws,strides,dil,pads,groups,act,per_channel,has_bias", CONV_CASES)
def test_conv(xs, ws, strides, dil, pads, groups, act, per_channel, has_bias, fold, gemm):
    x, w = i8(xs), i8(ws, -127)
    o = ws[0]
    sx, zx, sy, zy = f32(0.03), int(rng.integers(-20, 20)), f32(0.05 * (ws[1] * ws[2] * ws[3]) ** 0.5), int(rng.integers(-10, 10))
    sw = f32(rng.uniform(0.002, 0.02, o) if per_channel else np.full(o, 0.01))
    bias = rng.integers(-3000, 3000, o).astype(np.int32)
    acc = conv_acc(x, zx, w, np.zeros(o), strides, dil, pads, groups) + (bias.reshape(1, -1, 1, 1) if has_bias else 0)
    lo = max(-128, zy) if act != "none" else -128
    hi = min(127, zy + round(6 / sy)) if act == "relu6" else 127
    want = requant(acc, sx * sw / sy, zy, lo, hi, channel_axis=1)
    args = [q(x, sx, zx), q(w, sw if per_channel else sw[:1], np.zeros(o if per_channel else 1), const=True,
                            axis=0 if per_channel else -1)]
    if has_bias:
        args.append(q(bias, sx * sw, np.zeros(o), const=True, axis=0))
    attrs = {"strides": list(strides), "dilations": list(dil), "pads": list(pads), "groups": groups}
    op = "FusedConv2D" if has_bias else "Conv2D"
    if has_bias:
        attrs["activation"] = act
    else:
        want = requant(acc, sx * sw / sy, zy, channel_axis=1)
    got = run(op, args, Out("int8", [sy], [zy]), want.shape, attrs)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 3  # the case exercises the range, not only the clamp
    if gemm is not None:
        assert gemm == (["conv"] if groups == 1 and xs[0] == 1 else [])


@pytest.mark.parametrize("xs,ws,strides,dil,pads,groups,act,per_channel,has_bias", CONV_CASES)
def test_conv_with_power_of_two_channel_scales(xs, ws, strides, dil, pads, groups, act, per_channel, has_bias,
                                               monkeypatch):
    """Channel scales S 2^-e_c (quantize_to_edge's pow2 scales): one multiplier for the whole
    tensor, the powers of two and the bias in the float weights (UniformRequantizer), where the
    kernel can; bit for bit the same integer definition."""
    import isthmus.edge.int8_gemm as ig
    import isthmus.edge.int8_kernels as k8
    monkeypatch.setattr(ig, "ready", lambda: False)  # the float-GEMM kernels' own path
    used = []
    real = k8._uniform
    monkeypatch.setattr(k8, "_uniform", lambda *a: used.append(real(*a)) or used[-1])
    x, w = i8(xs), i8(ws, -127)
    o = ws[0]
    sx, zx, sy, zy = f32(0.03), int(rng.integers(-20, 20)), f32(0.05 * (ws[1] * ws[2] * ws[3]) ** 0.5), int(rng.integers(-10, 10))
    sw = f32(0.02 * np.ldexp(1.0, -rng.integers(0, 4, o)))
    bias = rng.integers(-3000, 3000, o).astype(np.int32)
    acc = conv_acc(x, zx, w, np.zeros(o), strides, dil, pads, groups) + (bias.reshape(1, -1, 1, 1) if has_bias else 0)
    lo = max(-128, zy) if act != "none" and has_bias else -128
    hi = min(127, zy + round(6 / sy)) if act == "relu6" and has_bias else 127
    want = requant(acc, sx * sw / sy, zy, lo, hi, channel_axis=1)
    args = [q(x, sx, zx), q(w, sw, np.zeros(o), const=True, axis=0)]
    if has_bias:
        args.append(q(bias, sx * sw, np.zeros(o), const=True, axis=0))
    attrs = {"strides": list(strides), "dilations": list(dil), "pads": list(pads), "groups": groups}
    if has_bias:
        attrs["activation"] = act
    got = run("FusedConv2D" if has_bias else "Conv2D", args, Out("int8", [sy], [zy]), want.shape, attrs)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 3
    depthwise_or_dense = groups == 1 or (groups == xs[1] == ws[0] and ws[1] == 1)
    exact = 128 * 127 * ws[1] * ws[2] * ws[3] * 2 ** 31 < 2 ** 53  # else the int64 requantizer (K=3136)
    assert [u is not None for u in used] == ([exact] if depthwise_or_dense else [])


# ---- matmul --------------------------------------------------------------------------------------
@pytest.mark.parametrize("m,k,n,tb,act,bias", [(1, 32, 10, False, "none", True), (5, 200, 7, True, "relu", True),
                                               (3, 16, 4, False, "relu6", False), (2, 3000, 3, False, "none", True)])
def test_dense(m, k, n, tb, act, bias, fold, gemm):
    a, w = i8((m, k)), i8((n, k) if tb else (k, n), -127)
    sa, za, sy, zy = f32(0.02), -7, f32(0.02 * k ** 0.5), 3
    sw = f32(rng.uniform(0.005, 0.01, n))
    b = rng.integers(-5000, 5000, n).astype(np.int32)
    wk = (w.T if tb else w).astype(np.int64)
    acc = (a.astype(np.int64) - za) @ wk + (b if bias else 0)
    lo = max(-128, zy) if act != "none" else -128
    hi = min(127, zy + round(6 / sy)) if act == "relu6" else 127
    want = requant(acc, sa * sw / sy, zy, lo, hi, channel_axis=1)
    args = [q(a, sa, za), q(w, sw, np.zeros(n), const=True, axis=0 if tb else 1)]
    if bias:
        args.append(q(b, sa * sw, np.zeros(n), const=True, axis=0))
    got = run("FusedMatMul", args, Out("int8", [sy], [zy]), want.shape,
              {"transpose_a": 0, "transpose_b": int(tb), "activation": act})
    np.testing.assert_array_equal(got, want)
    if gemm is not None:
        assert gemm == ["dense"]


def test_matmul_of_two_activations_with_batch():
    a, b = i8((2, 3, 40)), i8((2, 40, 5))
    acc = (a.astype(np.int64) - 4) @ (b.astype(np.int64) + 9)
    want = requant(acc, f32(0.01) * f32(0.02) / 0.5, -2)
    got = run("MatMul", [q(a, 0.01, 4), q(b, 0.02, -9)], Out("int8", [0.5], [-2]), want.shape)
    np.testing.assert_array_equal(got, want)


# ---- elementwise ---------------------------------------------------------------------------------
def add_ref(x1, s1, z1, x2, s2, z2, sy, zy):
    """LiteRT's XNNPACK qs8 Add: float32 ratios s_i / s_y, the larger one's multiplier 21 bits
    (shift = 20 - its exponent), the sum shifted right after adding half (half up)."""
    r1, r2 = f32(s1) / f32(sy), f32(s2) / f32(sy)  # float32 divisions
    assert 2.0 ** -10 <= min(r1, r2) and max(r1, r2) < 2.0 ** 8  # the ratios XNNPACK takes
    shift = 20 - (int(np.frexp(max(r1, r2))[1]) - 1)
    q1, q2 = round(float(r1) * 2 ** shift), round(float(r2) * 2 ** shift)
    assert 1 << 20 <= max(q1, q2) < 1 << 21
    v = (x1.astype(np.int64) - z1) * q1 + (x2.astype(np.int64) - z2) * q2
    return np.clip(((v + (1 << (shift - 1))) >> shift) + zy, -128, 127).astype(np.int8)


@pytest.mark.parametrize("path", ["float64", "table"])
@pytest.mark.parametrize("s2,shape2", [(0.05, (2, 3, 4, 4)), (0.7, (1, 3, 1, 1)), (0.001, (4,))])
def test_add_broadcast(s2, shape2, path, monkeypatch):
    """Both ways the kernel evaluates the definition: float64 arithmetic where exact, else a table."""
    if path == "table":
        import isthmus.edge.int8_elementwise as e8
        monkeypatch.setattr(e8, "F64_EXACT", 0)
    x1, x2 = i8((2, 3, 4, 4)), i8(shape2)
    want = add_ref(x1, 0.1, 5, x2, s2, -3, 0.12, 1)
    got = run("Add", [q(x1, 0.1, 5), q(x2, s2, -3)], Out("int8", [0.12], [1]), want.shape)
    np.testing.assert_array_equal(got, want)


def test_bias_add_is_add_along_an_axis():
    x, b = i8((2, 3, 4, 4)), i8((3,))
    want = add_ref(x, 0.1, 0, b.reshape(3, 1, 1), 0.05, 2, 0.1, -1)
    got = run("BiasAdd", [q(x, 0.1, 0), q(b, 0.05, 2, const=True)], Out("int8", [0.1], [-1]), want.shape, {"axis": 1})
    np.testing.assert_array_equal(got, want)


def test_mul_broadcast():
    x1, x2 = i8((3, 5)), i8((1, 5))
    want = requant((x1.astype(np.int64) - 2) * (x2.astype(np.int64) + 6), f32(0.05) * f32(0.04) / f32(0.03), -4)
    got = run("Mul", [q(x1, 0.05, 2), q(x2, 0.04, -6)], Out("int8", [0.03], [-4]), want.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op,same", [("Relu", True), ("Relu", False), ("Relu6", True), ("Relu6", False)])
def test_relu(op, same):
    x = i8((2, 40))
    sx, zx, sy, zy = (0.05, -10, 0.05, -10) if same else (0.05, -10, 0.03, -100)
    hi = min(127, zy + round(6 / sy)) if op == "Relu6" else 127
    want = requant(x.astype(np.int64) - zx, f32(sx) / f32(sy), zy, max(-128, zy), hi, half_up=True)
    got = run(op, [q(x, sx, zx)], Out("int8", [sy], [zy]), want.shape)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("sy,zy,alpha", [(0.05, 1, 0.5), (0.1, -7, 0.25), (0.03, 40, 0.2)])
def test_leaky_relu_as_litert_runs_it(sy, zy, alpha):
    """XNNPACK's int8 LEAKY_RELU: 8-bit multipliers, half up (halves with 0.05 -> 0.1 and slopes 1/2, 1/4)."""
    x = np.arange(-128, 128, dtype=np.int8).reshape(4, 64)
    want = convert_ref(x, 0.05, 3, sy, zy, slope=alpha)
    got = run("LeakyRelu", [q(x, 0.05, 3)], Out("int8", [sy], [zy]), want.shape, {"alpha": alpha})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op,f,sy,zy", [("Tanh", np.tanh, 1 / 128, 0), ("Sigmoid", lambda v: 1 / (1 + np.exp(-v)), 1 / 256, -128)])
def test_tanh_sigmoid_tables(op, f, sy, zy):
    x = np.arange(-128, 128, dtype=np.int8).reshape(4, 64)
    want = np.clip(np.round(f(f32(0.04) * (x.astype(np.float64) - 3)) / f32(sy)) + zy, -128, 127).astype(np.int8)
    got = run(op, [q(x, 0.04, 3)], Out("int8", [sy], [zy]), want.shape)
    np.testing.assert_array_equal(got, want)


# ---- pooling -------------------------------------------------------------------------------------
def windows(xp, k, s, oh, ow):
    return [xp[:, :, i:i + s[0] * (oh - 1) + 1:s[0], j:j + s[1] * (ow - 1) + 1:s[1]]
            for i in range(k[0]) for j in range(k[1])]


@pytest.mark.parametrize("jit", ["1", "0"])  # 2x2 MaxPool at stride 2: one compiled pass (jit.pool), or numpy
@pytest.mark.parametrize("k,s,pads", [((2, 2), (2, 2), (0, 0, 0, 0)), ((3, 3), (1, 1), (1, 1, 1, 1)),
                                      ((3, 2), (2, 1), (1, 0, 0, 1)), ((2, 2), (2, 2), (1, 1, 0, 1))])
def test_max_and_avg_pool(k, s, pads, jit, monkeypatch):
    monkeypatch.setenv("ISTHMUS_JIT", jit)
    x = i8((2, 3, 7, 6))
    t, b, l, r = pads
    oh, ow = (7 + t + b - k[0]) // s[0] + 1, (6 + l + r - k[1]) // s[1] + 1
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (t, b), (l, r)), constant_values=-1000)
    real = np.pad(np.ones((1, 1, 7, 6), np.int64), ((0, 0), (0, 0), (t, b), (l, r)))
    want_max = np.max(windows(xp, k, s, oh, ow), axis=0).astype(np.int8)
    total = sum(np.where(v == -1000, 0, v) for v in windows(xp, k, s, oh, ow))
    count = sum(windows(real, k, s, oh, ow))
    # half away from zero (LiteRT's int8 AVERAGE_POOL_2D): the magnitude rounded half up, the sign put back
    want_avg = (np.sign(total) * np.floor_divide(2 * np.abs(total) + count, 2 * count)).astype(np.int8)
    ties = (2 * total) % (2 * count) == count
    assert np.any(ties & (total < 0)) and np.any(ties & (total > 0)) or k == (3, 3)  # both signs of tie
    attrs = {"ksize": list(k), "strides": list(s), "pads": list(pads)}
    np.testing.assert_array_equal(run("MaxPool", [q(x, 0.1, 3)], Out("int8", [0.1], [3]), want_max.shape, attrs), want_max)
    np.testing.assert_array_equal(run("AvgPool", [q(x, 0.1, 3)], Out("int8", [0.1], [3]), want_avg.shape, attrs), want_avg)


@pytest.mark.parametrize("shape", [(1, 5, 8, 10), (2, 3, 28, 28), (1, 1, 2, 2), (1, 64, 14, 14)])
def test_max_pool_2x2_over_whole_planes(shape):
    """Even planes, no padding (the W2 CNN's pools): numpy's window maxima, the extremes included."""
    x = rng.choice(np.array([-128, -127, -1, 0, 1, 126, 127], np.int8), shape)
    n, c, h, w = shape
    want = x.reshape(n, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))
    attrs = {"ksize": [2, 2], "strides": [2, 2], "pads": [0, 0, 0, 0]}
    np.testing.assert_array_equal(run("MaxPool", [q(x, 0.1, -128)], Out("int8", [0.1], [-128]), want.shape, attrs),
                                  want)


@pytest.mark.parametrize("keep", [0, 1])
def test_global_avg_pool(keep):
    x = i8((2, 5, 3, 4))
    acc = (x.astype(np.int64) - 7).sum(axis=(2, 3))
    want = requant(acc, f32(0.05) / (f32(0.02) * 12), -9, tie_with_zp=True)
    if keep:
        want = want.reshape(2, 5, 1, 1)
    got = run("GlobalAvgPool", [q(x, 0.05, 7)], Out("int8", [0.02], [-9]), want.shape, {"keepdims": keep})
    np.testing.assert_array_equal(got, want)


# ---- data movement -------------------------------------------------------------------------------
def test_reshape_flatten_identity_keep_or_requantize():
    x = i8((2, 3, 4))
    np.testing.assert_array_equal(run("Reshape", [q(x, 0.1, 0)], Out("int8", [0.1], [0]), (6, 4), {"shape": [-1, 4]}),
                                  x.reshape(6, 4))
    want = convert_ref(x.reshape(2, 12), 0.1, 0, 0.3, 5)
    np.testing.assert_array_equal(run("Flatten", [q(x, 0.1, 0)], Out("int8", [0.3], [5]), (2, 12), {"axis": 1}), want)
    np.testing.assert_array_equal(run("Identity", [q(x, 0.1, 0)], Out("int8", [0.1], [0]), x.shape), x)


def test_concat_requantizes_inputs_with_other_parameters():
    a, b, c = i8((2, 3, 2)), i8((2, 1, 2)), i8((2, 4, 2))
    want = np.concatenate([a, convert_ref(b, 0.2, -20, 0.1, 0), convert_ref(c, 0.05, 1, 0.1, 0)], 1)  # ties: 0.05 / 0.1
    got = run("Concat", [q(a, 0.1, 0), q(b, 0.2, -20), q(c, 0.05, 1)], Out("int8", [0.1], [0]), want.shape, {"axis": 1})
    np.testing.assert_array_equal(got, want)


def test_pad_with_the_quantized_constant():
    x = i8((1, 2, 3, 3))
    want = np.pad(x, ((0, 0), (0, 0), (1, 2), (0, 1)), constant_values=np.int8(round(1.0 / 0.25) - 3))
    got = run("Pad", [q(x, 0.25, -3)], Out("int8", [0.25], [-3]), want.shape,
              {"paddings": [0, 0, 0, 0, 1, 2, 0, 1], "constant_value": 1.0})
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("axis,sx", [(-1, 0.1), (1, 0.02), (0, 1.0)])
def test_softmax(axis, sx):
    x = i8((3, 10, 2))
    table = np.round(np.exp(f32(sx) * (np.arange(256) - 255.0)) * 2 ** 20).astype(np.int64)
    d = x.astype(np.int64) - x.max(axis=axis, keepdims=True).astype(np.int64)
    e = table[d + 255]
    s = e.sum(axis=axis, keepdims=True)
    p16 = (e * 2 ** 16 + s // 2) // s
    want = requant(p16, 2.0 ** -16 / f32(1 / 256), -128)
    got = run("Softmax", [q(x, sx, 5)], Out("int8", [1 / 256], [-128]), want.shape, {"axis": axis})
    np.testing.assert_array_equal(got, want)
    real = (got.astype(np.float64) + 128) / 256
    ref = np.exp(f32(sx) * d) / np.exp(f32(sx) * d).sum(axis=axis, keepdims=True)
    assert np.abs(real - ref).max() <= 1 / 256 + 1e-9


# ---- quantize / dequantize -----------------------------------------------------------------------
def test_quantize_per_tensor_and_per_axis_and_back():
    x = rng.standard_normal((2, 3, 4)).astype(np.float32) * 3
    want = np.clip(np.rint(x / np.float32(0.05)) + 4, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(run("Quantize", [Arg(x)],
                                      Out("int8", [0.05], [4]), x.shape), want)
    s = np.array([0.01, 0.02, 0.04], np.float32)
    want_axis = np.clip(np.rint(x / s.reshape(3, 1)) + np.array([0, 1, -1]).reshape(3, 1), -128, 127).astype(np.int8)
    got = run("Quantize", [Arg(x)], Out("int8", list(s), [0, 1, -1], axis=1), x.shape)
    np.testing.assert_array_equal(got, want_axis)
    back = run("Dequantize", [q(got, s, [0, 1, -1], axis=1)], Out("float32"), x.shape)
    np.testing.assert_array_equal(back, ((got.astype(np.float32) - np.array([0, 1, -1], np.float32).reshape(3, 1))
                                         * s.reshape(3, 1)))
    requantized = run("Quantize", [q(want, 0.05, 4)], Out("int8", [0.1], [0]), x.shape)
    np.testing.assert_array_equal(requantized, convert_ref(want, 0.05, 4, 0.1, 0))


@pytest.mark.parametrize("z", [5, -128, 0])
def test_dequantize_per_tensor_rounds_as_numpy(z):
    """Per tensor (the compiled pass where the host has it): every int8 value, a scale whose products
    round, bit for bit numpy's float32 (x - z) * s."""
    x = np.arange(-128, 128, dtype=np.int8).reshape(2, 128)
    s = np.float32(0.0123456789)
    want = (x.astype(np.float32) - np.float32(z)) * s
    got = run("Dequantize", [q(x, s, z)], Out("float32"), x.shape)
    assert got.dtype == np.float32 and np.array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("z", [3, -4])
def test_quantize_ties_to_even_and_saturates(z):
    """Halves (exact with scale 0.5) round to even before the zero point is added; values past
    either end saturate, ties at the ends included."""
    t = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 123.5, 124.5, 125.5, -131.5, -132.5, -124.5, 1e30, -1e30], np.float32)
    x = (t * np.float32(0.5)).reshape(1, -1)
    want = np.clip(np.rint(x / np.float32(0.5)) + z, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(run("Quantize", [Arg(x)], Out("int8", [0.5], [z]), x.shape), want)


# ---- what int8 kernels refuse --------------------------------------------------------------------
def test_refusals_name_the_problem():
    x = i8((1, 2, 4, 4))
    with pytest.raises(EdgeModelError, match="fused activation 'tanh' has no int8 kernel|expected one of"):
        run("FusedConv2D", [q(x, 0.1, 0), q(i8((2, 2, 1, 1)), 0.1, 0, const=True),
                            q(np.zeros(2, np.int32), 0.01, 0, const=True)], Out("int8", [0.1], [0]), (1, 2, 4, 4),
            {"activation": "tanh"})
    with pytest.raises(EdgeModelError, match="must be a constant"):
        run("Conv2D", [q(x, 0.1, 0), q(i8((2, 2, 1, 1)), 0.1, 0)], Out("int8", [0.1], [0]), (1, 2, 4, 4))
    with pytest.raises(EdgeModelError, match="scale s_x \\* s_w"):
        run("FusedConv2D", [q(x, 0.1, 0), q(i8((2, 2, 1, 1)), 0.1, 0, const=True),
                            q(np.zeros(2, np.int32), 0.5, 0, const=True)], Out("int8", [0.1], [0]), (1, 2, 4, 4))
    with pytest.raises(EdgeModelError, match="keeps its input's scale"):
        run("MaxPool", [q(x, 0.1, 0)], Out("int8", [0.2], [0]), (1, 2, 2, 2), {"ksize": [2, 2]})
    with pytest.raises(EdgeModelError, match="no int8 kernel"):
        run("LayerNorm", [q(x, 0.1, 0)], Out("int8", [0.1], [0]), x.shape)


@pytest.mark.parametrize("xs,ws,pads", [((1, 16, 9, 9), (24, 16, 1, 1), (0, 0, 0, 0)),
                                        ((1, 8, 10, 11), (20, 8, 3, 3), (1, 1, 1, 1))])
def test_integer_gemm_requantizes_short_multipliers_in_float32(xs, ws, pads, monkeypatch):
    """Few-bit multipliers (the quantizer's short scales): the integer GEMM requantizes in float32
    registers, still the integer definition bit for bit."""
    import isthmus.edge.int8_gemm as ig
    if not ig.ready():
        pytest.skip("no compiled integer GEMM on this host")
    kinds = []
    real = ig.requantization
    monkeypatch.setattr(ig, "requantization", lambda *a: kinds.append(real(*a)) or kinds[-1])
    x, w = i8(xs), i8(ws, -127)
    o = ws[0]
    sx, zx, sy, zy = 0.75 * 2.0 ** -5, 5, 2.0 ** -3, -9
    sw = np.ldexp(1.0, -rng.integers(6, 9, o))
    bias = rng.integers(-3000, 3000, o).astype(np.int32)
    acc = conv_acc(x, zx, w, np.zeros(o), (1, 1), (1, 1), pads) + bias.reshape(1, -1, 1, 1)
    want = requant(acc, sx * sw / sy, zy, max(-128, zy), 127, channel_axis=1)
    args = [q(x, sx, zx), q(w, sw, np.zeros(o), const=True, axis=0), q(bias, sx * sw, np.zeros(o), const=True, axis=0)]
    attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": list(pads), "groups": 1, "activation": "relu"}
    got = run("FusedConv2D", args, Out("int8", [sy], [zy]), want.shape, attrs)
    np.testing.assert_array_equal(got, want)
    assert len(np.unique(got)) > 3
    assert kinds and kinds[0][0] == "float" and kinds[0][1].dtype == np.float32
