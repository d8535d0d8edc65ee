"""Each fp32 edge kernel against a plain numpy reference written out here (float64 loops over
kernel taps, no shared code with the kernels), through writer -> loader -> interpreter."""
import numpy as np
import pytest

from .singleop import Arg, Out, run

rng = np.random.default_rng(3)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def conv_ref(x, w, strides=(1, 1), dil=(1, 1), pads=(0, 0, 0, 0), groups=1):
    t, b, l, r = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, b), (l, r)))
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh = (h + t + b - (kh - 1) * dil[0] - 1) // strides[0] + 1
    ow = (wd + l + r - (kw - 1) * dil[1] - 1) // strides[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cg:(g + 1) * cg, i * dil[0]:i * dil[0] + strides[0] * (oh - 1) + 1:strides[0],
                           j * dil[1]:j * dil[1] + strides[1] * (ow - 1) + 1:strides[1]]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j])
    return out


def pool_ref(x, k, s, pads, kind):
    t, b, l, r = pads
    fill = -np.inf if kind == "max" else np.nan
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, b), (l, r)), constant_values=fill)
    oh, ow = (xp.shape[2] - k[0]) // s[0] + 1, (xp.shape[3] - k[1]) // s[1] + 1
    taps = np.stack([xp[:, :, i:i + s[0] * (oh - 1) + 1:s[0], j:j + s[1] * (ow - 1) + 1:s[1]]
                     for i in range(k[0]) for j in range(k[1])])
    return taps.max(axis=0) if kind == "max" else np.nanmean(taps, axis=0)  # padding not counted


ACT = {"none": lambda v: v, "relu": lambda v: np.maximum(v, 0), "relu6": lambda v: np.clip(v, 0, 6),
       "tanh": np.tanh, "sigmoid": lambda v: 1 / (1 + np.exp(-v))}

CONV_CASES = [
    ((1, 3, 9, 9), (8, 3, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1, "relu"),
    ((2, 4, 8, 7), (6, 4, 3, 2), (2, 1), (1, 1), (1, 0, 0, 1), 1, "none"),
    ((1, 4, 10, 10), (4, 2, 3, 3), (1, 2), (2, 1), (2, 2, 1, 1), 2, "relu6"),
    ((1, 8, 7, 7), (8, 1, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 8, "relu6"),  # depthwise
    ((2, 6, 6, 6), (6, 1, 5, 5), (2, 2), (1, 1), (2, 2, 2, 2), 6, "tanh"),  # depthwise, stride 2, batch 2
    ((1, 16, 5, 5), (12, 16, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, "sigmoid"),  # pointwise
    ((2, 5, 4, 4), (3, 5, 1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, "none"),  # pointwise, batch 2
    ((2, 6, 11, 13), (6, 1, 3, 3), (3, 2), (2, 3), (2, 1, 3, 0), 6, "relu"),  # depthwise, 6 stride phases
    ((1, 6, 9, 8), (4, 3, 2, 3), (2, 3), (1, 2), (1, 1, 2, 2), 2, "none"),  # grouped, strided, dilated
]


@pytest.mark.parametrize("jit", ["1", "0"])  # compiled passes (depthwise, bias + clamp) or numpy's
@pytest.mark.parametrize("xs,ws,strides,dil,pads,groups,act", CONV_CASES)
def test_conv(xs, ws, strides, dil, pads, groups, act, jit, monkeypatch):
    monkeypatch.setenv("ISTHMUS_JIT", jit)
    x, w, b = f32(*xs), f32(*ws), f32(ws[0])
    attrs = {"strides": list(strides), "dilations": list(dil), "pads": list(pads), "groups": groups}
    want = conv_ref(x, w, strides, dil, pads, groups)
    got = run("Conv2D", [Arg(x), Arg(w, const=True)], Out("float32"), want.shape, attrs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    want = ACT[act](want + b.reshape(1, -1, 1, 1))
    got = run("FusedConv2D", [Arg(x), Arg(w, const=True), Arg(b, const=True)], Out("float32"), want.shape,
              {**attrs, "activation": act})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # weights computed at run time (an input, not a constant): permuted into the columns' order per call
    got = run("FusedConv2D", [Arg(x), Arg(w), Arg(b, const=True)], Out("float32"), want.shape,
              {**attrs, "activation": act})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ashape,bshape,ta,tb,const_b", [((3, 8), (8, 5), 0, 0, True), ((4, 8), (5, 8), 0, 1, True),
                                                          ((8, 4), (8, 5), 1, 0, False), ((2, 3, 6), (2, 6, 4), 0, 0, False)])
def test_matmul(ashape, bshape, ta, tb, const_b):
    a, b = f32(*ashape), f32(*bshape)
    at, bt = (np.swapaxes(a, -1, -2) if ta else a), (np.swapaxes(b, -1, -2) if tb else b)
    want = at.astype(np.float64) @ bt
    got = run("MatMul", [Arg(a), Arg(b, const=const_b)], Out("float32"), want.shape, {"transpose_a": ta, "transpose_b": tb})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if len(bshape) == 2:
        bias = f32(want.shape[-1])
        got = run("FusedMatMul", [Arg(a), Arg(b, const=const_b), Arg(bias, const=True)], Out("float32"), want.shape,
                  {"transpose_a": ta, "transpose_b": tb, "activation": "relu"})
        np.testing.assert_allclose(got, np.maximum(want + bias, 0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op,f", [("Add", np.add), ("Mul", np.multiply)])
@pytest.mark.parametrize("s1,s2", [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (3, 1)), ((1, 4), (3, 1))])
def test_binary_broadcast(op, f, s1, s2):
    a, b = f32(*s1), f32(*s2)
    want = f(a.astype(np.float64), b)
    np.testing.assert_allclose(run(op, [Arg(a), Arg(b)], Out("float32"), want.shape), want, rtol=1e-6)


@pytest.mark.parametrize("axis", [1, -1])
def test_bias_add(axis):
    x = f32(2, 3, 4)
    b = f32(x.shape[axis])
    want = x + (b.reshape(-1, 1) if axis == 1 else b)
    np.testing.assert_allclose(run("BiasAdd", [Arg(x), Arg(b, const=True)], Out("float32"), want.shape, {"axis": axis}),
                               want, rtol=1e-6)


@pytest.mark.parametrize("op", ["Relu", "Relu6", "Tanh", "Sigmoid"])
def test_unary(op):
    x = f32(3, 50) * 5
    want = ACT[op.lower()](x.astype(np.float64))
    np.testing.assert_allclose(run(op, [Arg(x)], Out("float32"), want.shape), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k,s,pads", [((2, 2), (2, 2), (0, 0, 0, 0)), ((3, 3), (1, 1), (1, 1, 1, 1)),
                                      ((3, 2), (2, 1), (1, 0, 0, 1))])
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool(k, s, pads, kind):
    x = f32(2, 3, 7, 6)
    want = pool_ref(x, k, s, pads, kind)
    got = run("MaxPool" if kind == "max" else "AvgPool", [Arg(x)], Out("float32"), want.shape,
              {"ksize": list(k), "strides": list(s), "pads": list(pads)})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 3, 7, 6), (1, 32, 28, 28), (1, 5, 9, 11)])
