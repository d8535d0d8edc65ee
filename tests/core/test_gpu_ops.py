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
