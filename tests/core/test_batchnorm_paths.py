"""BatchNorm and BatchNormGrad on both kernel paths, compiled (isthmus.jit.batchnorm) and numpy
(ISTHMUS_JIT=0), against float64 references written out here: forward outputs and statistics,
and dx, dscale, doffset (dmean, dvariance in inference mode), for NCHW and [N, C] inputs."""
import numpy as np
import pytest

import isthmus as ism
from isthmus.core.ops import depthwise

from .test_conv_forward import kernel_path  # noqa: F401  (the fixture: both kernel paths)

EPS = 1e-3


def ref(x, dy, scale, offset, mean, var, axis, training):
    """float64 forward and backward of y = (x - m) / sqrt(v + eps) * scale + offset."""
    x, dy = x.astype(np.float64), dy.astype(np.float64)
    axes = tuple(i for i in range(x.ndim) if i != axis)
    shape = tuple(-1 if i == axis else 1 for i in range(x.ndim))
    if training:
        mean, var = x.mean(axes), x.var(axes)
    inv = 1 / np.sqrt(var + EPS)
    xhat = (x - mean.reshape(shape)) * inv.reshape(shape)
    y = xhat * scale.reshape(shape) + offset.reshape(shape)
    dbeta, dgamma = dy.sum(axes), (dy * xhat).sum(axes)
    n = x.size // x.shape[axis]
    if training:
        dx = (dy - (dbeta / n).reshape(shape) - xhat * (dgamma / n).reshape(shape)) * (scale * inv).reshape(shape)
        return y, mean, var, dx, dgamma, dbeta, None, None
    dx = dy * (scale * inv).reshape(shape)
    return y, mean, var, dx, dgamma, dbeta, -(dbeta * scale * inv), -0.5 * dgamma * scale * inv * inv


def run(x, dy, scale, offset, mean, var, axis, training, dtype):
    g = ism.Graph(seed=0)
    with g.as_default():
        xt = ism.placeholder(dtype, x.shape, name="x")
        sv, ov, mv, vv = (ism.placeholder(dtype, a.shape) for a in (scale, offset, mean, var))
        out = ism.batch_norm(xt, sv, ov, mv, vv, EPS, training, axis)
        y = out[0] if training else out
        dyt = ism.placeholder(dtype, x.shape, name="dy")
        wrt = [xt, sv, ov] if training else [xt, sv, ov, mv, vv]
        grads = ism.gradients(y, wrt, grad_ys=[dyt])
        fetch = ([y, out[1], out[2]] if training else [y]) + list(grads)
        feed = {xt: x.astype(dtype), dyt: dy.astype(dtype), sv: scale.astype(dtype), ov: offset.astype(dtype),
                mv: mean.astype(dtype), vv: var.astype(dtype)}
        return ism.Session(g).run(fetch, feed)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape,axis", [((4, 6, 7, 5), 1), ((9, 5), 1), ((3, 4, 10), -1)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_forward_and_gradients(kernel_path, dtype, shape, axis, training):  # noqa: F811
    rng = np.random.default_rng(len(shape) * 10 + int(training))
    x = (rng.standard_normal(shape) * 3 + 1.5).astype(dtype)
    dy = rng.standard_normal(shape).astype(dtype)
    c = shape[axis]
    scale, offset, mean = rng.standard_normal(c), rng.standard_normal(c), rng.standard_normal(c)
    var = rng.uniform(0.5, 2, c)
    got = run(x, dy, scale, offset, mean, var, axis % len(shape), training, dtype)
    want = ref(x, dy, scale, offset, mean, var, axis % len(shape), training)
    tol = 2e-5 if dtype == "float32" else 1e-10
    if training:
        names = ["y", "mean", "var", "dx", "dscale", "doffset"]
        pairs = zip(names, got, [want[0], want[1], want[2], want[3], want[4], want[5]])
    else:
        names = ["y", "dx", "dscale", "doffset", "dmean", "dvar"]
        pairs = zip(names, got, [want[0], want[3], want[4], want[5], want[6], want[7]])
    for name, g, w in pairs:
        assert g.dtype == np.dtype(dtype), name
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * max(1.0, float(np.abs(w).max())), err_msg=name)


def test_compiled_batch_norm_channels_on_threads(monkeypatch):
    """Channel ranges on threads give the one-thread result exactly (channels are independent)."""
    monkeypatch.setenv("ISTHMUS_JIT", "1")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 7, 6, 6)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    args = (x, dy, rng.standard_normal(7), rng.standard_normal(7), np.zeros(7), np.ones(7), 1, True, "float32")
    monkeypatch.setattr(depthwise, "THREAD_MIN_MACS", 0)
    monkeypatch.setattr(depthwise, "_MAX_THREADS", 3)
    outs = {}
    for t in (1, 3):
        monkeypatch.setattr(depthwise, "intra_threads", lambda t=t: t)
        outs[t] = run(*args)
    for a, b in zip(outs[1], outs[3]):
        np.testing.assert_array_equal(a, b)
