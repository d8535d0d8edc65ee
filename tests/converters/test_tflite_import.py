"""TFLite import: .tflite files written in the test (tflite_writer), imported, run by the isthmus
executor and compared with hand-written NHWC numpy computations; int8 and float16 weights,
a fully quantized graph, unsupported ops listed at once, malformed files refused clearly."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.converters.tflite_import import TFLiteImportError, from_tflite

from .tflite_writer import TFLiteWriter

rng = np.random.default_rng(0)
F32 = np.float32


# ---- NHWC references ------------------------------------------------------------------------------
def same_pads(n, k, s, d=1):
    total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
    return total // 2, total - total // 2


def ref_conv(x, w, b, stride, padding, dil=1, depthwise_mult=None):
    """x [N,H,W,C]; w [O,KH,KW,I] (or [1,KH,KW,C*M] when depthwise_mult)."""
    n, h, wd, c = x.shape
    kh, kw = w.shape[1:3]
    ph = same_pads(h, kh, stride, dil) if padding == "SAME" else (0, 0)
    pw = same_pads(wd, kw, stride, dil) if padding == "SAME" else (0, 0)
    xp = np.pad(x.astype(np.float64), ((0, 0), ph, pw, (0, 0)))
    oh = (xp.shape[1] - (kh - 1) * dil - 1) // stride + 1
    ow = (xp.shape[2] - (kw - 1) * dil - 1) // stride + 1
    o = w.shape[3] if depthwise_mult else w.shape[0]
    y = np.zeros((n, oh, ow, o))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, i * stride:i * stride + (kh - 1) * dil + 1:dil, j * stride:j * stride + (kw - 1) * dil + 1:dil, :]
            if depthwise_mult:
                y[:, i, j, :] = np.einsum("nabc,abc->nc", np.repeat(win, depthwise_mult, axis=3), w[0])
            else:
                y[:, i, j, :] = np.einsum("nabc,oabc->no", win, w)
    return y + (0 if b is None else b)


def ref_pool(x, k, s, padding, kind):
    n, h, w, c = x.shape
    ph = same_pads(h, k, s) if padding == "SAME" else (0, 0)
    pw = same_pads(w, k, s) if padding == "SAME" else (0, 0)
    xp = np.pad(x.astype(np.float64), ((0, 0), ph, pw, (0, 0)), constant_values=np.nan)
    oh, ow = (xp.shape[1] - k) // s + 1, (xp.shape[2] - k) // s + 1
    y = np.zeros((n, oh, ow, c))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, i * s:i * s + k, j * s:j * s + k, :]
            y[:, i, j, :] = np.nanmax(win, axis=(1, 2)) if kind == "max" else np.nanmean(win, axis=(1, 2))
    return y


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _run(data, feeds_nhwc, nhwc_io=False):
    g, ins, outs = from_tflite(data, nhwc_io=nhwc_io)
    feed = {}
    for name, v in feeds_nhwc.items():
        feed[ins[name]] = v if (nhwc_io or v.ndim != 4) else v.transpose(0, 3, 1, 2)
    got = ism.Session(g).run(outs, feed)
    return [v if (nhwc_io or v.ndim != 4) else v.transpose(0, 2, 3, 1) for v in got], g, outs


def conv_opts(pad="SAME", stride=1, act=0, dil=1):
    return dict(Padding=0 if pad == "SAME" else 1, StrideW=stride, StrideH=stride, FusedActivationFunction=act,
                DilationWFactor=dil, DilationHFactor=dil)


# ---- a small CNN with both branch kinds ---------------------------------------------------------------
def cnn_model():
    w = TFLiteWriter()
    x = w.tensor("image", [1, 9, 9, 3])
    k1 = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(F32)
    b1 = rng.standard_normal(4).astype(F32)
    k2 = (rng.standard_normal((1, 3, 3, 8)) * 0.3).astype(F32)
    b2 = rng.standard_normal(8).astype(F32)
    fc = rng.standard_normal((5, 12)).astype(F32)
    fcb = rng.standard_normal(5).astype(F32)
    c1 = w.tensor("conv1", [1, 9, 9, 4])
    w.op("CONV_2D", [x, w.const("k1", k1), w.const("b1", b1)], [c1], conv_opts("SAME", 1, act=1), "Conv2DOptions")
    c2 = w.tensor("dw", [1, 4, 4, 8])
    w.op("DEPTHWISE_CONV_2D", [c1, w.const("k2", k2), w.const("b2", b2)], [c2],
         dict(conv_opts("VALID", 2, act=3), DepthMultiplier=2), "DepthwiseConv2DOptions")
    p1 = w.tensor("maxp", [1, 3, 3, 8])
    w.op("MAX_POOL_2D", [c2], [p1], dict(Padding=1, StrideW=1, StrideH=1, FilterWidth=2, FilterHeight=2), "Pool2DOptions")
    p2 = w.tensor("avgp", [1, 5, 5, 4])
    w.op("AVERAGE_POOL_2D", [c1], [p2], dict(Padding=0, StrideW=2, StrideH=2, FilterWidth=3, FilterHeight=3),
         "Pool2DOptions")
    pad = w.tensor("padded", [1, 5, 5, 8])
    w.op("PAD", [p1, w.const("pads", np.array([[0, 0], [1, 1], [2, 0], [0, 0]], np.int32))], [pad])
    cat = w.tensor("cat", [1, 5, 5, 12])
    w.op("CONCATENATION", [pad, p2], [cat], dict(Axis=3), "ConcatenationOptions")
    m = w.tensor("mean", [1, 12])
    w.op("MEAN", [cat, w.const("axes", np.array([1, 2], np.int32))], [m], dict(KeepDims=False), "ReducerOptions")
    logits = w.tensor("logits", [1, 5])
    w.op("FULLY_CONNECTED", [m, w.const("fc", fc), w.const("fcb", fcb)], [logits], dict(FusedActivationFunction=0),
         "FullyConnectedOptions")
    prob = w.tensor("prob", [1, 5])
    w.op("SOFTMAX", [logits], [prob], dict(Beta=1.0), "SoftmaxOptions")

    def ref(xv):
        h1 = np.maximum(ref_conv(xv, k1, b1, 1, "SAME"), 0)
        h2 = np.clip(ref_conv(h1, k2, b2, 2, "VALID", depthwise_mult=2), 0, 6)
        a = np.pad(ref_pool(h2, 2, 1, "VALID", "max"), ((0, 0), (1, 1), (2, 0), (0, 0)))
        cat_ = np.concatenate([a, ref_pool(h1, 3, 2, "SAME", "avg")], axis=3)
        return softmax(cat_.mean(axis=(1, 2)) @ fc.T + fcb)
    return w.finish([x], [prob]), ref


@pytest.mark.parametrize("nhwc_io", [False, True])
def test_cnn_matches_numpy(nhwc_io):
    data, ref = cnn_model()
    xv = rng.standard_normal((1, 9, 9, 3)).astype(F32)
    (got,), g, _ = _run(data, {"image": xv}, nhwc_io)
    np.testing.assert_allclose(got, ref(xv), rtol=1e-4, atol=1e-6)
    g.verify()
    if not nhwc_io:  # NCHW all the way: no transposes were needed
        assert not [n for n in g.nodes if n.op == "Transpose"]


def test_imported_cnn_exports_to_the_edge_and_runs_there():
    from isthmus.converters.edge_export import to_edge
    from isthmus.edge import Interpreter
    data, ref = cnn_model()
    g, ins, outs = from_tflite(data)
    model = to_edge(g, outs)
    xv = rng.standard_normal((1, 9, 9, 3)).astype(F32)
    (got,) = Interpreter(model).invoke(xv.transpose(0, 3, 1, 2))
    np.testing.assert_allclose(got, ref(xv), rtol=1e-4, atol=1e-6)


# ---- flatten order, broadcasts, activations, resize ------------------------------------------------------
def test_reshape_flatten_broadcast_activations_resize():
    w = TFLiteWriter()
    x = w.tensor("x", [2, 4, 4, 3])
    k = (rng.standard_normal((2, 1, 1, 3))).astype(F32)
    bias_c = rng.standard_normal(2).astype(F32)
    alpha = (rng.random(2) * 0.5).astype(F32)
    scale_c = rng.standard_normal(2).astype(F32)
    fc = rng.standard_normal((3, 32)).astype(F32)
    c = w.tensor("c", [2, 4, 4, 2])
    w.op("CONV_2D", [x, w.const("k", k), -1], [c], conv_opts("VALID"), "Conv2DOptions")
    a = w.tensor("a", [2, 4, 4, 2])
    w.op("ADD", [c, w.const("bias_c", bias_c)], [a], dict(FusedActivationFunction=0), "AddOptions")
    pr = w.tensor("pr", [2, 4, 4, 2])
    w.op("PRELU", [a, w.const("alpha", alpha.reshape(1, 1, 2))], [pr])
    hs = w.tensor("hs", [2, 4, 4, 2])
    w.op("HARD_SWISH", [pr], [hs])
    mu = w.tensor("mu", [2, 4, 4, 2])
    w.op("MUL", [hs, w.const("scale_c", scale_c)], [mu], dict(FusedActivationFunction=0), "MulOptions")
    up = w.tensor("up", [2, 7, 5, 2])
    w.op("RESIZE_BILINEAR", [mu, w.const("size", np.array([7, 5], np.int32))], [up],
         dict(AlignCorners=False, HalfPixelCenters=True), "ResizeBilinearOptions")
    fl = w.tensor("flat", [2, 32])
    w.op("RESHAPE", [mu, w.const("shape", np.array([2, 32], np.int32))], [fl])
    y = w.tensor("y", [2, 3])
    w.op("FULLY_CONNECTED", [fl, w.const("fc", fc), -1], [y], dict(FusedActivationFunction=0), "FullyConnectedOptions")
    s = w.tensor("s", [2, 3])
    w.op("LOGISTIC", [y], [s])
    t = w.tensor("t", [2, 3])
    w.op("TANH", [s], [t])
    data = w.finish([x], [t, up])
    xv = rng.standard_normal((2, 4, 4, 3)).astype(F32)
    (got_t, got_up), _, _ = _run(data, {"x": xv})
    h = ref_conv(xv, k, None, 1, "VALID") + bias_c
    h = np.maximum(h, 0) + alpha * np.minimum(h, 0)
    h = h * np.clip(h + 3, 0, 6) / 6 * scale_c
    want_t = np.tanh(1 / (1 + np.exp(-(h.reshape(2, 32) @ fc.T))))
    np.testing.assert_allclose(got_t, want_t, rtol=1e-4, atol=1e-6)
    want_up = np.zeros((2, 7, 5, 2))  # TF half-pixel bilinear, clamped at the borders
    for i in range(7):
        for j in range(5):
            yi, xj = min(max((i + 0.5) * 4 / 7 - 0.5, 0), 3), min(max((j + 0.5) * 4 / 5 - 0.5, 0), 3)
            a0, b0 = int(yi), int(xj)
            a1, b1 = min(a0 + 1, 3), min(b0 + 1, 3)
            fa, fb = yi - a0, xj - b0
            want_up[:, i, j] = ((1 - fa) * ((1 - fb) * h[:, a0, b0] + fb * h[:, a0, b1])
                                + fa * ((1 - fb) * h[:, a1, b0] + fb * h[:, a1, b1]))
    np.testing.assert_allclose(got_up, want_up, rtol=1e-4, atol=1e-5)


# ---- quantized weights and activations --------------------------------------------------------------------
def test_int8_per_channel_weights_and_fp16_dequantize():
    w = TFLiteWriter()
    x = w.tensor("x", [1, 5, 5, 2])
    wq = rng.integers(-127, 128, (3, 3, 3, 2)).astype(np.int8)
    sw = np.array([0.01, 0.02, 0.005], np.float32)
    bq = rng.integers(-500, 500, 3).astype(np.int32)
    w16 = rng.standard_normal((4, 3)).astype(np.float16)
    c = w.tensor("c", [1, 5, 5, 3])
    w.op("CONV_2D", [x, w.const("wq", wq, scale=sw, zero_point=np.zeros(3), qdim=0),
                     w.const("bq", bq, scale=sw * 0.5, zero_point=np.zeros(3))], [c], conv_opts("SAME"), "Conv2DOptions")
    m = w.tensor("m", [1, 3])
    w.op("MEAN", [c, w.const("axes", np.array([1, 2], np.int32))], [m], dict(KeepDims=False), "ReducerOptions")
    deq = w.tensor("w32", [4, 3])
    w.op("DEQUANTIZE", [w.const("w16", w16)], [deq])
    y = w.tensor("y", [1, 4])
    w.op("FULLY_CONNECTED", [m, deq, -1], [y], dict(FusedActivationFunction=1), "FullyConnectedOptions")
    data = w.finish([x], [y])
    xv = rng.standard_normal((1, 5, 5, 2)).astype(F32)
    (got,), _, _ = _run(data, {"x": xv})
    wf = wq.astype(np.float64) * sw.reshape(3, 1, 1, 1)
    h = ref_conv(xv, wf, bq * sw * 0.5, 1, "SAME").mean(axis=(1, 2))
    np.testing.assert_allclose(got, np.maximum(h @ w16.astype(np.float64).T, 0), rtol=1e-4, atol=1e-5)


def test_fully_quantized_graph_runs_on_real_values():
    w = TFLiteWriter()
    sx, zx, sy, zy = 0.05, -3, 0.1, 7
    x = w.tensor("xq", [1, 6], np.int8, scale=[sx], zero_point=[zx])
    wq = rng.integers(-100, 100, (4, 6)).astype(np.int8)
    y = w.tensor("yq", [1, 4], np.int8, scale=[sy], zero_point=[zy])
    w.op("FULLY_CONNECTED", [x, w.const("wq", wq, scale=[0.02], zero_point=[0]), -1], [y],
         dict(FusedActivationFunction=0), "FullyConnectedOptions")
    data = w.finish([x], [y])
    xq = rng.integers(-128, 128, (1, 6)).astype(np.int8)
    (got,), _, _ = _run(data, {"xq": xq})
    real = ((xq.astype(np.float64) - zx) * sx) @ (wq.astype(np.float64) * 0.02).T
    want = np.clip(np.floor(real / sy + 0.5) + zy, -128, 127).astype(np.int8)
    assert got.dtype == np.int8
    assert np.abs(got.astype(int) - want).max() <= 1  # float32 vs float64 may round one step apart


# ---- errors ------------------------------------------------------------------------------------------------
def test_unsupported_ops_are_listed_at_once():
    w = TFLiteWriter()
    x = w.tensor("x", [1, 4])
    a, b, c = w.tensor("a", [1, 4]), w.tensor("b", [1, 4]), w.tensor("c", [1, 4])
    w.op("FLOOR", [x], [a])
    w.op("RELU", [a], [b])
    w.op("FLOOR", [b], [c])
    data = w.finish([x], [c])
    with pytest.raises(TFLiteImportError, match=r"FLOOR x2 \(operator 0, 2\)"):
        from_tflite(data)


def test_shape_mismatch_names_the_operator():
    w = TFLiteWriter()
    x = w.tensor("x", [1, 4, 4, 2])
    y = w.tensor("y", [1, 3, 3, 2])  # a 2x2 VALID pool with stride 2 makes 2x2
    w.op("MAX_POOL_2D", [x], [y], dict(Padding=1, StrideW=2, StrideH=2, FilterWidth=2, FilterHeight=2), "Pool2DOptions")
    with pytest.raises(TFLiteImportError, match=r"operator 0 \(MAX_POOL_2D\).*'y'.*\[1, 2, 2, 2\].*\[1, 3, 3, 2\]"):
        from_tflite(w.finish([x], [y]))


def test_bad_indices_and_sizes_are_named():
    w = TFLiteWriter()
    x = w.tensor("x", [1, 4])
    y = w.tensor("y", [1, 4])
    w.op("RELU", [x], [y])
    w.ops[0]["inputs"] = [17]
    with pytest.raises(TFLiteImportError, match=r"operator 0 \(RELU\).*\[17\]"):
        from_tflite(w.finish([x], [y]))
    w = TFLiteWriter()
    x = w.tensor("x", [1, 4])
    k = w.tensor("k", [4, 4], data=np.zeros(3, F32))  # 12 bytes for a 64-byte shape
    y = w.tensor("y", [1, 4])
    w.op("FULLY_CONNECTED", [x, k, -1], [y], dict(FusedActivationFunction=0), "FullyConnectedOptions")
    with pytest.raises(TFLiteImportError, match=r"tensor 1 'k'.*12 bytes"):
        from_tflite(w.finish([x], [y]))
    with pytest.raises(TFLiteImportError, match="file identifier"):
        from_tflite(b"\x00" * 64)


def test_truncated_and_corrupted_files_raise_only_import_errors():
    data, _ = cnn_model()
    r = np.random.default_rng(5)
    for cut in list(r.integers(0, len(data), 40)) + [3, 7, 8, 12]:
        with pytest.raises(TFLiteImportError):
            from_tflite(data[:cut])
    for _ in range(150):
        buf = bytearray(data)
        for p in r.integers(0, len(buf), 4):
            buf[p] = int(r.integers(0, 256))
        try:
            from_tflite(bytes(buf))
        except TFLiteImportError as e:
            assert "operator" in str(e) or "tensor" in str(e) or "model" in str(e) or "buffer" in str(e) \
                or "subgraph" in str(e) or "TFLite" in str(e), str(e)


def test_shape_ops_transpose_squeeze_gather_batch_matmul_split():
    w = TFLiteWriter()
    x = w.tensor("x", [2, 3, 4, 6])
    k = (rng.standard_normal((6, 1, 1, 6))).astype(F32)
    c = w.tensor("c", [2, 3, 4, 6])
    w.op("CONV_2D", [x, w.const("k", k), -1], [c], conv_opts("VALID"), "Conv2DOptions")  # value now NCHW
    a, b = w.tensor("a", [2, 3, 4, 2]), w.tensor("b", [2, 3, 4, 4])
    w.op("SPLIT_V", [c, w.const("sizes", np.array([2, -1], np.int32)), w.const("ax", np.array(3, np.int32))], [a, b],
         dict(NumSplits=2), "SplitVOptions")
    t = w.tensor("t", [2, 4, 3, 2])
    w.op("TRANSPOSE", [a, w.const("perm", np.array([0, 2, 1, 3], np.int32))], [t])
    r = w.tensor("r", [2, 12, 4])
    w.op("RESHAPE", [b, w.const("shape", np.array([2, 12, 4], np.int32))], [r])
    m = w.tensor("m", [2, 12, 12])
    w.op("BATCH_MATMUL", [r, r], [m], dict(AdjX=False, AdjY=True), "BatchMatMulOptions")
    gth = w.tensor("g", [2, 2, 12])
    w.op("GATHER", [m, w.const("idx", np.array([5, 0], np.int32))], [gth], dict(Axis=1, BatchDims=0), "GatherOptions")
    e = w.tensor("e", [2, 1, 2, 12])
    w.op("EXPAND_DIMS", [gth, w.const("one", np.array([1], np.int32))], [e])
    sq = w.tensor("sq", [2, 2, 12])
    w.op("SQUEEZE", [e], [sq], dict(SqueezeDims=[1]), "SqueezeOptions")
    data = w.finish([x], [t, sq])
    xv = rng.standard_normal((2, 3, 4, 6)).astype(F32)
    (got_t, got_sq), _, _ = _run(data, {"x": xv}, nhwc_io=True)
    cv = ref_conv(xv, k, None, 1, "VALID")
    np.testing.assert_allclose(got_t, cv[..., :2].transpose(0, 2, 1, 3), rtol=1e-5, atol=1e-6)
    rv = cv[..., 2:].reshape(2, 12, 4)
    np.testing.assert_allclose(got_sq, (rv @ rv.transpose(0, 2, 1))[:, [5, 0], :], rtol=1e-4, atol=1e-5)


def test_fully_quantized_cnn_with_quantize_and_dequantize_ops():
    """float in -> QUANTIZE -> int8 CONV_2D (per-channel weights, int32 bias) -> int8 AVERAGE_POOL ->
    DEQUANTIZE -> float out, against numpy on the real values (one grid step of tolerance)."""
    w = TFLiteWriter()
    sx, zx, sc, zc = 0.04, 2, 0.05, -5
    x = w.tensor("x", [1, 6, 6, 2])
    xq = w.tensor("xq", [1, 6, 6, 2], np.int8, scale=[sx], zero_point=[zx])
    w.op("QUANTIZE", [x], [xq])
    wq = rng.integers(-127, 128, (3, 3, 3, 2)).astype(np.int8)
    sw = np.array([0.01, 0.008, 0.012], np.float32)
    bq = rng.integers(-300, 300, 3).astype(np.int32)
    c = w.tensor("c", [1, 6, 6, 3], np.int8, scale=[sc], zero_point=[zc])
    w.op("CONV_2D", [xq, w.const("wq", wq, scale=sw, zero_point=np.zeros(3), qdim=0),
                     w.const("bq", bq, scale=sw * sx, zero_point=np.zeros(3))], [c], conv_opts("SAME", act=1),
         "Conv2DOptions")
    p = w.tensor("p", [1, 3, 3, 3], np.int8, scale=[sc], zero_point=[zc])
    w.op("AVERAGE_POOL_2D", [c], [p], dict(Padding=1, StrideW=2, StrideH=2, FilterWidth=2, FilterHeight=2),
         "Pool2DOptions")
    y = w.tensor("y", [1, 3, 3, 3])
    w.op("DEQUANTIZE", [p], [y])
    data = w.finish([x], [y])
    xv = rng.uniform(-2, 2, (1, 6, 6, 2)).astype(F32)
    (got,), _, _ = _run(data, {"x": xv})
    xr = (np.clip(np.floor(xv / sx + 0.5) + zx, -128, 127) - zx) * sx  # the input on its int8 grid
    h = np.maximum(ref_conv(xr, wq * sw.reshape(3, 1, 1, 1).astype(np.float64), bq * sw * sx, 1, "SAME"), 0)
    want = ref_pool(h, 2, 2, "VALID", "avg")
    assert np.abs(got - want).max() <= sc  # intermediate requantization is not reproduced: within a step
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
