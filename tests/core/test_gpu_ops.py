"""Ops on a GPU device against the CPU path: forward and gradients of the kernels that have GPU
twins (convolutions of every geometry, depthwise, pooling, batch norm, the fused ops), on the
stand-in GPU in CI and on a real GPU under `pytest -m gpu`."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core import gpu

BACKENDS = [pytest.param("simulated", id="sim"),
            pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
                not gpu.gpu_available(), reason=f"no GPU: {gpu.unavailable_reason()}")])]

# (x shape, w shape, strides, padding, dilations, groups)
CONVS = [((2, 3, 9, 8), (4, 3, 3, 3), 1, "SAME", 1, 1),
         ((2, 3, 9, 8), (4, 3, 5, 5), 2, "SAME", 1, 1),
         ((1, 4, 10, 10), (6, 4, 3, 3), 1, "VALID", 2, 1),
         ((2, 6, 7, 7), (6, 1, 3, 3), 1, "SAME", 1, 6),    # depthwise
         ((2, 6, 8, 8), (6, 1, 3, 3), 2, "SAME", 1, 6),    # depthwise, stride 2
         ((2, 4, 6, 6), (8, 2, 3, 3), 1, "SAME", 1, 2),    # grouped
         ((3, 5, 4, 4), (7, 5, 1, 1), 1, "VALID", 1, 1)]   # pointwise


def _run_both(build, feeds, backend):
    """Build the graph twice; run on the CPU and on the GPU device; return both results."""
    out = []
    for dev in ("cpu", "gpu"):
        g = ism.Graph(seed=0)
        with g.as_default():
            phs, fetches = build()
        s = ism.Session(g, device=dev, gpu=backend)
        out.append(s.run(fetches, dict(zip(phs, feeds))))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CONVS, ids=lambda c: f"x{c[0]}w{c[1]}s{c[2]}{c[3]}d{c[4]}g{c[5]}")
def test_conv_forward_and_gradients(backend, case):
    xs, ws, st, pad, dil, groups = case
    rng = np.random.default_rng(0)
    xv = rng.standard_normal(xs).astype(np.float32)
    wv = rng.standard_normal(ws).astype(np.float32)
    bv = rng.standard_normal(ws[0]).astype(np.float32)

    def build():
        x = ism.placeholder("float32", xs)
        w = ism.placeholder("float32", ws)
        b = ism.placeholder("float32", (ws[0],))
        y = ism.relu(ism.bias_add(ism.conv2d(x, w, st, pad, dil, groups), b, axis=1))  # fused by the passes
        loss = ism.reduce_sum(y * y)
        return [x, w, b], [y] + ism.gradients(loss, [x, w, b])
    cpu, dev = _run_both(build, [xv, wv, bv], backend)
    for a, b_ in zip(dev, cpu):
        np.testing.assert_allclose(a, b_, rtol=2e-4, atol=2e-4 * max(1.0, float(np.abs(b_).max())))


@pytest.mark.parametrize("backend", BACKENDS)
def test_pool_batchnorm_and_softmax_gradients(backend):
    rng = np.random.default_rng(1)
    xv = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)

    def build():
        x = ism.placeholder("float32", (4, 3, 8, 8))
        sc = ism.constant(np.array([1.0, 0.5, 2.0], np.float32))
        of = ism.constant(np.array([0.1, 0.0, -0.1], np.float32))
        mean = ism.constant(np.zeros(3, np.float32))
        var = ism.constant(np.ones(3, np.float32))
        h = ism.batch_norm(x, sc, of, mean, var, training=True, axis=1)[0]
        h = ism.relu6(h)
        h = ism.max_pool(h, 2, 2, "VALID")
        h = ism.avg_pool(h, 2, 2, "VALID")
        h = ism.global_avg_pool(h)
        loss = ism.reduce_sum(ism.softmax(h) * ism.constant(np.arange(3, dtype=np.float32)))
        return [x], [h, loss] + ism.gradients(loss, [x])
    cpu, dev = _run_both(build, [xv], backend)
    for a, b in zip(dev, cpu):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ksize,stride,padding", [(3, 2, "SAME"), (2, 2, "VALID"), (3, 1, "VALID")])
def test_max_pool_overlapping_windows_and_relu(backend, ksize, stride, padding):
    rng = np.random.default_rng(2)
    xv = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)

    def build():
        x = ism.placeholder("float32", (2, 3, 9, 9))
        h = ism.max_pool(ism.relu(x), ksize, stride, padding)  # relu: ties at zero, and the through-relu rule
        loss = ism.reduce_sum(h * h * 0.5 + h)
        return [x], [h] + ism.gradients(loss, [x])
    cpu, dev = _run_both(build, [xv], backend)
    for a, b in zip(dev, cpu):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_optimizer_steps_match_cpu(backend, opt):
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((6, 4)).astype(np.float32)
    xv = rng.standard_normal((8, 6)).astype(np.float32)
    yv = rng.integers(0, 4, 8).astype(np.int64)
    out = []
    for dev in ("cpu", "gpu"):
        g = ism.Graph(seed=0)
        with g.as_default():
            x = ism.placeholder("float32", (8, 6))
            y = ism.placeholder("int64", (8,))
            w = ism.Variable(w0, name="w")
            loss = ism.reduce_mean(ism.sparse_softmax_cross_entropy(y, ism.relu6(x @ w) - 1.0))
            o = ism.optimizers.SGD(0.3) if opt == "sgd" else ism.optimizers.Adam(0.05)
            train = o.minimize(loss)
            init = ism.global_variables_initializer()
        s = ism.Session(g, device=dev, gpu=backend)
        s.run(init)
        losses = [float(s.run([loss, train], {x: xv, y: yv})[0]) for _ in range(3)]
        out.append((losses, s.variable_value(w)))
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-5)
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-5, atol=1e-6)


CUDA = pytest.mark.skipif(not gpu.gpu_available(), reason=f"no GPU: {gpu.unavailable_reason()}")


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("case", [CONVS[1], CONVS[2], CONVS[3]], ids=["s2", "dil2", "depthwise"])
def test_conv_kernels_with_64_bit_indices_match_32(monkeypatch, case):
    """The RawKernels compile twice (32-bit flat indices below 2^30 elements, else 64-bit): force
    the 64-bit module on small shapes and compare with the CPU path, as the 32-bit run does."""
    from isthmus.core.gpu_kernels import raw
    monkeypatch.setattr(raw, "NARROW_LIMIT", 0)
    test_conv_forward_and_gradients("cuda", case)


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("shape", [(37, 5, 3, 7), (3, 600, 2, 2), (64, 32, 28, 28), (5, 4, 1)])
def test_bias_grad_by_channel_against_float64(shape):
    from isthmus.core.gpu_kernels import raw
    cp = gpu.array_module("GPU")
    dy = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    got = raw.bias_grad_nchw(cp, cp.asarray(dy)).get()
    want = dy.astype(np.float64).sum(axis=tuple(i for i in range(dy.ndim) if i != 1))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_gradient_reuses_the_forward_columns(backend, monkeypatch):
    """A training step does im2col once per convolution: the weight gradient takes the columns
    the forward kernel left for it (core/gpu_kernels/conv.py _HANDOFF), and its result still
    equals the CPU's."""
    from isthmus.core.gpu_kernels import conv
    calls = []
    real = conv._cols
    monkeypatch.setattr(conv, "_cols", lambda xp, x, g: calls.append(x.shape) or real(xp, x, g))
    rng = np.random.default_rng(5)
    xv = rng.standard_normal((4, 2, 8, 8)).astype(np.float32)
    w1 = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    got = []
    for dev in ("cpu", "gpu"):
        g = ism.Graph(seed=0)
        with g.as_default():
            x = ism.placeholder("float32", xv.shape)
            a, b = ism.Variable(w1, name="a"), ism.Variable(w2, name="b")
            h = ism.max_pool(ism.relu(ism.conv2d(x, a, 1, "SAME")), 2, 2, "VALID")
            loss = ism.reduce_sum(ism.conv2d(h, b, 1, "SAME") ** 2)
            train = ism.optimizers.SGD(0.01).minimize(loss)
            init = ism.global_variables_initializer()
        s = ism.Session(g, device=dev, gpu=backend)
        s.run(init)
        for _ in range(2):
            del calls[:]
            s.run(train, {x: xv})
        if dev == "gpu":
            assert len(calls) == 2, calls  # one im2col per convolution, none again for the weight gradients
        got.append([s.variable_value(a), s.variable_value(b)])
    for d, c in zip(got[1], got[0]):
        np.testing.assert_allclose(d, c, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("act", ["none", "relu", "relu6", "tanh", "sigmoid"])
def test_nchw_bias_activation_kernel(act):
    from isthmus.core.gpu_kernels import raw
    from isthmus.core.gpu_kernels.elementwise import ACT_CODES
    cp = gpu.array_module("GPU")
    rng = np.random.default_rng(7)
    n, o, plane = 5, 3, 37
    y2 = (rng.standard_normal((o, n * plane)) * 4).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    got = raw.nchw_bias_act(cp, cp.asarray(y2), cp.asarray(b), n, o, plane, ACT_CODES[act]).get()
    v = y2.reshape(o, n, plane).transpose(1, 0, 2).astype(np.float64) + b.reshape(1, o, 1)
    want = {"none": v, "relu": np.maximum(v, 0), "relu6": np.clip(v, 0, 6), "tanh": np.tanh(v),
            "sigmoid": 1 / (1 + np.exp(-v))}[act]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
