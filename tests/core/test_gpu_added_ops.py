"""The ops added for issue 20 on a GPU device against the CPU path, forward and gradients: every row of
their op tables, on the stand-in GPU in CI and on a real GPU under `pytest -m gpu` (kernels over ctx.xp)."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core import gpu

from . import (test_activation_ops, test_conv_transpose_quant_ops, test_einsum_ops, test_indexing_ops,
               test_normalization_ops)

BACKENDS = [pytest.param("simulated", id="sim"),
            pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
                not gpu.gpu_available(), reason=f"no GPU: {gpu.unavailable_reason()}")])]
ROWS = [(fam.__name__.split(".")[-1] + ":" + c[0], c[1], c[2], len(c) < 5 or c[4])
        for fam in (test_activation_ops, test_indexing_ops, test_conv_transpose_quant_ops, test_einsum_ops,
                    test_normalization_ops) for c in fam.CASES]


def _f32(a):
    a = np.asarray(a)
    return a.astype(np.float32) if a.dtype == np.float64 else a


def _run(build, feeds, differentiable, device, backend):
    g = ism.Graph(seed=0)
    with g.as_default():
        phs = [ism.placeholder(v.dtype, v.shape) for v in feeds]
        y = build(*phs)
        fetches = [y]
        floats = [p for p in phs if p.dtype.kind == "f"]
        if differentiable and floats:
            fetches += ism.gradients(ism.reduce_sum(ism.square(y)), floats)
        s = ism.Session(g, device=device, gpu=backend) if device == "gpu" else ism.Session(g)
        return [np.asarray(v) for v in s.run(fetches, dict(zip(phs, feeds)))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,build,inputs,diff", ROWS, ids=[r[0] for r in ROWS])
def test_added_op_on_gpu_matches_cpu(backend, name, build, inputs, diff):
    feeds = [_f32(a) for a in inputs]
    cpu = _run(build, feeds, diff, "cpu", backend)
    dev = _run(build, feeds, diff, "gpu", backend)
    for a, b in zip(dev, cpu):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4 * max(1.0, float(np.abs(b).max(initial=0))))


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_and_rotary_on_gpu_match_cpu(backend):
    t = test_conv_transpose_quant_ops  # noqa: F841  (tables above; attention has its own inputs)
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 6)))
    mask = np.tril(np.ones((3, 5), bool), 1)

    def build(q_, k_, v_):
        y = ism.attention(q_, k_, v_, mask=mask, is_causal=True, softcap=2.0)[0]
        cos = np.cos(np.arange(16, dtype=np.float32)).reshape(4, 4)
        return ism.rotary_embedding(ism.concat([y, y[..., :2]], -1), cos, cos * 0.5,
                                    ism.constant(np.array([[0, 1, 2, 3]] * 2)[:, :3]), True)
    cpu = _run(build, [q, k, v], True, "cpu", backend)
    dev = _run(build, [q, k, v], True, "gpu", backend)
    for a, b in zip(dev, cpu):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-4)
