"""converters/onnx_ops_extra.py beyond the node cases: unknown batch and length, against numpy written out."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import isthmus as ism
from isthmus.converters.onnx_import import OnnxImportError, from_onnx

rng = np.random.default_rng(5)


def _run(nodes, inputs, outputs, feeds, opset):
    m = helper.make_model(helper.make_graph(nodes, "m", inputs, outputs), opset_imports=[helper.make_opsetid("", opset)])
    g, ins, outs = from_onnx(m)
    return ism.Session(g).run(outs, {ins[k]: v for k, v in feeds.items()})


def _np_causal_conv(x, w, b, past, silu):
    k = w.shape[2]
    padded = np.concatenate([past if past is not None else np.zeros(x.shape[:2] + (k - 1,), x.dtype), x], 2)
    L = x.shape[2]
    y = np.stack([np.einsum("bck,ck->bc", padded[:, :, t:t + k], w[:, 0]) for t in range(L)], 2) + b[None, :, None]
    if silu:
        y = y / (1 + np.exp(-y))
    return y, padded[:, :, L:]


@pytest.mark.parametrize("with_past", [False, True])
def test_causal_conv_with_state_at_unknown_batch_and_length(with_past):
    vi = helper.make_tensor_value_info
    ins = [vi("x", TensorProto.FLOAT, ["N", 3, "L"]), vi("w", TensorProto.FLOAT, [3, 1, 4]), vi("b", TensorProto.FLOAT, [3])]
    names = ["x", "w", "b"]
    if with_past:
        ins.append(vi("p", TensorProto.FLOAT, ["N", 3, 3]))
        names.append("p")
    node = helper.make_node("CausalConvWithState", names, ["y", "s"], activation="silu")
    w, b = rng.standard_normal((3, 1, 4)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    for n, length in ((1, 6), (3, 1)):
        x = rng.standard_normal((n, 3, length)).astype(np.float32)
        past = rng.standard_normal((n, 3, 3)).astype(np.float32) if with_past else None
        feeds = {"x": x, "w": w, "b": b, **({"p": past} if with_past else {})}
        y, s = _run([node], ins, [vi("y", TensorProto.FLOAT, None), vi("s", TensorProto.FLOAT, None)], feeds, 27)
        want_y, want_s = _np_causal_conv(x, w, b, past, True)
        np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(s, want_s)


def test_windows_of_a_size_computed_at_run_time():
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Size", ["x"], ["n"]),
             helper.make_node("HannWindow", ["n"], ["hann"]),
             helper.make_node("HammingWindow", ["n"], ["hamming"], periodic=0, output_datatype=TensorProto.DOUBLE),
             helper.make_node("BlackmanWindow", ["n"], ["blackman"], periodic=0)]
    outs = [vi(k, TensorProto.DOUBLE if k == "hamming" else TensorProto.FLOAT, None) for k in ("hann", "hamming", "blackman")]
    for size in (8, 13):
        hann, hamming, blackman = _run(nodes, [vi("x", TensorProto.FLOAT, ["N"])], outs, {"x": np.zeros(size, np.float32)}, 17)
        t = np.arange(size)
        np.testing.assert_allclose(hann, 0.5 - 0.5 * np.cos(2 * np.pi * t / size), atol=1e-6)
        assert hamming.dtype == np.float64
        np.testing.assert_allclose(hamming, 25 / 46 - 21 / 46 * np.cos(2 * np.pi * t / (size - 1)), atol=1e-12)
        np.testing.assert_allclose(blackman, np.blackman(size), atol=1e-6)


def test_shrink_on_integers_and_swiglu_at_unknown_batch():
    vi = helper.make_tensor_value_info
    x = np.array([-5, -2, -1, 0, 1, 2, 5], np.int32)
    (y,) = _run([helper.make_node("Shrink", ["x"], ["y"], lambd=1.5, bias=1.0)], [vi("x", TensorProto.INT32, ["N"])],
                [vi("y", TensorProto.INT32, None)], {"x": x}, 9)
    np.testing.assert_array_equal(y, [-4, -1, 0, 0, 0, 1, 4])
    a, b = rng.standard_normal((5, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    (z,) = _run([helper.make_node("SwiGLU", ["a", "b"], ["z"], alpha=1.702)],
                [vi("a", TensorProto.FLOAT, ["N", 4]), vi("b", TensorProto.FLOAT, ["N", 4])],
                [vi("z", TensorProto.FLOAT, None)], {"a": a, "b": b}, 28)
    np.testing.assert_allclose(z, a / (1 + np.exp(-1.702 * a)) * b, rtol=1e-5)


def test_bitcast_keeps_the_bits_of_a_strided_input_and_refuses_another_width():
    """core's BitCast (what ONNX BitCast imports to): numpy's view of the same bytes, also for a transposed
    (non-contiguous) input; a dtype of another width is refused when the node is built."""
    from isthmus.core.ops.bitwise import bitcast
    x = rng.standard_normal((3, 4)).astype(np.float32)
    g = ism.Graph()
    with g.as_default():
        p = ism.placeholder(np.float32, (None, 4))
        y = bitcast(ism.transpose(p), np.int32)
        assert y.dtype == np.int32 and y.shape == (4, None)
        with pytest.raises(ism.ShapeError, match="32 bits.*int64"):
            bitcast(p, np.int64)
    np.testing.assert_array_equal(ism.Session(g).run(y, {p: x}), np.ascontiguousarray(x.T).view(np.int32))


def test_max_unpool_inverts_max_pool_like_onnxruntime_at_unknown_batch():
    """onnxruntime's MaxPool gives the values and Indices; isthmus and onnxruntime unpool them."""
    import onnxruntime as ort
    vi = helper.make_tensor_value_info

    def model(nodes, inputs, outputs):
        m = helper.make_model(helper.make_graph(nodes, "m", inputs, [vi(o, TensorProto.FLOAT if o != "i" else
                                                                        TensorProto.INT64, None) for o in outputs]),
                              opset_imports=[helper.make_opsetid("", 11)])
        m.ir_version = 8
        return m
    pool = model([helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2])],
                 [vi("x", TensorProto.FLOAT, ["N", 2, 4, 6])], ["p", "i"])
    unpool = model([helper.make_node("MaxUnpool", ["p", "i"], ["u"], kernel_shape=[2, 2], strides=[2, 2]),
                    helper.make_node("MaxUnpool", ["p", "i", "s"], ["v"], kernel_shape=[2, 2], strides=[2, 2])],
                   [vi("p", TensorProto.FLOAT, ["N", 2, 2, 3]), vi("i", TensorProto.INT64, ["N", 2, 2, 3]),
                    vi("s", TensorProto.INT64, [4])], ["u", "v"])
    g, ins, outs = from_onnx(unpool)
    sess = ism.Session(g)
    ref = ort.InferenceSession(unpool.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 3):
        x = rng.permutation(n * 48).reshape(n, 2, 4, 6).astype(np.float32)  # distinct: one max per window
        p, i = ort.InferenceSession(pool.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        s = np.array([n, 2, 5, 7], np.int64)
        want = ref.run(["u"], {"p": p, "i": i, "s": s})[0]
        got = sess.run(outs, {ins["p"]: p, ins["i"]: i, ins["s"]: s})
        np.testing.assert_array_equal(got[0], want)
        np.testing.assert_array_equal(got[0], np.where(x == np.repeat(np.repeat(p, 2, 2), 2, 3), x, 0))
        assert got[1].shape == (n, 2, 5, 7)
        np.testing.assert_array_equal(got[1][:, :, :4, :6], want)  # the spec's reference: zeros after
        assert not got[1][:, :, 4:].any() and not got[1][:, :, :, 6:].any()


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_writes_each_batch_row_at_its_index(mode):
    vi = helper.make_tensor_value_info
    node = helper.make_node("TensorScatter", ["past", "upd", "w"], ["out"], mode=mode, axis=2)
    ins = [vi("past", TensorProto.FLOAT, ["N", 2, 6, 3]), vi("upd", TensorProto.FLOAT, ["N", 2, "S", 3]),
           vi("w", TensorProto.INT64, ["N"])]
    for n, s in ((1, 1), (3, 2)):
        past = rng.standard_normal((n, 2, 6, 3)).astype(np.float32)
        upd = rng.standard_normal((n, 2, s, 3)).astype(np.float32)
        w = rng.integers(0, 6 if mode == "circular" else 6 - s + 1, n)
        (got,) = _run([node], ins, [vi("out", TensorProto.FLOAT, None)], {"past": past, "upd": upd, "w": w}, 24)
        want = past.copy()
        for b in range(n):
            for t in range(s):
                want[b, :, (w[b] + t) % 6] = upd[b, :, t]
        np.testing.assert_array_equal(got, want)


def test_domain_ops_are_chosen_by_their_domains_version_and_adam_corrects_bias_from_step_one():
    """ai.onnx.preview.training.Adam is found under its own domain's opset (the model imports no default
    domain); at T = 0 the rate is R, after that R sqrt(1 - beta^T) / (1 - alpha^T) (numpy written out).
    An op of a domain with no handler, or at a domain version before the handler's, is refused by name."""
    vi = helper.make_tensor_value_info
    node = helper.make_node("Adam", ["R", "T", "X", "G", "V", "H"], ["X2", "V2", "H2"], domain="ai.onnx.preview.training",
                            alpha=0.9, beta=0.99, epsilon=1e-6, norm_coefficient=0.01)
    ins = [vi("R", TensorProto.FLOAT, []), vi("T", TensorProto.INT64, [])] + \
        [vi(k, TensorProto.FLOAT, ["N"]) for k in "XGVH"]
    outs = [vi(k, TensorProto.FLOAT, None) for k in ("X2", "V2", "H2")]
    m = helper.make_model(helper.make_graph([node], "m", ins, outs),
                          opset_imports=[helper.make_opsetid("ai.onnx.preview.training", 1)])
    g, gi, go = from_onnx(m)
    sess = ism.Session(g)
    x, gr, v, h = (rng.standard_normal(5).astype(np.float32) for _ in range(4))
    h = np.abs(h)
    for t in (0, 3):
        got = sess.run(go, {gi["R"]: np.float32(0.1), gi["T"]: np.int64(t), gi["X"]: x, gi["G"]: gr, gi["V"]: v, gi["H"]: h})
        g2 = 0.01 * x + gr
        v2, h2 = 0.9 * v + 0.1 * g2, 0.99 * h + 0.01 * g2 * g2
        rate = 0.1 * np.sqrt(1 - 0.99 ** t) / (1 - 0.9 ** t) if t else 0.1
        np.testing.assert_allclose(got[0], x - rate * v2 / (np.sqrt(h2) + 1e-6), rtol=1e-5)
        np.testing.assert_allclose(got[1], v2, rtol=1e-6)
        np.testing.assert_allclose(got[2], h2, rtol=1e-6)
    m.opset_import[0].version = 0
    with pytest.raises(OnnxImportError, match=r"ai\.onnx\.preview\.training\.Adam x1"):
        from_onnx(m)
    node.domain = "com.example"
    m2 = helper.make_model(helper.make_graph([node], "m", ins, outs), opset_imports=[helper.make_opsetid("com.example", 1)])
    with pytest.raises(OnnxImportError, match=r"com\.example\.Adam x1"):
        from_onnx(m2)


@pytest.mark.parametrize("attrs", [dict(kernel_shape=[2, 2], strides=[2, 2]),
                                   dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], dilations=[1, 2]),
                                   dict(kernel_shape=[2, 3], strides=[1, 2], storage_order=1)])
def test_max_pool_indices_match_onnxruntime_at_unknown_batch(attrs):
    """MaxPool's second output (argmax positions over the whole input) and its values, vs onnxruntime."""
    import onnxruntime as ort
    vi = helper.make_tensor_value_info
    m = helper.make_model(helper.make_graph([helper.make_node("MaxPool", ["x"], ["p", "i"], **attrs)], "m",
                                            [vi("x", TensorProto.FLOAT, ["N", 2, 5, 7])],
                                            [vi("p", TensorProto.FLOAT, None), vi("i", TensorProto.INT64, None)]),
                          opset_imports=[helper.make_opsetid("", 12)])
    m.ir_version = 8
    g, ins, outs = from_onnx(m)
    sess = ism.Session(g)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 3):
        x = rng.permutation(n * 70).reshape(n, 2, 5, 7).astype(np.float32) - 30  # distinct: one argmax
        want = ref.run(None, {"x": x})
        got = sess.run(outs, {ins["x"]: x})
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
