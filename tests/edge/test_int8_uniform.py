"""Power-of-two channel scales and short activation scales end to end: quantize_to_edge writes them,
the int8 convolutions take the one-multiplier path (quant.UniformRequantizer, float32 where the
multiplier is short), and a whole MobileNet-style model gives, bit for bit, what the per-channel
Requantizer path gives on the same file."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.converters.quantize import _pow2_scales, quantize_to_edge
from isthmus.edge import Interpreter
from isthmus.edge.loader import loads
from isthmus.edge.quant import quantize_multiplier, shared_mantissa

rng = np.random.default_rng(5)


def _mobilenet_like():
    """expand 1x1 relu6 -> depthwise 3x3 relu6 (stride 1, then 2) -> project 1x1 -> residual add,
    global pool and a dense layer: every conv shape the uniform path has."""
    g = ism.Graph(seed=3)
    with g.as_default():
        x = ism.placeholder("float32", (None, 3, 20, 20), name="x")
        h = ism.nn.Conv2D(16, 3, strides=2, activation="relu6")(x)
        for stride in (1, 1, 2):
            skip = h
            e = ism.nn.Conv2D(48, 1, activation="relu6")(h)
            d = ism.nn.DepthwiseConv2D(3, strides=stride, activation="relu6")(e)
            h = ism.nn.BatchNorm()(ism.nn.Conv2D(16, 1)(d))
            if stride == 1:
                h = h + skip
        logits = ism.nn.Dense(5)(ism.global_avg_pool(h))
        sess = ism.Session(g)
        sess.run(ism.global_variables_initializer())
    return sess, x, logits


@pytest.fixture(scope="module")
def quantized():
    sess, x, logits = _mobilenet_like()
    calib = [{x: rng.standard_normal((1, 3, 20, 20)).astype(np.float32)} for _ in range(3)]
    return sess, x, logits, calib, quantize_to_edge(sess, [logits], calib)[0]


def test_the_uniform_path_matches_the_per_channel_path_bit_for_bit(quantized, monkeypatch):
    import isthmus.edge.int8_gemm as ig
    import isthmus.edge.int8_kernels as k8
    *_, data = quantized
    gemm = Interpreter(data) if ig.ready() else None  # the integer GEMM where the host has it (int8_gemm.py)
    monkeypatch.setattr(ig, "ready", lambda: False)  # the float-GEMM kernels from here on
    used = []
    real = k8._uniform
    monkeypatch.setattr(k8, "_uniform", lambda *a: used.append(real(*a)) or used[-1])
    fast = Interpreter(data)
    assert len(used) == 10 and all(u is not None for u in used)  # every conv: stem, 3 x (expand, dw, project)
    assert sum(u[0].short for u in used) >= 8  # short activation scales: float32 requantization nearly everywhere
    monkeypatch.setattr(k8, "_uniform", lambda *a: None)  # the per-channel Requantizer (or folded GEMM) path
    slow = Interpreter(data)
    for seed in range(4):
        xv = np.random.default_rng(seed).standard_normal((1, 3, 20, 20)).astype(np.float32) * (1 + seed)
        a, b = fast.invoke(xv)[0], slow.invoke(xv)[0]
        np.testing.assert_array_equal(a, b)
        if gemm is not None:
            np.testing.assert_array_equal(gemm.invoke(xv)[0], a)
        assert np.ptp(a) > 0


def test_conv_weight_scales_are_powers_of_two_apart(quantized):
    sess, x, logits, calib, data = quantized
    m = loads(data)
    convs = [op for op in m.operators if op.op in ("Conv2D", "FusedConv2D")]
    free = loads(quantize_to_edge(sess, [logits], calib, pow2_scales=False)[0])
    free_convs = [op for op in free.operators if op.op in ("Conv2D", "FusedConv2D")]
    for op, fop in zip(convs, free_convs):
        w, fw = m.tensors[op.inputs[1]], free.tensors[fop.inputs[1]]
        s, fs = w.scale.astype(np.float64), fw.scale.astype(np.float64)
        e = np.log2(s.max() / s)
        assert np.array_equal(e, np.round(e))  # S * 2^-e_c
        assert np.all(s >= fs * (1 - 1e-6)) and np.all(s < 2 * fs)  # never finer, at most 2x coarser
        sx, sy = m.tensors[op.inputs[0]].scale[0], m.tensors[op.outputs[0]].scale[0]
        assert shared_mantissa(float(sx) * s / float(sy)) is not None
        assert not np.array_equal(s, fs) or len(set(fs.tolist())) == 1


def test_pow2_scales_stop_where_the_shift_would_pass_44():
    s_w = np.array([1e-2, 1e-3, 1e-5, 1e-7])
    out = _pow2_scales(s_w, 0.02, 0.5)
    _, shift = quantize_multiplier(float(np.float32(0.02)) * float(np.float32(out.max())) / float(np.float32(0.5)))
    e = np.round(np.log2(out.max() / out)).astype(int)
    assert np.all(out >= s_w * (1 - 1e-6)) and shift + e.max() <= 44
    assert out[3] > 2 * s_w[3]  # the tiny channel keeps a coarser scale than its own


def test_batch_of_two_takes_the_same_paths_bit_for_bit(quantized, monkeypatch):
    import isthmus.edge.int8_kernels as k8
    sess, x, logits, calib, _ = quantized
    data = quantize_to_edge(sess, [logits], calib, batch=2)[0]
    fast = Interpreter(data)
    monkeypatch.setattr(k8, "_uniform", lambda *a: None)
    slow = Interpreter(data)
    xv = np.random.default_rng(9).standard_normal((2, 3, 20, 20)).astype(np.float32)
    np.testing.assert_array_equal(fast.invoke(xv)[0], slow.invoke(xv)[0])
