"""Softmax and LayerNorm over the last axis: the compiled row loops (jit/rows.py, with fastexp's exp)
and the numpy passes, against float64 numpy, including masked (-inf) entries and NaN rows."""
import numpy as np
import pytest

import isthmus as ism
from isthmus import jit

pytestmark = pytest.mark.skipif(not jit.available(), reason="numba is not installed")


@pytest.fixture(params=["compiled", "numpy"])
def path(request, monkeypatch):
    monkeypatch.setenv("ISTHMUS_JIT", "1" if request.param == "compiled" else "0")
    return request.param


def _run(build, x):
    g = ism.Graph()
    with g.as_default():
        p = ism.placeholder("float32", x.shape)
        return ism.Session(g).run(build(p), {p: x})


@pytest.mark.parametrize("shape,axis", [((2, 4, 7, 33), -1), ((5,), 0), ((3, 6, 4), 1), ((4, 1000), 1)])
def test_softmax_against_float64(path, shape, axis):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 30).astype(np.float32)  # exp's clamp and underflow are reached
    if len(shape) > 1:
        x.reshape(-1, shape[-1])[0, :3] = -np.inf  # a masked row: exactly zero there
    got = _run(lambda p: ism.softmax(p, axis=axis), x)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
    want = e / e.sum(axis=axis, keepdims=True)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    if len(shape) > 1 and axis in (-1, len(shape) - 1):
        assert np.all(got.reshape(-1, shape[-1])[0, :3] == 0)


def test_softmax_nan_and_all_masked_rows_as_numpy(path):
    x = np.zeros((3, 8), np.float32)
    x[0, 2] = np.nan
    x[1, :] = -np.inf
    with np.errstate(invalid="ignore"):  # the numpy path warns as numpy does
        got = _run(lambda p: ism.softmax(p), x)
    assert np.isnan(got[0]).all() and np.isnan(got[1]).all()  # numpy: NaN - NaN, -inf - -inf
    np.testing.assert_allclose(got[2], np.full(8, 1 / 8), rtol=1e-6)


@pytest.mark.parametrize("shape", [(2, 9, 64), (1, 3), (7, 1000)])
def test_layer_norm_against_float64(path, shape):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 3 + 20).astype(np.float32)
    gamma, beta = rng.standard_normal(shape[-1]).astype(np.float32), rng.standard_normal(shape[-1]).astype(np.float32)
    got = _run(lambda p: ism.layer_norm(p, gamma, beta, epsilon=1e-3), x)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-3) * gamma + beta
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5)