def test_max_pool_2x2_compiled_and_nan(shape):
    """2x2 max at stride 2 (compiled where numba is) on odd and even planes, a NaN propagating as in
    np.maximum, against a numpy reference."""
    x = f32(*shape)
    x[0, 1, 2, 3] = np.nan
    oh, ow = shape[2] // 2, shape[3] // 2
    win = x[:, :, :2 * oh, :2 * ow].reshape(shape[0], shape[1], oh, 2, ow, 2)
    want = np.maximum(np.maximum(win[:, :, :, 0, :, 0], win[:, :, :, 0, :, 1]),
                      np.maximum(win[:, :, :, 1, :, 0], win[:, :, :, 1, :, 1]))
    got = run("MaxPool", [Arg(x)], Out("float32"), want.shape, {"ksize": [2, 2], "strides": [2, 2], "pads": [0] * 4})
    assert np.isnan(got[0, 1, 1, 1]) and np.isnan(got).sum() == 1
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("keep", [0, 1])
def test_global_avg_pool(keep):
    x = f32(2, 5, 3, 4)
    want = x.astype(np.float64).mean(axis=(2, 3), keepdims=bool(keep))
    np.testing.assert_allclose(run("GlobalAvgPool", [Arg(x)], Out("float32"), want.shape, {"keepdims": keep}), want,
                               rtol=1e-5)


def test_reshape_flatten_concat_pad():
    x = f32(2, 3, 4)
    np.testing.assert_array_equal(run("Reshape", [Arg(x)], Out("float32"), (6, 4), {"shape": [-1, 4]}), x.reshape(6, 4))
    np.testing.assert_array_equal(run("Flatten", [Arg(x)], Out("float32"), (2, 12), {"axis": 1}), x.reshape(2, 12))
    parts = [f32(2, 1, 4), f32(2, 3, 4), f32(2, 2, 4)]
    want = np.concatenate(parts, axis=1)
    np.testing.assert_array_equal(run("Concat", [Arg(p) for p in parts], Out("float32"), want.shape, {"axis": 1}), want)
    want = np.pad(x, ((0, 0), (1, 2), (0, 1)), constant_values=0.5)
    np.testing.assert_array_equal(run("Pad", [Arg(x)], Out("float32"), want.shape,
                                      {"paddings": [0, 0, 1, 2, 0, 1], "constant_value": 0.5}), want)


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax(axis):
    x = f32(3, 10, 2) * 4
    e = np.exp(x.astype(np.float64) - x.max(axis=axis, keepdims=True))
    want = e / e.sum(axis=axis, keepdims=True)
    np.testing.assert_allclose(run("Softmax", [Arg(x)], Out("float32"), want.shape, {"axis": axis}), want, rtol=1e-5,
                               atol=1e-7)
